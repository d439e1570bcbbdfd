"""A peer's question that is exponential to rebuild, against the receiver's verifier (issue 27).

The node runs `tower_of_hanoi` with 3 to 7 disks, so its bounds accept a peer's config of up
to 70 (10x its own). Three pegs and 24 disks make a question whose answer lists 2**24 - 1
moves: ~16 s and ~2.2 GB to build in process, doubling with each disk. This scores one
round of peers' groups (the bomb among honest ones) the way `Learner.select` does, with the
node's default `RewardConfig` (the rebuild worker's 2 s and 1024 MB), and prints the row:
seconds and peak RSS (the node's, and the worker's), the bomb's rows that were scored (the
'wrong' column), and whether the honest groups came through.

    python benchmarks/node_attacks.py            # after: the bounded worker
    python benchmarks/node_attacks.py --before   # and the in-process rebuild it replaced

`verifier_bomb()` returns the figures as a dict, for `benchmarks/attacks.py`'s table.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HANG_S = 120.0
BOMB_DISKS = 24


def _round(bomb_disks: int) -> tuple[Any, Any, list[Any], list[Any]]:
    """(reward config, the node's bounds, honest peers' groups, the round with the bomb)."""
    from sapo_core.config import RewardConfig, TaskConfig, TaskSpec
    from sapo_core.rewards import ConfigBounds
    from sapo_core.rollouts import Group, Rollout
    from sapo_core.tasks import TaskSource, canonical_config

    hanoi = TaskSpec(name="tower_of_hanoi", config={"min_disks": 3, "max_disks": 7})
    tasks = TaskConfig(specs=(*TaskConfig().specs, hanoi))
    bounds = ConfigBounds.for_node(tasks, None, RewardConfig().max_config_number)

    def group(q: Any, k: int) -> Group:
        texts = [f"<answer>{q.answer}</answer>", "<answer>-1</answer>", "none", "<answer>0"]
        rows = tuple(
            Rollout(f"evil.r0.q{k}.c{j}", f"evil.r0.q{k}", "evil", "m", 0, 0, q, t, 1.0)
            for j, t in enumerate(texts)
        )
        return Group(f"evil.r0.q{k}", "external", rows)

    questions = TaskSource(tasks, seed=11).draw(0, 3)
    honest = [group(q, k) for k, q in enumerate(questions)]
    config = canonical_config({"min_disks": bomb_disks, "max_disks": bomb_disks, "max_pegs": 3})
    source = TaskSource(TaskConfig(specs=(hanoi,)), seed=1).draw(0, 1)[0]
    bomb = group(dataclasses.replace(source, task_config=config), 9)
    assert bounds.problem(bomb.question.task, config) is None, "the bounds must accept it"
    return RewardConfig(), bounds, honest, [bomb, *honest]


def _peak_mb() -> tuple[float, float]:
    """Peak RSS of this process and of its reaped children (the killed workers), in MB."""
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return me, children


def verifier_bomb(before: bool = False) -> dict[str, Any]:
    """One round of peers' groups with a bomb among them; the figures. ``before``: rebuild
    in this process, as the node did before the worker (unbounded)."""
    from flows.env import apply_offline_defaults
    from sapo_core import rebuild
    from sapo_core.rewards import score_group, score_groups

    apply_offline_defaults()
    config, bounds, honest, attacked = _round(BOMB_DISKS)
    started = time.monotonic()
    try:
        if before:
            results = [score_group(g, config) for g in attacked]  # in process, as before
            scored = [s for s, _ in results if s is not None]
            problems = [p for _, ps in results for p in ps]
            honest_s = 0.0
        else:
            worker = rebuild.shared(config.rebuild_timeout_s, config.rebuild_memory_mb)
            warm = time.monotonic()
            score_groups(honest, config, bounds)  # the worker's start, and an honest round
            honest_s = time.monotonic() - warm
            warm = time.monotonic()
            score_groups(honest, config, bounds)
            honest_s = time.monotonic() - warm
            started = time.monotonic()
            scored, problems = score_groups(attacked, config, bounds)
            worker.close()
    except Exception as exc:  # reported in the row
        seconds = time.monotonic() - started
        return {
            "seconds": seconds,
            "rss_mb": max(_peak_mb()),
            "wrong": 0,
            "crash": True,
            "hang": seconds > HANG_S,
            "extra": f"{type(exc).__name__}: {exc}"[:160],
        }
    seconds = time.monotonic() - started
    node_mb, worker_mb = _peak_mb()
    bomb_id = attacked[0].group_id
    wrong = sum(len(s.rewards) for s in scored if s.group.group_id == bomb_id)
    through = sum(s.group.group_id != bomb_id for s in scored)
    why = next((p.split(": ", 1)[1] for p in problems if p.startswith(bomb_id)), "not flagged")
    where = "in process (before)" if before else f"worker peak {worker_mb:.0f} MB"
    return {
        "seconds": seconds,
        "rss_mb": node_mb,
        "wrong": wrong,
        "crash": False,
        "hang": seconds > HANG_S,
        "extra": f"{BOMB_DISKS} disks: {why}; honest groups {through}/{len(honest)} scored; "
        f"honest round {honest_s:.3f} s; {where}",
    }


def markdown_row(name: str, r: dict[str, Any]) -> str:
    return (
        f"| {name} | local | {r['rss_mb']:.0f} | {r['seconds']:.1f} | {r['wrong']} | "
        f"{'yes' if r['crash'] else 'no'} | {'yes' if r['hang'] else 'no'} | {r['extra']} |"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", action="store_true", help="also the in-process rebuild")
    args = parser.parse_args()
    print(markdown_row("verifier-bomb", verifier_bomb()), flush=True)
    if args.before:
        print(markdown_row("verifier-bomb (before)", verifier_bomb(before=True)))
