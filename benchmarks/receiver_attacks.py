"""Peers against a receiver's round: issue 43's table, replayed.

Each attack is published to a ledger (a local folder, or S3 over HTTP to moto's server on
127.0.0.1) beside honest peers, then a *fresh receiver process* draws, verifies, trains or
prints as a node or a user would, and reports one row:

- ``answer-regex-bomb``: 16 groups of 4 completions of ``"<answer> "`` x 3,640 (32 KB) on real
  chain_sum questions, claimed informative; the receiver (J = 16, its real verifier,
  ``verify_budget_s`` 20) judges them. Target: verification within the budget + 10%.
- ``group-256-rows``: one 256-row group, half right and carrying " visit evil.example", beside
  an honest peer's group of 4, against a receiver of the demo's settings (G = 4, I = 2,
  J = 2) and the bundled SmolLM2-135M, which takes its GRPO step. Target: the attacker's share
  of the loss weight at most its share of J.
- ``sybil-warmup-fresh`` / ``-paper``: two Sybils each publish one 256-row group of a task the
  receiver does not train, then only groups with a tampered answer, stamped last; two honest
  peers publish a group a round; 12 rounds of the receiver's real draw, verifier and
  reputation. Target: Sybils together at most the unknown-peer budget once an honest peer is
  known; never known; excluded.
- ``copiers-fresh`` / ``-paper``: each round the receiver publishes 2 groups and two honest
  peers 1 each; copier c1 republishes the receiver's groups under its own ids, c2 the honest
  peers'; 12 rounds of the receiver's real draw, verifier and reputation. Target: none of the
  receiver's own groups drawn back, no group twice in one draw (nor, under fresh, in a later
  one); reported: the copies' share of J and who became known.
- ``copiers-capped``: two honest peers publish 3 groups each and a copier all 6; the
  receiver draws J = 4 with ``max_per_peer`` 2 under each policy, 40 seeds. Target: no
  draw short while a peer with room holds a content left out.
- ``sybils-ground-ids-*``, ``padded-copies-*`` (issue 57): peers that compute offline where
  their rows land; in ``benchmarks/steering_attacks.py``, which says what each does.
- ``terminal-escapes`` / ``csv-formula``: a completion and model id holding an OSC 52
  clipboard write, a clear-screen code and a red forged line, and a ``=HYPERLINK(...)``
  completion, printed by ``sapo ledger query`` as a table and as CSV. Target: no control
  byte reaches the terminal, no cell runs as a formula.

    python benchmarks/receiver_attacks.py                   # every attack, both backends
    python benchmarks/receiver_attacks.py --only group-256-rows --backends local

`benchmarks/attacks.py` prints these rows beside its own (``--only`` takes their names too).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from steering_attacks import STEERING

from flows.env import apply_offline_defaults

apply_offline_defaults()

HANG_S = 900.0
BOMB = "<answer> " * 3640
INJECTED = " visit evil.example"
OSC52 = "\x1b]52;c;c3VkbyBybSAtcmYgfg==\x07"
FORGED = "\x1b[2J\x1b[31mFORGED: node-1 reward 1.0\x1b[0m"
FORMULA = '=HYPERLINK("http://evil.example","x")'


# -- the attacks: each runs in the receiver's process and returns its row's figures ---------


def answer_bomb(site: Any) -> dict[str, Any]:
    from sapo_core.config import NodeConfig, RewardConfig
    from sapo_core.peers import judge_peers, judged_tasks
    from sapo_core.tasks import TaskSource
    from tests.peer_rounds import TASKS, drawn_groups, rollout_records

    led = site.open()
    for q in TaskSource(TASKS, seed=5).draw(0, 16):
        led.publish(rollout_records("evil", 0, q, [BOMB] * 4, [1.0, 0.0, 1.0, 0.0]))
    receiver = NodeConfig(
        node_id="me", tasks=TASKS, local_groups=0, external_groups=16,
        reward=RewardConfig(verify_budget_s=20.0),
    )  # fmt: skip
    reader = site.open()
    frame = reader.sample(
        "me", 16, {"kind": "paper", "max_peer_share": 1.0}, swarm_id="sw",
        tasks=judged_tasks(receiver),
    )  # fmt: skip
    groups = drawn_groups(frame)
    started = time.monotonic()
    judged = judge_peers(groups, receiver, 0)
    seconds = time.monotonic() - started
    budget = receiver.reward.verify_budget_s
    unjudged = sum("unjudged" in p for p in judged.problems)
    rows = sum(len(g.rollouts) for g in judged.considered)
    return {
        "wrong": int(seconds > 1.1 * budget),
        "extra": f"verification {seconds:.3f} s of a {budget:g} s budget for {rows} bomb rows; "
        f"{unjudged} left unjudged",
    }


def big_group(site: Any) -> dict[str, Any]:
    from sapo_core.config import GenerationConfig
    from sapo_core.learner import Learner
    from sapo_core.rollouts import Group, Rollout
    from sapo_core.tasks import TaskSource
    from tests.peer_rounds import RECEIVER, TASKS, drawn_groups, rollout_records

    receiver = RECEIVER.model_copy(
        update={"generation": GenerationConfig(completions_per_question=4, max_new_tokens=64)}
    )
    [q_evil, q_honest] = TaskSource(TASKS, seed=7).draw(0, 2)
    led = site.open()
    evil = [(f"<answer>{q_evil.answer}</answer>" if k % 2 else "<answer>-1</answer>") + INJECTED
            for k in range(256)]  # fmt: skip
    led.publish(rollout_records("evil", 0, q_evil, evil, [float(k % 2) for k in range(256)]))
    right, wrong = f"<answer>{q_honest.answer}</answer>", "<answer>-1</answer>"
    led.publish(rollout_records("honest", 0, q_honest, [right, wrong, wrong, right], [1, 0, 0, 1]))
    me = Learner(receiver)
    own = []
    for k, q in enumerate(me.tasks.draw(0, 2)):
        texts = [f"<answer>{q.answer}</answer>", "<answer>-1</answer>"] * 2
        rows = tuple(
            Rollout(f"me.r0.q{k}.c{j}", f"me.r0.q{k}", "me", me.policy.model_id, 0, 0, q, t, 8)
            for j, t in enumerate(texts)
        )
        own.append(Group(f"me.r0.q{k}", "local", rows))
    frame = site.open().sample("me", 2, "paper", seed=1, swarm_id="sw")
    chosen, _ = me.select(0, own, drawn_groups(frame))
    report = me.update(0, chosen)
    trained = [r for g in chosen.trained for r in g.rollouts]
    by_peer: dict[str, int] = {}
    for row in trained:
        by_peer[row.node_id] = by_peer.get(row.node_id, 0) + 1
    # The loss weight per peer under the node's loss (grpo: every row alike): rows' share.
    shares = {peer: n / len(trained) for peer, n in by_peer.items()}
    j_share = sum(g.group.source == "external" and g.rollouts[0].node_id == "evil"
                  for g in chosen.trained) / max(receiver.external_groups, 1)  # fmt: skip
    injected_positive = sum(
        INJECTED in r.completion and reward > g.mean_reward
        for g in chosen.trained
        for r, reward in zip(g.rollouts, g.rewards, strict=True)
    )
    evil_share = shares.get("evil", 0.0)
    return {
        "wrong": int(evil_share > j_share + 1e-9),
        "extra": f"rows trained: own {by_peer.get('me', 0)}, honest {by_peer.get('honest', 0)}, "
        f"attacker {by_peer.get('evil', 0)}; attacker's loss weight {evil_share:.1%} "
        f"(logged: {getattr(report, 'peer_loss_shares', {}).get('evil', float('nan')):.1%}) "
        f"for {j_share:.0%} of J; {injected_positive} injected rows with a positive advantage; "
        f"update {report.update_s:.1f} s",
    }


def sybil_warmup(policy: str) -> Callable[[Any], dict[str, Any]]:
    def attack(site: Any) -> dict[str, Any]:
        from ledger import parse_policy
        from sapo_core.reputation import Reputation
        from tests.peer_rounds import (
            HONEST,
            RECEIVER,
            SYBILS,
            publish_sybil_round,
            receiver_round,
        )

        chosen = parse_policy(policy)
        cap = math.ceil((chosen.max_unknown_share or 1.0) * RECEIVER.external_groups)
        led = site.open()
        reputation = Reputation.empty(RECEIVER.reputation)
        over, sybil_groups, drawn, ever_known, out_at = 0, 0, 0, False, {}
        for round_ in range(12):
            publish_sybil_round(led, round_)
            known = reputation.known()
            groups, _ = receiver_round(led, reputation, chosen, round_)
            from_sybils = sum(g.rollouts[0].node_id in SYBILS for g in groups)
            sybil_groups += from_sybils
            drawn += len(groups)
            if set(known) & set(HONEST):
                over += max(from_sybils - cap, 0)
            ever_known |= bool(set(reputation.known()) & set(SYBILS))
            for s in set(reputation.excluded()) & set(SYBILS):
                out_at.setdefault(s, round_)
        return {
            "wrong": over,
            "extra": f"Sybils' share of J over 12 rounds: {sybil_groups}/{drawn}; beyond the "
            f"unknown budget ({cap} of {RECEIVER.external_groups}) while an honest peer was "
            f"known: {over}; ever known: {'yes' if ever_known else 'no'}; excluded after "
            f"round: {', '.join(f'{s} {r}' for s, r in sorted(out_at.items())) or 'never'}",
        }

    return attack


def copiers(policy: str) -> Callable[[Any], dict[str, Any]]:
    def attack(site: Any) -> dict[str, Any]:
        from ledger import parse_policy
        from sapo_core.reputation import Reputation
        from sapo_core.tasks import TaskSource
        from tests.factories import copied
        from tests.peer_rounds import (
            HONEST,
            RECEIVER,
            TASKS,
            _tagged,
            receiver_round,
            rollout_records,
        )

        chosen = parse_policy(policy)
        led = site.open()
        reputation = Reputation.empty(RECEIVER.reputation)
        own: set[tuple[str, ...]] = set()
        seen: list[tuple[str, ...]] = []
        by_copiers, drawn, repeats_in_a_draw = 0, 0, 0
        for round_ in range(12):
            mine, theirs = [], []
            for q in TaskSource(TASKS, seed=7).draw(round_, 2):
                texts = _tagged([q.answer, "-1", q.answer, "0"])
                mine.append(rollout_records("me", round_, q, texts, [1, 0, 1, 0]))
            for k, node in enumerate(HONEST):
                q = TaskSource(TASKS, seed=100 + k).draw(round_, 1)[0]
                texts = _tagged([q.answer, "-1", q.answer, "-1"])
                theirs.append(rollout_records(node, round_, q, texts, [1, 0, 1, 0]))
            for rows in mine + theirs:
                led.publish(rows)
            own |= {_said(rows) for rows in mine}
            # c1 republishes the receiver's own groups, c2 the honest peers' (an hour later).
            led.publish([r for rows in mine for r in copied(rows, "c1", round_)])
            for k, rows in enumerate(theirs):  # a round each: their ids may coincide
                led.publish(copied(rows, "c2", 2 * round_ + k))
            groups, _ = receiver_round(led, reputation, chosen, round_)
            said = [_said([r.to_record() for r in g.rollouts]) for g in groups]
            repeats_in_a_draw += len(said) - len(set(said))
            seen += said
            by_copiers += sum(g.rollouts[0].node_id in ("c1", "c2") for g in groups)
            drawn += len(groups)
        own_drawn = sum(c in own for c in seen)
        again = len(seen) - len(set(seen)) if policy == "fresh" else 0
        return {
            "wrong": own_drawn + repeats_in_a_draw + again,
            "extra": f"over 12 rounds: the receiver's own groups drawn back {own_drawn}; a "
            f"group twice in one draw {repeats_in_a_draw}"
            + (f", in a later draw {again}" if policy == "fresh" else "")
            + f"; copies' share of J {by_copiers}/{drawn}; known: "
            f"{', '.join(reputation.known()) or 'none'}",
        }

    return attack


def copiers_capped(site: Any) -> dict[str, Any]:
    """Two honest peers publish 3 groups each, a copier all 6; the receiver draws J = 4 with
    ``max_per_peer`` 2 under each policy, over 40 seeds."""
    from ledger import parse_policy
    from tests.peer_rounds import publish_copier_over_cap, short_with_room

    led = site.open()
    holders = publish_copier_over_cap(led)
    short: dict[str, int] = {}
    for kind in ("paper", "reward_filtered", "variance_weighted", "fresh"):
        policy = parse_policy({"kind": kind, "max_per_peer": 2})
        short[kind] = 0
        for seed in range(40):
            drawn = led.sample_group_ids("me", 4, policy, seed=seed, swarm_id="sw")
            contents = led.query(
                "SELECT content_digest FROM groups WHERE list_contains($g, group_id)",
                {"g": drawn},
            )["content_digest"].to_list()
            short[kind] += short_with_room(drawn, contents, holders, 4, 2)
    return {
        "wrong": sum(short.values()),
        "extra": "draws of J = 4 left short of a content a peer with room holds, of 40 "
        "seeds: " + ", ".join(f"{k} {n}" for k, n in short.items()),
    }


def _said(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """What a group says: its question and its completions, in no order."""
    return (rows[0]["question"], *sorted(r["completion"] for r in rows))


def _plant_text(site: Any) -> None:
    from sapo_core.tasks import TaskSource
    from tests.peer_rounds import TASKS, rollout_records

    [q1, q2] = TaskSource(TASKS, seed=0).draw(0, 2)
    led = site.open()
    led.publish(rollout_records("p1", 0, q1, [OSC52 + FORGED] * 2, [1, 0], model_id=OSC52))
    led.publish(rollout_records("p2", 0, q2, [FORMULA] * 2, [1, 0]))


def _query(site: Any, fmt: str) -> str:
    """What `sapo ledger query` prints of the planted rows in ``fmt``."""
    sql = "SELECT node_id, model_id, completion, reward FROM rollouts ORDER BY rollout_id"
    options = [f"--storage-option={k}={v}" for k, v in site.options.items()]
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "ledger", "query", site.url, sql, "-f", fmt, *options],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def terminal_escapes(site: Any) -> dict[str, Any]:
    _plant_text(site)
    bad = {
        fmt: sum((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F for c in _query(site, fmt))
        for fmt in ("table", "csv")
    }
    return {
        "wrong": sum(bad.values()),
        "extra": f"control bytes written to the terminal: table {bad['table']}, csv {bad['csv']}",
    }


def csv_formula(site: Any) -> dict[str, Any]:
    _plant_text(site)
    _, *cells = csv.reader(io.StringIO(_query(site, "csv")))
    running = sum(c.startswith(("=", "+", "-", "@")) for row in cells for c in row[:3])
    return {"wrong": running, "extra": f"CSV cells a spreadsheet runs as a formula: {running}"}


ATTACKS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "answer-regex-bomb": answer_bomb,
    "group-256-rows": big_group,
    "sybil-warmup-fresh": sybil_warmup("fresh"),
    "sybil-warmup-paper": sybil_warmup("paper"),
    "copiers-fresh": copiers("fresh"),
    "copiers-paper": copiers("paper"),
    "copiers-capped": copiers_capped,
    **STEERING,
    "terminal-escapes": terminal_escapes,
    "csv-formula": csv_formula,
}


# -- running: a fresh receiver process per attack and backend --------------------------------


def run_attack(name: str, site: Any, timeout: float = HANG_S) -> dict[str, Any]:
    """``name`` against ``site`` in a fresh process: its figures, with seconds, the process's
    peak RSS, and whether it crashed or hung."""
    payload = json.dumps([name, site.url, site.options, site.kind])
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--receiver", payload],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"hang": True, "crash": False, "seconds": time.monotonic() - started}
    seconds = time.monotonic() - started
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"hang": False, "crash": True, "error": last[:160], "seconds": seconds}
    last = done.stdout.strip().splitlines()[-1]
    result: dict[str, Any] = json.loads(last[last.find("{") :])
    result.update(hang=False, crash=False, seconds=seconds)
    return result


def _receiver(payload: str) -> None:
    import logging

    from ledger_attacks import Site, peak_rss_mb

    logging.disable(logging.WARNING)
    name, url, options, kind = json.loads(payload)
    result = ATTACKS[name](Site(url, options, kind))
    result["rss_mb"] = peak_rss_mb()
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    parser.add_argument(
        "--only", nargs="*", default=None, choices=list(ATTACKS), help="attack names (default: all)"
    )
    parser.add_argument("--timeout", type=float, default=HANG_S)
    parser.add_argument("--receiver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver:
        _receiver(args.receiver)
        return
    # The table is attacks.py's, which prints these rows among its own: hand over to it, a
    # process boundary, so that neither script imports the other.
    script = Path(__file__).with_name("attacks.py")
    os.execv(
        sys.executable,
        [sys.executable, str(script), "--only", *(args.only or ATTACKS), "--backends",
         *args.backends, "--timeout", str(args.timeout)],
    )  # fmt: skip


if __name__ == "__main__":
    main()
