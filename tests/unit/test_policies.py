"""Sampling policies on hand-made ledgers whose right answers are known."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest
from pydantic import ValidationError

from ledger import (
    FreshPolicy,
    Ledger,
    PaperPolicy,
    RewardFilteredPolicy,
    VarianceWeightedPolicy,
    parse_policy,
)
from tests.factories import T0, copied, group_rows, round_rows


@pytest.fixture
def ledger(tmp_path):
    led = Ledger.open(str(tmp_path / "ledger"))
    # me: mixed and flat groups. a: 2 mixed + 1 all-zero. b: 1 mixed + 1 all-one + 1 mixed
    # in another swarm. c: 3 mixed groups, published long before the others.
    led.publish(round_rows("me", 0, [[1, 0], [0, 0]]))
    led.publish(round_rows("a", 0, [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]))
    led.publish(round_rows("b", 0, [[0.5, 1.0], [1, 1]]))
    led.publish(round_rows("b", 0, [[1, 0]], swarm_id="other", question="q0 of b in other"))
    old = T0 - timedelta(days=2)
    led.publish(round_rows("c", 0, [[1, 0, 0], [1, 1, 0], [0, 1, 1]], published_at=old))
    yield led
    led.close()


MIXED_PEERS = {
    "sw.a.r0.g0",
    "sw.a.r0.g1",
    "sw.b.r0.g0",
    "sw.c.r0.g0",
    "sw.c.r0.g1",
    "sw.c.r0.g2",
}


def _groups(frame):
    return set(frame.get_column("group_id").unique().to_list())


def test_paper_policy_drops_agreeing_groups_and_never_returns_own(ledger):
    everything = ledger.sample("me", 100, "paper", seed=0, swarm_id="sw")
    assert _groups(everything) == MIXED_PEERS
    assert "me" not in everything.get_column("node_id").to_list()
    # Whole groups: every completion of each drawn group.
    sizes = dict(everything.group_by("group_id").len().iter_rows())
    assert sizes["sw.a.r0.g0"] == 4 and sizes["sw.c.r0.g1"] == 3 and sizes["sw.b.r0.g0"] == 2
    # Without a swarm filter the other swarm's mixed group is eligible too.
    assert "other.b.r0.g0" in _groups(ledger.sample("me", 100, "paper"))


def test_paper_policy_is_seeded_replayable_and_uniform(ledger):
    first = ledger.sample_group_ids("me", 3, "paper", seed=7, swarm_id="sw")
    assert len(first) == 3 and set(first) <= MIXED_PEERS
    assert ledger.sample_group_ids("me", 3, "paper", seed=7, swarm_id="sw") == first
    reopened = Ledger.open(ledger.url)
    assert reopened.sample_group_ids("me", 3, "paper", seed=7, swarm_id="sw") == first
    # Uniform: over many seeds each of the 6 candidates is drawn about half the time (3 of 6).
    counts = dict.fromkeys(MIXED_PEERS, 0)
    seeds = 200
    for seed in range(seeds):
        for g in ledger.sample_group_ids("me", 3, "paper", seed=seed, swarm_id="sw"):
            counts[g] += 1
    assert all(abs(c / seeds - 0.5) < 0.12 for c in counts.values()), counts


def test_paper_policy_reaches_every_subset_evenly(ledger):
    """Uniform over subsets, not only per group: all 20 draws of 3 of the 6 candidates occur
    about equally often (a weakly mixed hash once reached only 8 of them). Without the
    per-peer cap: that is the paper's draw exactly."""
    seeds = 400
    counts: dict[tuple[str, ...], int] = {}
    uncapped = {"kind": "paper", "max_peer_share": 1.0}
    for seed in range(seeds):
        drawn = tuple(sorted(ledger.sample_group_ids("me", 3, uncapped, seed=seed, swarm_id="sw")))
        counts[drawn] = counts.get(drawn, 0) + 1
    assert len(counts) == 20
    assert all(5 <= c <= 35 for c in counts.values()), counts  # expected 20 each (sd 4.4)


def test_the_default_cap_holds_every_peer_to_half_the_draw_while_others_have_groups(ledger):
    """c has 3 of the 6 candidates: by default it supplies at most 2 of 3 drawn (ceil 1.5)
    while a and b have groups left; asked for all 6, c's third fills the last slot."""
    for seed in range(100):
        drawn = ledger.sample_group_ids("me", 3, "paper", seed=seed, swarm_id="sw")
        assert len(drawn) == 3
        assert sum(g.startswith("sw.c.") for g in drawn) <= 2
        assert len(ledger.sample_group_ids("me", 6, "paper", seed=seed, swarm_id="sw")) == 6


def test_receivers_sharing_a_seed_draw_independently(ledger):
    ledger.publish(round_rows("you", 0, [[1, 0]]))
    draws_me = [ledger.sample_group_ids("me", 2, seed=s, swarm_id="sw") for s in range(30)]
    draws_you = [ledger.sample_group_ids("you", 2, seed=s, swarm_id="sw") for s in range(30)]
    assert sum(a == b for a, b in zip(draws_me, draws_you, strict=True)) < 15


def test_reward_filtered_bounds_on_mean_reward(ledger):
    policy = RewardFilteredPolicy(min_mean_reward=0.5, max_mean_reward=0.7)
    got = _groups(ledger.sample("me", 100, policy, swarm_id="sw"))
    # means: a.g0 .25, a.g1 .5, b.g0 .75, c.g0 .33, c.g1 .67, c.g2 .67
    assert got == {"sw.a.r0.g1", "sw.c.r0.g1", "sw.c.r0.g2"}
    keep_flat = RewardFilteredPolicy(min_mean_reward=0.9, require_variance=False)
    assert _groups(ledger.sample("me", 100, keep_flat, swarm_id="sw")) == {"sw.b.r0.g1"}


def test_reward_filtered_recency_window(ledger):
    now = T0 + timedelta(hours=1)
    recent = RewardFilteredPolicy(max_age_s=3 * 3600)
    got = _groups(ledger.sample("me", 100, recent, swarm_id="sw", now=now))
    assert got == {"sw.a.r0.g0", "sw.a.r0.g1", "sw.b.r0.g0"}


def test_reward_filtered_caps_groups_per_peer(ledger):
    capped = RewardFilteredPolicy(max_per_peer=1)
    frame = ledger.sample("me", 100, capped, swarm_id="sw")
    per_peer = frame.group_by("node_id").agg(pl.col("group_id").n_unique())
    assert sorted(per_peer.rows()) == [("a", 1), ("b", 1), ("c", 1)]
    assert len(ledger.sample_group_ids("me", 2, capped, swarm_id="sw")) == 2


# Population variance of each mixed peer group's rewards (see the fixture).
VARIANCE = {
    "sw.a.r0.g0": 0.1875,  # [1, 0, 0, 0]
    "sw.a.r0.g1": 0.25,  # [1, 1, 0, 0]
    "sw.b.r0.g0": 0.0625,  # [0.5, 1]
    "sw.c.r0.g0": 2 / 9,
    "sw.c.r0.g1": 2 / 9,
    "sw.c.r0.g2": 2 / 9,
}


def test_variance_weighted_draws_in_proportion_to_reward_variance(ledger):
    policy = VarianceWeightedPolicy()
    assert _groups(ledger.sample("me", 100, policy, swarm_id="sw")) == MIXED_PEERS
    # The first pick of a weighted draw without replacement is w_i / sum(w).
    seeds = 500
    counts = dict.fromkeys(MIXED_PEERS, 0)
    for seed in range(seeds):
        (first,) = ledger.sample_group_ids("me", 1, policy, seed=seed, swarm_id="sw")
        counts[first] += 1
    total = sum(VARIANCE.values())
    for group, weight in VARIANCE.items():
        # within 3 standard errors (at most 0.018 here) of its share
        assert abs(counts[group] / seeds - weight / total) < 0.055, (group, counts)
    # Replayable, and a half/half group beats a 3:1 one far more often than uniform would.
    assert ledger.sample_group_ids("me", 3, policy, seed=5, swarm_id="sw") == (
        ledger.sample_group_ids("me", 3, policy, seed=5, swarm_id="sw")
    )
    assert counts["sw.a.r0.g1"] > 3 * counts["sw.b.r0.g0"]


def test_variance_weighted_cap_and_minimum_spread(ledger):
    capped = VarianceWeightedPolicy(max_per_peer=1)
    frame = ledger.sample("me", 100, capped, swarm_id="sw")
    per_peer = frame.group_by("node_id").agg(pl.col("group_id").n_unique())
    assert sorted(per_peer.rows()) == [("a", 1), ("b", 1), ("c", 1)]
    spread = VarianceWeightedPolicy(min_std=0.3)  # b.g0's std is 0.25
    assert _groups(ledger.sample("me", 100, spread, swarm_id="sw")) == MIXED_PEERS - {"sw.b.r0.g0"}
    now = T0 + timedelta(hours=1)
    recent = VarianceWeightedPolicy(max_age_s=3 * 3600)
    got = _groups(ledger.sample("me", 100, recent, swarm_id="sw", now=now))
    assert got == {"sw.a.r0.g0", "sw.a.r0.g1", "sw.b.r0.g0"}
    with pytest.raises(ValidationError):
        parse_policy({"kind": "variance_weighted", "min_std": 0.9})


def test_fewer_groups_come_back_when_fewer_qualify(ledger):
    assert ledger.sample("me", 0, "paper").height == 0
    assert ledger.sample("nobody", 100, "paper", swarm_id="none").height == 0
    assert len(ledger.sample_group_ids("me", 100, "paper", swarm_id="sw")) == 6


def test_policy_parsing_and_bounds():
    assert parse_policy("paper") == PaperPolicy()
    assert parse_policy({"kind": "reward_filtered", "max_per_peer": 2}).max_per_peer == 2
    with pytest.raises(ValidationError):
        parse_policy({"kind": "reward_filtered", "min_mean_reward": 0.8, "max_mean_reward": 0.2})
    with pytest.raises(ValidationError):
        parse_policy({"kind": "paper", "typo": 1})
    with pytest.raises(ValidationError):
        parse_policy("nonsense")
    assert "reward_max > reward_min" in PaperPolicy().sql


def test_sampling_writes_nothing(ledger):
    ledger.sample("me", 2, "paper", seed=1, swarm_id="sw")
    assert ledger.query("SELECT count(*) FROM samples").item() == 0
    assert not [o for o in ledger.store.list("_samples/")]


def test_sample_log_records_each_draw_once_even_across_midnight(ledger):
    first = ledger.sample("me", 2, "paper", seed=1, swarm_id="sw")
    before = T0.replace(hour=23, minute=59)
    key = ledger.write_sample("sw", "me", 3, first, policy="paper", seed=1, now=before)
    # The round retried after UTC midnight: same round, another day's folder; nothing new.
    after = before + timedelta(minutes=2)
    again = ledger.sample("me", 2, "paper", seed=1, swarm_id="sw", now=after)
    assert ledger.write_sample("sw", "me", 3, again, policy="paper", seed=1, now=after) == key
    assert len(ledger.store.list("_samples/")) == 1
    log = ledger.query("SELECT * FROM samples ORDER BY group_id")
    assert log.height == 2
    assert set(log.get_column("group_id")) == _groups(first)
    assert set(log.get_column("node_id")) == {"me"} and set(log.get_column("node_round")) == {3}
    assert set(log.get_column("policy")) == {"paper"} and set(log.get_column("seed")) == {1}
    peers = dict(first.select("group_id", "node_id").unique().iter_rows())
    assert dict(log.select("group_id", "peer_node_id").iter_rows()) == peers


def test_group_view_has_hand_computed_statistics(ledger):
    row = ledger.query(
        "SELECT size, reward_mean, reward_std, reward_min, reward_max FROM groups "
        "WHERE group_id = 'sw.a.r0.g0'"
    ).row(0)
    assert row == (4, 0.25, pytest.approx(0.4330127), 0.0, 1.0)


def test_group_rows_helper_shape():
    assert len(group_rows("x", 0, 0, [1, 0, 1])) == 3


def test_excluded_peers_are_never_drawn(ledger):
    for policy in ("paper", "reward_filtered", "variance_weighted"):
        for seed in range(20):
            drawn = ledger.sample_group_ids(
                "me", 6, policy, seed=seed, swarm_id="sw", exclude_nodes=["c"]
            )
            assert drawn and not any(g.startswith("sw.c.") for g in drawn)


def test_a_draw_from_the_lowest_draws_is_the_draw_over_every_candidate(tmp_path, monkeypatch):
    """``Ledger._draw`` looks among the lowest draws first and keeps that answer only when it
    provably equals the full one: with pools of one draw per group asked for (answers often
    refused) and of sixteen (the default), every answer equals the one over all candidates."""
    from ledger import reads as ledger_module

    led = Ledger.open(str(tmp_path / "ledger"))
    # Peers of very different sizes: p0 publishes 1 mixed group, p11 twelve; some flat.
    for p in range(12):
        led.publish(round_rows(f"p{p}", 0, [[1, 0, p % 2]] * (p + 1) + [[1, 1]]))
    # And a copier: p11's groups again under its own ids, taking one draw per content.
    led.publish(copied(round_rows("p11", 0, [[1, 0, 1]] * 12), "cp", 3))
    policies = [
        "paper",
        RewardFilteredPolicy(max_per_peer=2, min_mean_reward=0.3),
        VarianceWeightedPolicy(max_peer_share=0.25),
        PaperPolicy(max_peer_share=None, max_unknown_share=None),
        FreshPolicy(max_per_peer=3),
    ]
    cases = [
        (policy, n, seed, known)
        for policy in policies
        for n in (1, 3, 8, 40)
        for seed in range(2)
        for known in (None, ["p11", "p10", "p3"], [f"p{p}" for p in range(1, 12)])
    ]

    def draws(pool: int) -> list[list[str]]:
        monkeypatch.setattr(ledger_module, "DRAW_POOL_PER_GROUP", pool)
        return [
            led.sample_group_ids("p0", n, policy, seed=seed, swarm_id="sw", known_nodes=known)
            for policy, n, seed, known in cases
        ]

    everything = draws(10**6)
    assert draws(1) == everything
    assert draws(16) == everything
    assert {len(d) for d in everything} >= {1, 3, 8}
    led.close()


def test_fresh_takes_each_peer_group_once_newest_first_and_no_more_than_there_is(ledger):
    policy = FreshPolicy(max_peer_share=None)
    # Peers take turns, each its newest group first: one of a's (published at T0), b's,
    # and one of c's (two days older) before any peer's second.
    first = ledger.sample_group_ids("me", 3, policy, seed=3, swarm_id="sw")
    assert sorted(g.split(".")[1] for g in first) == ["a", "b", "c"]
    assert "sw.b.r0.g0" in first
    drawn = ledger.sample("me", 3, policy, seed=3, swarm_id="sw")
    ledger.write_sample("sw", "me", 0, drawn, policy="fresh", seed=3)
    # What the receiver drew before is never drawn again: three are left, and asking for
    # five returns those three (J adapts to what peers give).
    second = ledger.sample_group_ids("me", 5, policy, seed=4, swarm_id="sw")
    assert sorted(second) == sorted(MIXED_PEERS - set(first))
    # Another receiver's log, or the same node id's log in another swarm, changes nothing.
    for_x = ledger.sample_group_ids("x", 4, policy, seed=3, swarm_id="sw")
    assert sorted(g.split(".")[1] for g in for_x) == ["a", "b", "c", "me"]
    ledger.write_sample("other", "me", 0, drawn, policy="fresh", seed=3)
    assert sorted(ledger.sample_group_ids("me", 5, policy, seed=4, swarm_id="sw")) == sorted(second)
    ledger.publish(round_rows("a", 1, [[0, 1]], published_at=T0 + timedelta(hours=1)))
    newest = ledger.sample_group_ids("me", 2, policy, seed=5, swarm_id="sw")
    assert "sw.a.r1.g0" in newest  # a's turn brings its newest
    # A retried round 0 draws again what round 0 could draw (only earlier rounds' draws
    # count); round 1 excludes them.
    again = ledger.sample_group_ids("me", 4, policy, seed=3, swarm_id="sw", for_round=0)
    assert {"sw.a.r1.g0", "sw.b.r0.g0"} <= set(again) and len(again) == 4
    later = ledger.sample_group_ids("me", 5, policy, seed=3, swarm_id="sw", for_round=1)
    assert not set(later) & set(first)


def test_under_fresh_a_later_stamp_buys_no_larger_share(ledger):
    # Issue 43: fresh ordered every candidate by age, so a peer that always published last
    # took every slot its caps allowed, round after round. Peers now take turns.
    later = T0 + timedelta(hours=1)
    ledger.publish(round_rows("flooder", 0, [[1, 0]] * 12, published_at=later))
    policy = FreshPolicy(max_peer_share=None)
    for seed in range(20):
        drawn = ledger.sample_group_ids("me", 4, policy, seed=seed, swarm_id="sw")
        peers = [g.split(".")[1] for g in drawn]
        assert sorted(peers).count("flooder") == 1, (seed, peers)  # one turn of four
    # The unknown-peer budget holds under fresh too: unknown peers' groups, all of them
    # together, take one slot of four while known peers have candidates.
    for seed in range(10):
        drawn = ledger.sample_group_ids(
            "me", 4, FreshPolicy(), seed=seed, swarm_id="sw", known_nodes=["a", "c"]
        )
        assert sum(g.split(".")[1] in ("flooder", "b") for g in drawn) == 1


@pytest.mark.parametrize("kind", ["paper", "reward_filtered", "variance_weighted", "fresh"])
def test_only_tasks_the_receiver_judges_are_drawn(ledger, kind):
    # A group of a task the receiver neither trains nor is evaluated on takes a slot of J
    # and teaches nothing (its verifier cannot judge it): the draw asks for its tasks only.
    ledger.publish(round_rows("d", 0, [[1, 0]] * 3, task="products"))
    everything = ledger.sample_group_ids("me", 100, kind, swarm_id="sw")
    assert sum(g.startswith("sw.d.") for g in everything) == 3
    judged = ledger.sample_group_ids("me", 100, kind, swarm_id="sw", tasks=["basic_arithmetic"])
    assert set(judged) == set(everything) - {g for g in everything if g.startswith("sw.d.")}
    only_d = ledger.sample_group_ids("me", 100, kind, swarm_id="sw", tasks=["products"])
    assert set(only_d) == {g for g in everything if g.startswith("sw.d.")}


def test_fresh_keeps_the_paper_filter_the_caps_and_a_window(ledger):
    everything = _groups(ledger.sample("me", 100, FreshPolicy(), swarm_id="sw"))
    assert everything == MIXED_PEERS  # agreeing groups and own groups never come back
    capped = FreshPolicy(max_per_peer=1)
    per_peer = ledger.sample("me", 100, capped, swarm_id="sw").group_by("node_id").len()
    assert sorted(per_peer.get_column("node_id")) == ["a", "b", "c"]
    # The default soft cap: with two asked for, one peer supplies one while others have any.
    pair = ledger.sample("me", 2, FreshPolicy(), seed=1, swarm_id="sw")
    assert pair.get_column("node_id").n_unique() == 2
    now = T0 + timedelta(hours=1)
    recent = FreshPolicy(max_age_s=3 * 3600)
    got = _groups(ledger.sample("me", 100, recent, swarm_id="sw", now=now))
    assert got == {"sw.a.r0.g0", "sw.a.r0.g1", "sw.b.r0.g0"}
    assert parse_policy("fresh") == FreshPolicy()


def test_a_typed_draw_request_draws_what_the_keyword_form_draws(ledger) -> None:
    """Issue 59: the node's warm-up wait and its draw take one typed request (no splatted
    dict); `sample`'s keywords stay the user's form and build the same request."""
    from ledger import DrawRequest

    excluded = ["a"]
    request = DrawRequest(
        node_id="me", n_groups=3, policy="paper", seed=7, swarm_id="sw", exclude_nodes=excluded
    )
    excluded.append("b")  # the caller's list changes: the request does not
    assert request.exclude_nodes == ("a",)
    assert ledger.draw_group_ids(request) == ledger.sample_group_ids(
        "me", 3, "paper", seed=7, swarm_id="sw", exclude_nodes=["a"]
    )
    drawn = ledger.draw(request)
    assert drawn.height > 0 and "a" not in set(drawn["node_id"])
    assert drawn.equals(ledger.sample("me", 3, "paper", seed=7, swarm_id="sw", exclude_nodes=["a"]))
    with pytest.raises(TypeError, match="unexpected keyword argument 'exclude'"):
        ledger.sample_group_ids("me", 3, exclude=["a"])
