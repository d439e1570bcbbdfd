"""Issue 57: peers that compute offline where their rows land.

On main at c073e2c everything a draw hashed was public (the receiver's id, its seed, the
round), and a group's rows were cut to G by the receiver's public seed. So two Sybils that
ground one group id a round took 100% of J under `paper`; two whose node ids were ground for
`fresh`'s peer order took 100% of J there; and a copier that padded the receiver's own
group with one row, named for the row the public seed dropped, was trained on every round.
Now a draw is keyed by the receiver's secret (ledger/draws.py) and judges copies on the
completions it would train (ledger/policies/drawable.sql). Run on a local folder and S3.
"""

from __future__ import annotations

import pytest

from ledger import FreshPolicy, PaperPolicy
from ledger.draws import public_draw_key, round_draw_key
from tests.factories import copied, round_rows
from tests.grinding import (
    ground_group_ids_attack,
    ground_node_ids_attack,
    padded_copies_attack,
)
from tests.peer_rounds import RECEIVER_SECRET, TASKS, _tagged, rollout_records


def test_ground_group_ids_buy_sybils_no_more_of_j(site):
    """Two Sybils publish one group a round, its id ground offline against c073e2c's public
    `paper` draw (on c073e2c: 100% of J, honest peers 0 judged rows). Against a keyed draw
    the ground ids are ids like any other."""
    ground = ground_group_ids_attack(site.open(), PaperPolicy(), 10, ground=True)
    plain = ground_group_ids_attack(site.sibling("plain").open(), PaperPolicy(), 10, ground=False)
    assert ground.share <= plain.share + 0.15, (ground, plain)
    assert ground.share < 0.5 and ground.honest_rows >= 40, ground


def test_ground_node_ids_buy_sybils_no_more_of_j_under_fresh(site):
    """Two Sybils whose node ids were ground so that c073e2c's `fresh` put them first for
    the receiver's next 8 rounds (there: 100% of J, honest peers 0 judged rows)."""
    ground = ground_node_ids_attack(site.open(), FreshPolicy(), 8, ground=True)
    plain = ground_node_ids_attack(site.sibling("plain").open(), FreshPolicy(), 8, ground=False)
    assert ground.share <= plain.share + 0.15, (ground, plain)
    assert ground.honest_rows >= 16, ground


@pytest.mark.parametrize("kind", ["paper", "fresh"])
def test_a_padded_copy_of_the_receivers_group_is_never_trained(site, kind):
    """A copier republishes the receiver's group plus one row, named for the row c073e2c's
    public seed dropped (there: trained 6 of 6 rounds, under `paper` and under `fresh`).
    Its only new completion is the padding: one row, not a group."""
    policy = PaperPolicy() if kind == "paper" else FreshPolicy()
    out = padded_copies_attack(site.open(), policy, 6, fresh=kind == "fresh")
    assert out.by_attackers == 0 and out.trained_rounds == 0, out
    # The honest peer's groups fill J: under `paper` any of them (one in round 0), under
    # `fresh` each once, as it comes.
    assert out.drawn == (11 if kind == "paper" else 6)


def test_a_group_wrapping_completions_drawn_before_is_not_fresh(site):
    """Under `fresh` a completion is drawn once, from anyone: a copier that republishes a
    drawn group with two new rows offers two fresh rows, kept as a group of two."""
    led = site.open()
    theirs = round_rows("a", 0, [[1, 0, 1, 0]])
    led.publish(theirs)
    policy = FreshPolicy(max_peer_share=None)
    key = round_draw_key(RECEIVER_SECRET, "sw", "me", 0)
    first = led.sample("me", 1, policy, swarm_id="sw", for_round=0, draw_key=key)
    led.write_sample("sw", "me", 0, first, policy="fresh", seed=0)
    padded = copied(theirs, "cp", 1)
    extra = [padded[0] | {"rollout_id": f"{padded[0]['group_id']}.x{k}",
                          "completion": f"<answer>new {k}</answer>", "reward": float(k)}
             for k in range(2)]  # fmt: skip
    led.publish([*padded, *extra])
    later = led.sample(
        "me", 2, policy, swarm_id="sw", for_round=1,
        draw_key=round_draw_key(RECEIVER_SECRET, "sw", "me", 1),
    )  # fmt: skip
    assert sorted(later["completion"].to_list()) == [
        "<answer>new 0</answer>",
        "<answer>new 1</answer>",
    ]
    # Under `paper` (which draws a group again), the receiver gets the whole copy once.
    again = led.sample("me", 2, "paper", swarm_id="sw", draw_key=key)
    assert again["group_id"].n_unique() == 1


def test_a_draw_never_holds_one_completion_twice(site):
    """A copier pads a third peer's group with one row: both groups are drawable, but a draw
    that takes one leaves the other (they share completions), whichever the key puts
    first; the draw is still full when other groups are there."""
    led = site.open()
    theirs = round_rows("a", 0, [[1, 0, 1, 0]] * 3)
    led.publish(theirs)
    led.publish(round_rows("b", 0, [[0, 1, 1, 0]] * 3))
    padded = copied(theirs[:4], "cp", 0)
    pad = padded[0] | {
        "rollout_id": padded[0]["rollout_id"] + "x",
        "completion": "<answer>p</answer>",
    }
    led.publish([*padded, pad])
    for seed in range(16):
        frame = led.sample("me", 6, PaperPolicy(max_peer_share=None), seed=seed, swarm_id="sw")
        said = list(zip(frame["question"].to_list(), frame["completion"].to_list(), strict=True))
        assert len(said) == len(set(said)), seed
        assert frame["group_id"].n_unique() == 6


def test_a_publisher_cannot_choose_the_rows_kept_nor_claim_on_rows_dropped(site):
    """A group of 8 rows cut to the receiver's G = 4: which 4 falls with the receiver's key,
    whatever the publisher named its rows. And claims count on the rows kept only: the same
    group, its kept rows claiming alike and its dropped rows otherwise, is not informative
    to that receiver (on c073e2c the draw judged claims on all 8)."""
    from sapo_core.tasks import TaskSource

    question = TaskSource(TASKS, seed=3).draw(0, 1)[0]
    texts = _tagged([question.answer] * 4 + ["-1", "-2", "-3", "-4"])
    rows = rollout_records("a", 0, question, texts, [1.0] * 4 + [0.0] * 4)
    led = site.open()
    led.publish(rows)
    cuts = set()
    for seed in range(24):
        frame = led.sample("me", 1, "paper", seed=seed, swarm_id="sw", rows_per_group=4)
        assert frame.height in (0, 4)  # drawn (its kept claims differ) as 4 rows, or not
        cuts.add(tuple(sorted(frame["completion"].to_list())))
    assert len(cuts) > 5  # many different cuts, as the key falls
    key = public_draw_key("me", 5)
    everything = {"kind": "reward_filtered", "require_variance": False}
    kept = set(led.sample("me", 1, everything, swarm_id="sw", rows_per_group=4,
                          draw_key=key)["completion"].to_list())  # fmt: skip
    # Renamed and reordered rows: the same cut under the same key.
    renamed = [r | {"rollout_id": f"{r['group_id']}.z{9 - k}"} for k, r in enumerate(rows)]
    again = site.sibling("renamed").open()
    again.publish(list(reversed(renamed)))
    assert set(again.sample("me", 1, everything, swarm_id="sw", rows_per_group=4,
                            draw_key=key)["completion"].to_list()) == kept  # fmt: skip
    # Kept rows claim 1, dropped rows 0: informative as a whole, not as it would be trained.
    claims = [r | {"reward": 1.0 if r["completion"] in kept else 0.0} for r in rows]
    claimed = site.sibling("claimed").open()
    claimed.publish(claims)
    assert claimed.sample_group_ids("me", 1, "paper", swarm_id="sw", draw_key=key) != []
    assert (
        claimed.sample_group_ids("me", 1, "paper", swarm_id="sw", draw_key=key, rows_per_group=4)
        == []
    )


def test_a_receiver_reopened_draws_what_it_would_have_drawn(site):
    """Given the same ledger, a receiver that stops after logging its draws and starts again
    with a cold reader draws, round after round, exactly what it drew before (fresh, which
    remembers completions through its sample log, and a hard cap)."""
    led = site.open()
    for r in range(4):
        for node in ("a", "b", "c"):
            led.publish(round_rows(node, r, [[1, 0, 1, 0], [0, 1, 1, 0]], swarm_id="sw"))
    policy = FreshPolicy(max_per_peer=2)

    def rounds(reader, logging: bool) -> list[list[str]]:
        out = []
        for r in range(4):
            key = round_draw_key(RECEIVER_SECRET, "sw", "me", r)
            frame = reader.sample("me", 3, policy, swarm_id="sw", for_round=r, draw_key=key,
                                  rows_per_group=4)  # fmt: skip
            if logging:
                reader.write_sample("sw", "me", r, frame, policy="fresh", seed=r)
            out.append(sorted(set(frame["group_id"].to_list())))
        return out

    first = rounds(led, logging=True)
    assert len({g for d in first for g in d}) == sum(len(d) for d in first)  # each once
    led.close()
    assert rounds(site.open(), logging=False) == first


def test_many_near_copies_of_one_completion_neither_shorten_a_draw_nor_take_more_of_it(site):
    """Review of issue 57: a peer publishes 200 groups sharing one completion, each padded
    with other rows. A draw takes one of them at most (they share a completion), and is
    still full: every variant leaves the draw at once, not one per pass."""
    led = site.open()
    for node in ("o", "q", "r"):
        led.publish(round_rows(node, 0, [[1, 0, 1, 0]] * 4))
    base = round_rows("p", 0, [[1, 0, 1, 0]])
    variants = []
    for v in range(200):
        gid = f"sw.p.r0.v{v}"
        variants += [r | {"group_id": gid, "rollout_id": f"{gid}.c{k}",
                          "completion": r["completion"] if k == 0 else f"<answer>{v}-{k}</answer>"}
                     for k, r in enumerate(base)]  # fmt: skip
    led.publish(variants)
    for seed in range(6):
        for j in (4, 8):
            frame = led.sample("me", j, "paper", seed=seed, swarm_id="sw", rows_per_group=4)
            assert frame["group_id"].n_unique() == j, (seed, j)
            from_p = frame.filter(frame["node_id"] == "p")["group_id"].n_unique()
            assert from_p <= 1


def test_a_retried_round_trains_on_what_its_log_says_it_drew(site):
    """Review of issue 57: under `fresh` (newest first) a retry after new groups arrived
    would draw anew and train on completions its log never recorded. The log is read
    back instead: the same groups, the same completions."""
    led = site.open()
    led.publish(round_rows("a", 0, [[1, 0, 1, 0, 1, 0]] * 2))
    key = round_draw_key(RECEIVER_SECRET, "sw", "me", 0)
    first = led.sample("me", 2, FreshPolicy(), swarm_id="sw", for_round=0, draw_key=key,
                       rows_per_group=4)  # fmt: skip
    assert led.logged_draw("sw", "me", 0) is None
    led.write_sample("sw", "me", 0, first, policy="fresh", seed=0)
    led.publish(round_rows("b", 1, [[0, 1, 0, 1]] * 2))  # newer groups, after the draw
    again = site.open().logged_draw("sw", "me", 0)
    assert again is not None
    assert sorted(again["rollout_id"].to_list()) == sorted(first["rollout_id"].to_list())
    assert again.height == 8  # 4 kept of each group of 6


def test_a_retried_round_gets_back_a_completion_drawn_twice_twice(site):
    """A publisher's group may hold one completion twice (it sampled it twice); the draw
    keeps both rows, and so does the logged draw a retry reads back."""
    led = site.open()
    rows = round_rows("a", 0, [[1, 0, 1, 0]])
    rows[1] = rows[1] | {"completion": rows[0]["completion"]}  # c0's text again
    led.publish(rows)
    key = round_draw_key(RECEIVER_SECRET, "sw", "me", 0)
    first = led.sample("me", 1, FreshPolicy(), swarm_id="sw", for_round=0, draw_key=key,
                       rows_per_group=4)  # fmt: skip
    assert first.height == 4
    led.write_sample("sw", "me", 0, first, policy="fresh", seed=0)
    again = site.open().logged_draw("sw", "me", 0)
    assert again is not None
    assert sorted(again["rollout_id"].to_list()) == sorted(first["rollout_id"].to_list())
