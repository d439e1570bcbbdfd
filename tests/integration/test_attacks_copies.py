"""Copies: a peer republishes groups it did not generate (the receiver's own, or another
peer's) under its own ids. They verify, so they would fill J with texts the receiver trained
on when it made them, take a second slot for one group, and earn the copier a record without
generating. A draw takes each content once, never the receiver's own (fair_draw.sql), and
`fresh` never a content it drew before under any id.

On main at adab360 every copy was a group of its own: the receiver drew its own groups back
from a copier, the same group twice in one draw, and under `fresh` again in a later round.
"""

from __future__ import annotations

from collections import Counter

import pytest

from ledger import (
    FreshPolicy,
    PaperPolicy,
    RewardFilteredPolicy,
    VarianceWeightedPolicy,
    parse_policy,
)
from ledger.draws import public_draw_key
from ledger.policies import build_drawable
from sapo_core.reputation import Reputation
from tests.factories import copied, round_rows
from tests.peer_rounds import (
    HONEST,
    RECEIVER,
    TASKS,
    _tagged,
    publish_copier_over_cap,
    receiver_round,
    rollout_records,
    short_with_room,
)

POLICIES = [
    PaperPolicy(max_peer_share=None, max_unknown_share=None),
    RewardFilteredPolicy(),
    VarianceWeightedPolicy(),
    FreshPolicy(max_peer_share=None),
]


def _content(led, group_ids):
    found = led.query(
        "SELECT content_digest FROM groups WHERE list_contains($ids, group_id)",
        {"ids": list(group_ids)},
    )
    return found["content_digest"].to_list()


def test_copies_share_one_content_digest_and_a_changed_text_makes_another(site):
    led = site.open()
    original = round_rows("a", 0, [[1, 0, 1], [0, 1]])
    led.publish(original)
    led.publish(copied(original, "cp", 5))  # rows reversed, other ids, rewards and stamps
    # What a receiver does not train on, or rebuilds itself: the configuration's spelling,
    # a repeated row (it keeps G rows of a group).
    respelled = [r | {"task_config": '{ "size" : 100 }'} for r in copied(original, "rs", 5)]
    led.publish([*respelled, respelled[0] | {"rollout_id": respelled[0]["rollout_id"] + "x"}])
    edited = copied(original, "ed", 5)
    edited[0] = edited[0] | {"completion": "<answer>edited</answer>"}
    led.publish(edited)
    led.publish([r | {"answer": "5"} for r in copied(original, "an", 5)])
    led.publish([r | {"task_index": 9} for r in copied(original, "ix", 5)])
    digests = dict(led.query("SELECT group_id, content_digest FROM groups").iter_rows())
    a0, a1 = digests["sw.a.r0.g0"], digests["sw.a.r0.g1"]
    assert a0 != a1
    assert digests["sw.cp.r5.g0"] == digests["sw.rs.r5.g0"] == a0
    assert digests["sw.cp.r5.g1"] == digests["sw.rs.r5.g1"] == a1
    assert digests["sw.ed.r5.g1"] != a1 and digests["sw.ed.r5.g0"] == a0  # a text changed
    assert digests["sw.an.r5.g0"] != a0  # the same texts, another answer
    assert digests["sw.ix.r5.g0"] != a0  # another question (its rebuild would not match)
    # Hex text, so that SQL, polars and the command line read the same value.
    assert all(len(d) == 32 and set(d) <= set("0123456789abcdef") for d in digests.values())


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.kind)
def test_a_draw_takes_each_content_once_and_never_the_receivers_own(site, policy):
    led = site.open()
    mine = round_rows("me", 0, [[1, 0]] * 3)
    theirs = round_rows("a", 0, [[1, 0, 0]] * 4)
    led.publish(mine)
    led.publish(theirs)
    # Two copiers: the receiver's own groups and a's, each under their own ids.
    led.publish(copied(mine, "cp1", 0))
    led.publish(copied(theirs, "cp1", 1))
    led.publish(copied(theirs, "cp2", 0))
    copiers_drawn = set()
    for seed in range(12):
        drawn = led.sample_group_ids("me", 20, policy, seed=seed, swarm_id="sw")
        # a's four contents, each once, from whichever peer's copy drew lowest.
        assert len(drawn) == 4
        assert sorted(_content(led, drawn)) == sorted(set(_content(led, drawn)))
        assert not set(_content(led, drawn)) & set(_content(led, ["sw.me.r0.g0"]))
        assert not any(g.startswith("sw.cp1.r0.") for g in drawn)  # the receiver's own, copied
        copiers_drawn |= {g.split(".")[1] for g in drawn} - {"a"}
    # Which copy is the original no reader can tell (publishers stamp their own times):
    # the lowest draw takes the content, so copies are drawn too, never as extra groups.
    assert copiers_drawn == {"cp1", "cp2"}


def test_fresh_never_draws_again_a_content_drawn_before_under_another_id(site):
    led = site.open()
    theirs = round_rows("a", 0, [[1, 0]] * 2)
    led.publish(theirs)
    policy = FreshPolicy(max_peer_share=None)
    first = led.sample("me", 2, policy, seed=0, swarm_id="sw", for_round=0)
    led.write_sample("sw", "me", 0, first, policy="fresh", seed=0)
    led.publish(copied(theirs, "cp", 1))  # after the draw, stamped newer
    led.publish(round_rows("b", 1, [[0, 1]]))
    later = led.sample_group_ids("me", 4, policy, seed=1, swarm_id="sw", for_round=1)
    assert later == ["sw.b.r1.g0"]


def test_under_fresh_a_drawn_id_reused_for_anothers_content_hides_nothing(site):
    """A peer whose group was drawn once publishes that id again, in another file, carrying
    an honest peer's group, then deletes its first file. Had `fresh` read what the index
    serves under a drawn id, the honest group would never be drawn: it remembers what the
    receiver got."""
    led = site.open()
    led.publish(round_rows("p", 0, [[1, 0]]))
    policy = FreshPolicy(max_peer_share=None)
    first = led.sample("me", 1, policy, seed=0, swarm_id="sw", for_round=0)
    led.write_sample("sw", "me", 0, first, policy="fresh", seed=0)
    honest = round_rows("h", 1, [[1, 0], [0, 1]])
    led.publish(honest)
    squatted = [r | {"group_id": "sw.p.r0.g0", "rollout_id": f"sw.p.r0.g0.z{k}",
                     "node_id": "p", "node_round": 0}
                for k, r in enumerate(honest[:2])]  # fmt: skip
    reused = led.publish(squatted)
    listed = [o.key for o in led.store.list("swarm_id=sw/node_id=p/")]
    [first_file] = [k for k in listed if k.endswith(".parquet") and k not in reused]
    led.store.delete([first_file])
    later = led.sample_group_ids("me", 4, policy, seed=1, swarm_id="sw", for_round=1)
    assert sorted(later) == ["sw.h.r1.g0", "sw.h.r1.g1"]


def test_a_copier_of_the_receivers_own_groups_earns_no_draw_and_no_record(site):
    """The cheapest way to buy trust: republish what the receiver itself published, which its
    verifier is sure to accept. Over eight rounds of the real draw, verifier and reputation,
    the copier is never drawn, so never known, while an honest peer is."""
    from sapo_core.tasks import TaskSource

    led = site.open()
    reputation = Reputation.empty(RECEIVER.reputation)
    policy = FreshPolicy()
    for round_ in range(8):
        own = TaskSource(TASKS, seed=7).draw(round_, 2)
        for q in own:
            texts = _tagged([q.answer, "-1", q.answer, "0"])
            rows = rollout_records("me", round_, q, texts, [1, 0, 1, 0])
            led.publish(rows)
            led.publish(copied(rows, "copier", round_))
        q = TaskSource(TASKS, seed=100).draw(round_, 1)[0]
        texts = _tagged([q.answer, "-1", q.answer, "-1"])
        led.publish(rollout_records(HONEST[0], round_, q, texts, [1, 0, 1, 0]))
        groups, _ = receiver_round(led, reputation, policy, round_)
        assert [g.rollouts[0].node_id for g in groups] == [HONEST[0]]
    assert reputation.known() == [HONEST[0]]


@pytest.mark.parametrize("kind", ["paper", "reward_filtered", "variance_weighted", "fresh"])
def test_a_copier_over_its_hard_cap_does_not_shorten_the_draw(site, kind):
    """With ``max_per_peer``, a copier whose copies drew lowest for more contents than its
    cap took those contents from their originals and then lost them to its cap: on main at
    72f5d83 (review, 2026-12-05) `paper` with cap 2 and J = 4 drew 3 or 2 groups in 9 of 40
    seeds. Now a content goes to the lowest draw among the peers with room for it: the
    draw is full, or every content left out is held only by peers already at their cap."""
    led = site.open()
    holders = publish_copier_over_cap(led)
    policy = parse_policy({"kind": kind, "max_per_peer": 2})
    sizes = set()
    for seed in range(40):
        drawn = led.sample_group_ids("me", 4, policy, seed=seed, swarm_id="sw")
        contents = _content(led, drawn)
        per_peer = Counter(g.split(".")[1] for g in drawn)
        assert len(set(contents)) == len(contents) and max(per_peer.values()) <= 2
        assert not short_with_room(drawn, contents, holders, 4, 2), (seed, drawn)
    sizes.add(len(drawn))
    assert sizes == {4}  # here some peer with room always holds a fourth content


def test_under_a_hard_cap_a_draw_is_taking_groups_one_by_one_in_draw_order(site):
    """The answer `cut` reaches (fair_draw.sql, Ledger._draw): walk the candidates in draw
    order and take each group whose content is new and whose peer has room. Computed here
    from the paper policy's own `candidates` and compared, seed by seed."""
    from importlib import resources

    led = site.open()
    honest = [round_rows(n, 0, [[1, 0]] * 4) for n in ("o", "p", "q")]
    for rows in honest:
        led.publish(rows)
    for k, rows in enumerate(honest):  # a copier of all, and one of o's alone
        led.publish(copied(rows, "cp", k))
    led.publish(copied(honest[0], "cp2", 0))
    policy = PaperPolicy(max_per_peer=2, max_peer_share=None, max_unknown_share=None)
    candidates = (
        resources.files("ledger.policies").joinpath("paper.sql").read_text()
        # Copies of one content share a draw: the tie goes by their publishers' keyed order.
        + "\nSELECT c.group_id, c.node_id, c.content_digest FROM candidates c"
        + " JOIN drawable d USING (group_id) ORDER BY c.draw, d.peer_u, c.group_id"
    )
    for seed in range(30):
        led.query("SELECT 1")  # the views, as a draw finds them
        build_drawable(
            led.con,
            {"node_id": "me", "swarm_id": "sw", "draw_key": public_draw_key("me", seed),
             "rows_per_group": None, "remember": False, "node_round": None,
             "tasks": None, "excluded": []},
        )  # fmt: skip
        walk = led.query(
            candidates, {"node_id": "me", "swarm_id": "sw", "excluded": [], "tasks": None}
        ).iter_rows()
        taken: list[str] = []
        contents: set[str] = set()
        per_peer: Counter[str] = Counter()
        for group_id, node_id, digest in walk:
            if digest not in contents and per_peer[node_id] < 2:
                taken.append(group_id)
                contents.add(digest)
                per_peer[node_id] += 1
        for j in (3, 6, 8):
            assert led.sample_group_ids("me", j, policy, seed=seed, swarm_id="sw") == taken[:j]
