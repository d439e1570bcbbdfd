"""An experiment's paired-seed statistics and diagnostics on a hand-made ledger whose
answers are worked out by hand (tests/integration/replicate_runs.py)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analysis.replicate_report import replicate_markdown, write_replicate_report
from dashboards.figures import configuration_curves
from ledger import Ledger
from tests.factories import round_rows
from tests.integration.replicate_runs import (
    BASE,
    HALF,
    NODES,
    SEEDS,
    SHARED,
    replicate_ledger,
    replicate_tables,
    swarm,
)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return replicate_ledger(tmp_path / "ledger")


def test_paired_gains_intervals_and_mechanism_from_the_ledger(
    ledger: Ledger, tmp_path: Path
) -> None:
    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    tables = replicate_tables(ledger.query, replicates, baseline=BASE, rounds=2)

    runs = {(r["configuration"], r["seed"]): r for r in tables.runs.iter_rows(named=True)}
    assert {k: v["cumulative_claimed_reward"] for k, v in runs.items()} == pytest.approx(
        {
            (BASE, 0): 0.5,
            (BASE, 1): 0.5,
            (BASE, 2): 0.5,
            (SHARED, 0): 1.0,
            (SHARED, 1): 1.0,
            (SHARED, 2): 0.5,
        }
    )
    # Training reward, over every selected group: informative groups score 0.5, the one
    # zero-variance group (n0's own in seed 0's shared round 0) 0, beside a peer's 0.5:
    # n0 0.25 + 0.5, n1 0.5 + 0.5, so that run 0.875; every other run 1.0.
    assert {k: v["cumulative_training_reward"] for k, v in runs.items()} == pytest.approx(
        {(c, s): 0.875 if (c, s) == (SHARED, 0) else 1.0 for c in (BASE, SHARED) for s in SEEDS}
    )
    # Compute: 4 completions of 5 tokens a group; one group a node-round, two nodes, two
    # rounds. Shared runs train two groups a round, but n0 of seed 0 only one in round 0.
    assert {v["tokens_generated"] for v in runs.values()} == {80}
    assert {k: v["tokens_trained"] for k, v in runs.items()} == {
        (BASE, 0): 80, (BASE, 1): 80, (BASE, 2): 80,
        (SHARED, 0): 140, (SHARED, 1): 160, (SHARED, 2): 160,
    }  # fmt: skip
    assert {v["update_seconds"] for v in runs.values()} == {None}  # not given: unknown
    assert {v["final_accuracy"] for k, v in runs.items() if k[0] == BASE} == {0.25}
    assert {v["final_accuracy"] for k, v in runs.items() if k[0] == SHARED} == {0.5}
    assert {v["initial_accuracy"] for v in runs.values()} == {0.125}
    assert {v["nodes"] for v in runs.values()} == {2}
    assert all(v["complete"] for v in runs.values())
    assert tables.node_rounds["configuration"].null_count() == 0  # final evaluations too

    (gain,) = tables.gains["cumulative_claimed_reward"].to_dicts()
    # Differences 0.5, 0.5, 0: mean 1/3, sd sqrt(1/12), half width 4.303 * sqrt(1/12) / sqrt(3)
    half = 4.302653 * (1 / 12) ** 0.5 / 3**0.5
    assert gain["configuration"] == SHARED and gain["n_seeds"] == 3
    assert gain["diff_mean"] == pytest.approx(1 / 3)
    assert (gain["diff_low"], gain["diff_high"]) == pytest.approx((1 / 3 - half, 1 / 3 + half))
    assert gain["rel_gain"] == pytest.approx(2 / 3)
    assert gain["excludes_zero"] is False
    (acc,) = tables.gains["final_accuracy"].to_dicts()
    assert acc["diff_mean"] == pytest.approx(0.25) and acc["excludes_zero"] is True
    assert (acc["diff_low"], acc["diff_high"]) == pytest.approx((0.25, 0.25))

    mech = {r["configuration"]: r for r in tables.mechanism.iter_rows(named=True)}
    assert mech[BASE]["informative_per_round"] == 1.0
    assert mech[BASE]["from_peers_per_round"] == 0.0
    # Shared: every node-round trains a peer's group; n0 of seed 0 has no own gradient in r0.
    assert mech[SHARED]["informative_per_round"] == pytest.approx((12 * 2 - 1) / 12)
    assert mech[SHARED]["from_peers_per_round"] == 1.0
    assert mech[SHARED]["node_tasks"] == 6 and mech[SHARED]["discovered_later"] == 1
    assert mech[SHARED]["discovered_after_peer_groups"] == 1
    assert mech[BASE]["reward_at_first_draw"] == 6 and mech[BASE]["discovered_later"] == 0
    late = tables.discoveries.filter(tables.discoveries["first_round"] == 1).to_dicts()
    assert [
        (d["swarm_id"], d["node_id"], d["peer_groups_before"], d["from_peers"]) for d in late
    ] == [(swarm(SHARED, 0), "n0", 1, "n1")]

    # Held-out accuracy per node and round, with the final evaluation one round past the last.
    evaluated = tables.node_rounds.filter(tables.node_rounds["accuracy"].is_not_null())
    assert sorted(set(evaluated["node_round"].to_list())) == [0, 2]
    assert evaluated.height == 2 * 3 * 2 * 2  # configurations x seeds x nodes x evaluations

    md = replicate_markdown(tables, baseline=BASE)
    assert "| 1/1 | 0.333 |" in md and "s0 +0.5, s1 +0.5, s2 +0" in md
    assert "| 1/1 | 3 | 0.833 |" in md and "| yes |" in md and "| no |" in md
    assert "cumulative training reward" in md and "### compute per run" in md
    assert "| 1/1 | 3 | 80.0 | 153.3 |" in md  # tokens generated and trained, mean
    # 1/1 shares half its groups, as the paper's 4/4 does: its gain of 1/3 over a baseline of
    # 0.5 is +67%, the interval (1/3 -/+ half) / 0.5; the training reward's gain (-0.125, 0,
    # 0 over 1.0) is -4%. The baseline row carries the paper's 8/0 and no gain.
    assert "### SAPO's Table 1 beside this experiment: cumulative claimed reward" in md
    low, high = (1 / 3 - half) / 0.5, (1 / 3 + half) / 0.5
    row = (
        f"| 4/4 | 1093.310 | +94.6% | 1/1 | 3 | 0.500 | 0.833 | +66.7% | {low:+.1%} | {high:+.1%} |"
    )
    assert row + " no |" in md
    assert "| 8/0 | 561.790 | baseline | 2/0 | 3 | 0.500 | 0.500 | baseline | - | - | - |" in md
    assert "| 4/4 | 1093.310 | +94.6% | 1/1 | 3 | 1.000 | 0.958 | -4.2% |" in md
    assert "samplers and corrections at the same I/J" not in md  # no sampler of our own was run
    # Return on compute: 1/1 gains 0.5, 0.5, 0 over 2/0 with the same 40 tokens generated a
    # node (12.5, 12.5, 0 per 1k: mean 8.333; no price per extra generated token). It trains
    # 70, 80, 80 tokens a node against 40: 7.143, 6.25, 0 per 1k trained (mean 4.464), and
    # 36.7 extra a node (0.0367k) for a gain of 1/3: 9.091 per 1k extra trained.
    back = {r["tokens"]: r for r in tables.returns.iter_rows(named=True)}
    assert back["generated"]["per_1k"] == pytest.approx(25 / 3)
    assert back["generated"]["extra_k"] == pytest.approx(0.0)
    assert back["generated"]["per_1k_extra"] is None
    assert back["trained"]["per_1k"] == pytest.approx((0.5 / 0.07 + 0.5 / 0.08) / 3)
    assert back["trained"]["extra_k"] == pytest.approx(110 / 3 / 1000)
    assert back["trained"]["per_1k_extra"] == pytest.approx((1 / 3) / (110 / 3 / 1000))
    assert "### return on compute: the gain over 2/0 per 1,000 tokens a node spent" in md
    assert "| 1/1 | 3 | 0.333 | 8.3333 [" in md and "| 0.000 | 0.037 | - | 9.0909 |" in md
    path = write_replicate_report(tables, tmp_path / "out", baseline=BASE)
    assert path.read_text() == md
    curves = configuration_curves(tables.node_rounds, tmp_path / "out" / "curves.png")
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and curves.stat().st_size > 10_000
    assert (tmp_path / "out" / "node_rounds.csv").read_text().count("\n") == 1 + 2 * 3 * 2 * 3


def test_a_run_missing_a_node_or_its_final_evaluation_is_left_out_visibly(
    ledger: Ledger,
) -> None:
    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    replicates["x-1x1-s3"] = (SHARED, 3)  # one node, one round, no evaluation
    ledger.publish(round_rows("n0", 0, [HALF], swarm_id="x-1x1-s3"))
    peer = {"drift_tokens": 5, "drift_kl": 9.0, "drift_weight_mean": 1.0,
            "drift_weight_sq_mean": 1.0, "drift_capped": 0.0}  # fmt: skip
    ledger.write_training("x-1x1-s3", "n0", 0, [
        {"group_id": "s3.g", "origin": "external", "peer_node_id": "n1", "task": "gcd",
         "completions": 4, "reward_mean": 0.5, "informative": True, "trained": True, **peer},
    ])  # fmt: skip
    tables = replicate_tables(ledger.query, replicates, baseline=BASE, rounds=2, nodes=2)
    assert tables.drift is not None and tables.drift.runs == 6
    assert tables.drift.runs_with_drift == 3  # the complete 1/1 runs: nodes alone have no peers
    assert tables.drift.blocks["kl"].max() < 9.0  # the incomplete run's drift left out too
    (partial,) = tables.runs.filter(~tables.runs["complete"]).to_dicts()
    assert partial["seed"] == 3
    assert partial["cumulative_claimed_reward"] is None and partial["final_accuracy"] is None
    (gain,) = tables.gains["cumulative_claimed_reward"].to_dicts()
    assert gain["n_seeds"] == 3  # seed 3 has no baseline nor a complete run: not paired
    text = replicate_markdown(tables, baseline=BASE)
    assert "Incomplete runs, left out of the statistics: 1/1 seed 3." in text


def test_run_metrics_average_nodes_and_measure_oscillation() -> None:
    import polars as pl

    from analysis.replicates import run_metrics

    rows = pl.DataFrame(
        {
            "configuration": ["a"] * 8,
            "seed": [0] * 8,
            "swarm_id": ["s"] * 8,
            "node_id": ["n0"] * 4 + ["n1"] * 4,
            "node_round": [0, 1, 2, 3] * 2,
            # n0 jumps 0 -> 0.5 -> 0 (diffs +0.5, -0.5: std 0.7071); n1 climbs steadily
            "claimed_reward": [0.0, 0.5, 0.0, None, 0.1, 0.2, 0.3, None],
            "accuracy": [0.1, None, None, 0.4, 0.3, None, None, 0.6],
        }
    )
    (run,) = run_metrics(rows, rounds=3).to_dicts()
    assert run["cumulative_claimed_reward"] == pytest.approx((0.5 + 0.6) / 2)
    assert run["oscillation"] == pytest.approx((0.5**0.5 + 0.0) / 2)
    assert run["initial_accuracy"] == pytest.approx(0.2)
    assert run["final_accuracy"] == pytest.approx(0.5)
    assert run["nodes"] == 2 and run["rounds_done"] == 3


def test_run_metrics_are_the_same_bytes_whatever_the_rows_order() -> None:
    """Float sums and means follow row order; the report's runs.csv must not."""
    import random

    from analysis.replicates import run_metrics

    rng = random.Random(7)
    keys = [(c, s, n, r) for c in ("a", "b") for s in range(4) for n in range(6) for r in range(6)]
    rows = pl.DataFrame(
        {
            "configuration": [c for c, *_ in keys],
            "seed": [s for _, s, _, _ in keys],
            "swarm_id": [f"{c}-s{s}" for c, s, _, _ in keys],
            "node_id": [f"n{n}" for *_, n, _ in keys],
            "node_round": [r for *_, r in keys],
            "claimed_reward": [rng.random() / 3 for _ in keys],  # not exact in binary
            "training_reward": [rng.random() / 7 for _ in keys],
            "accuracy": [rng.random() / 9 if r in (0, 5) else None for *_, r in keys],
        }
    )
    seen = {
        run_metrics(rows.sample(fraction=1.0, shuffle=True, seed=i), rounds=5).write_csv()
        for i in range(12)
    }
    assert len(seen) == 1


def test_update_seconds_come_from_mlflow_figures_per_node_round(ledger: Ledger) -> None:
    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    seconds = pl.DataFrame(
        [(sid, node, r, 1.5 if c == BASE else 2.5) for sid, (c, _) in replicates.items()
         for node in NODES for r in (0, 1)],
        schema=["swarm_id", "node_id", "node_round", "seconds_update"], orient="row",
    )  # fmt: skip
    tables = replicate_tables(
        ledger.query, replicates, baseline=BASE, rounds=2, update_seconds=seconds
    )
    got = {(r["configuration"], r["seed"]): r["update_seconds"] for r in tables.runs.to_dicts()}
    assert got == {(c, s): 6.0 if c == BASE else 10.0 for c in (BASE, SHARED) for s in SEEDS}
    # A run missing one node-round's figure has no total rather than a low one.
    partial = replicate_tables(
        ledger.query, replicates, baseline=BASE, rounds=2, update_seconds=seconds.slice(1)
    )
    first = partial.runs.filter(pl.col("swarm_id") == seconds["swarm_id"][0])
    assert first["update_seconds"].to_list() == [None]


def test_a_mixed_swarms_families_are_compared_each_against_its_own_baseline(
    ledger: Ledger,
) -> None:
    from analysis.families import family_markdown, family_tables
    from analysis.records import records_from_ledger
    from ledger import NodeManifest, parse_policy

    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    for sid, (conf, seed) in replicates.items():
        for node, model in (("n0", "family-a"), ("n1", "family-b")):
            ledger.write_manifest(
                NodeManifest.for_node(
                    swarm_id=sid, node_id=node, experiment="x", local_groups=1,
                    external_groups=0 if conf == BASE else 1, policy=parse_policy("paper"),
                    model_id=model, seed=seed,
                )
            )  # fmt: skip
    families = family_tables(records_from_ledger(ledger.query, replicates), baseline=BASE, rounds=2)
    assert set(families.runs["model"]) == {"family-a", "family-b"}
    assert families.runs.height == 2 * 3 * 2  # configurations x seeds x families
    gains = {r["model"]: r for r in families.gains["cumulative_claimed_reward"].to_dicts()}
    # n0 alone: 0.5 a run at 2/0; shared 1.0, 1.0, 0.5 (seed 2 stays at a quarter); n1 too.
    for model in ("family-a", "family-b"):
        assert gains[model]["per_seed"] == "s0 +0.5, s1 +0.5, s2 +0"
        assert gains[model]["diff_mean"] == pytest.approx(1 / 3)
    accuracy = families.gains["final_accuracy"].to_dicts()
    assert [(r["model"], r["diff_mean"]) for r in accuracy] == [
        ("family-a", pytest.approx(0.25)),
        ("family-b", pytest.approx(0.25)),
    ]
    # Every peer group each node trained on came from the other family (two nodes, one each).
    assert families.crossing.to_dicts() == [
        {"configuration": SHARED, "model": "family-a", "peer_groups_trained": 6,
         "from_other_family": 1.0},
        {"configuration": SHARED, "model": "family-b", "peer_groups_trained": 6,
         "from_other_family": 1.0},
    ]  # fmt: skip
    md = family_markdown(families, baseline=BASE)
    assert "final held-out accuracy, per family" in md and "| family-b | 1/1 | 0.250 |" in md


def test_a_node_missing_a_training_log_nulls_the_runs_training_figures() -> None:
    """Averaging the nodes that have every round's training log would pass a partial
    swarm for the whole; and an incomplete run has no oscillation either."""
    from analysis.replicates import run_metrics

    rows = pl.DataFrame(
        {
            "configuration": ["a"] * 11,
            "seed": [0] * 8 + [1] * 3,
            "swarm_id": ["s0"] * 8 + ["s1"] * 3,
            "node_id": ["n0"] * 4 + ["n1"] * 4 + ["n0"] * 3,
            "node_round": [0, 1, 2, 3] * 2 + [0, 1, 2],
            # n0 steps +0.2 each round, n1 +0.1: no oscillation in this run
            "claimed_reward": [0.1, 0.3, 0.5, None, 0.0, 0.1, 0.2, None, 0.0, 0.9, 0.0],
            # n1 lost round 1's training log
            "training_reward": [0.5, 0.5, 0.5, None, 0.5, None, 0.5, None, 0.5, 0.5, 0.5],
            "tokens_trained": [10, 10, 10, None, 10, None, 10, None, 10, 10, 10],
            "accuracy": [None, None, None, 0.5, None, None, None, 0.5, None, None, None],
        }
    )
    whole, partial = run_metrics(rows, rounds=3, nodes=2).sort("seed").to_dicts()
    assert whole["cumulative_claimed_reward"] == pytest.approx((0.9 + 0.3) / 2)
    assert whole["cumulative_training_reward"] is None  # not n0's 1.5 alone
    assert whole["tokens_trained"] is None and whole["complete"]
    assert whole["oscillation"] == pytest.approx(0.0, abs=1e-9)
    assert not partial["complete"]  # one node of two
    assert partial["oscillation"] is None and partial["cumulative_claimed_reward"] is None


def test_the_report_follows_the_plan_and_names_the_runs_it_lacks(ledger: Ledger) -> None:
    from analysis.records import records_from_ledger
    from analysis.replicates import tables_from_records

    replicates = {swarm(c, s): (c, s) for c in (SHARED, BASE) for s in SEEDS}
    planned = {**replicates, "x-1x1-s7": (SHARED, 7), "x-3x0-s0": ("3/0", 0)}
    records = records_from_ledger(ledger.query, replicates)
    tables = tables_from_records(records, baseline=BASE, rounds=2, planned=planned)
    assert tables.runs["configuration"].unique(maintain_order=True).to_list() == [SHARED, BASE]
    assert tables.mechanism["configuration"].to_list() == [SHARED, BASE]
    assert tables.unrun == ["1/1 seed 7", "3/0 seed 0"]
    text = replicate_markdown(tables, baseline=BASE)
    assert "Planned runs with no rounds here: 1/1 seed 7, 3/0 seed 0." in text
    assert (
        "| 1/1 | 3 | 0.833 [0.116, 1.550] | 0.958 [0.779, 1.138] | 0.500 [0.500, 0.500] | 80 "
        "[80, 80] | 153 [125, 182] |" in text
    )  # at a glance: one row per configuration
    assert "partly selection" in text  # under the training reward's tables
    # update seconds known for fewer seeds than tokens: the compute table says so
    rows = records.node_rounds
    records.node_rounds = rows.with_columns(
        pl.when(pl.col("swarm_id") != swarm(SHARED, 2)).then(1.0).alias("seconds_update")
    )
    text = replicate_markdown(
        tables_from_records(records, baseline=BASE, rounds=2, planned=planned), baseline=BASE
    )
    assert "| 1/1 | 3/2 | 80.0 | 153.3 | 4.0 |" in text
    assert "| 2/0 | 3 | 80.0 | 80.0 | 4.0 |" in text
    # a baseline that was never evaluated: no gains for that metric, the rest reported
    records.node_rounds = rows.with_columns(
        pl.when(pl.col("configuration") == BASE).then(None).otherwise(pl.col("accuracy"))
        .alias("accuracy")
    )  # fmt: skip
    tables = tables_from_records(records, baseline=BASE, rounds=2, planned=planned)
    assert "final_accuracy" not in tables.gains
    assert "cumulative_claimed_reward" in tables.gains


def test_seeds_whose_configurations_computed_apart_at_round_0_are_named(ledger: Ledger) -> None:
    """At round 0 a node's reward, tokens and held-out answers come from the untrained
    model: the same in every configuration of a seed, unless the runs computed differently
    (a sweep moved to another machine mid-seed). Such a seed is named, with which
    configurations agree; what a run did not log is not a difference."""
    from dataclasses import replace

    from analysis.records import records_from_ledger
    from analysis.replicates import tables_from_records, unpaired_seeds

    def rows(round_0: dict[tuple[str, int], list[tuple[float | None, int | None]]]) -> pl.DataFrame:
        return pl.DataFrame(
            [
                {
                    "configuration": conf,
                    "seed": seed,
                    "node_id": f"n{i}",
                    "node_round": 0,
                    "accuracy": accuracy,
                    "tokens_generated": tokens,
                }
                for (conf, seed), nodes in round_0.items()
                for i, (accuracy, tokens) in enumerate(nodes)
            ]
        )

    same = [(0.25, 900), (0.125, 950)]
    answered_otherwise = [(0.25, 900), (0.5, 950)]  # n1's held-out answers differ
    wrote_otherwise = [(0.25, 901), (0.125, 950)]  # n0 generated one token more
    frame = rows(
        {
            ("4/0", 0): same,
            ("2/2", 0): same,
            ("1/3", 0): same,
            ("4/0", 1): same,
            ("2/2", 1): same,
            ("1/3", 1): answered_otherwise,
            ("4/0", 2): same,
            ("2/2", 2): wrote_otherwise,
            ("1/3", 2): wrote_otherwise,
        }
    )
    assert unpaired_seeds(frame, ["4/0", "2/2", "1/3"]) == [
        "seed 1: 4/0, 2/2 apart from 1/3",
        "seed 2: 4/0 apart from 2/2, 1/3",
    ]
    # the order given is the order shown; without one, by name
    assert unpaired_seeds(frame.filter(pl.col("seed") == 1)) == ["seed 1: 1/3 apart from 2/2, 4/0"]
    assert unpaired_seeds(frame.filter(pl.col("seed") == 0)) == []
    # a node or a figure one run did not log is left out of the comparison, not a difference
    lacking = rows({("4/0", 0): same, ("2/2", 0): same[:1], ("1/3", 0): [(None, 900), same[1]]})
    assert unpaired_seeds(lacking) == []
    assert unpaired_seeds(rows({("4/0", 0): [(None, None)], ("2/2", 0): [(None, None)]})) == []

    # A control that makes 8 questions a round draws other own groups at round 0 by design:
    # told so, only its held-out answers are compared, and a moved run is still found
    control = [(0.25, 1900), (0.125, 1850)]  # same held-out answers, other own groups
    moved = [(0.5, 1900), (0.125, 1850)]  # n0 answered otherwise: another machine
    questions = {"4/0": 4, "2/2": 4, "q8": 8}
    by_design = rows({("4/0", 0): same, ("2/2", 0): same, ("q8", 0): control})
    assert unpaired_seeds(by_design, ["4/0", "2/2", "q8"], questions) == []
    assert unpaired_seeds(by_design, ["4/0", "2/2", "q8"]) == ["seed 0: 4/0, 2/2 apart from q8"]
    elsewhere = rows({("4/0", 0): same, ("2/2", 0): same, ("q8", 0): moved})
    assert unpaired_seeds(elsewhere, ["4/0", "2/2", "q8"], questions) == [
        "seed 0: 4/0, 2/2 apart from q8"
    ]
    # 2/2 moved, the control did not: 2/2 is apart from 4/0 on its own groups, and the
    # control, compared with each on held-out answers alone, sides with the first it matches
    split = rows({("4/0", 0): same, ("2/2", 0): moved, ("q8", 0): control})
    assert unpaired_seeds(split, ["4/0", "2/2", "q8"], questions) == [
        "seed 0: 4/0, q8 apart from 2/2"
    ]

    # The hand-made sweep gives its 1/1 nodes other round-0 rewards than its 2/0 nodes at
    # seeds 0 and 1 (replicate_runs.own), as a moved sweep would; at seed 2 they agree
    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    records = records_from_ledger(ledger.query, replicates)
    tables = tables_from_records(records, baseline=BASE, rounds=2)
    # without the plan's order, configurations by name
    assert tables.unpaired == [f"seed {s}: {SHARED} apart from {BASE}" for s in (0, 1)]
    markdown = replicate_markdown(tables, baseline=BASE)
    assert (
        "so their pairing mixes in that difference: seed 0: 1/1 apart from 2/0; seed 1:" in markdown
    )
    moved = swarm(SHARED, 2)
    shifted = records.node_rounds.with_columns(
        pl.when((pl.col("swarm_id") == moved) & (pl.col("node_round") == 0))
        .then(pl.col("accuracy") + 0.5)
        .otherwise(pl.col("accuracy"))
        .alias("accuracy")
    )
    tables = tables_from_records(replace(records, node_rounds=shifted), baseline=BASE, rounds=2)
    assert tables.unpaired == [f"seed {s}: {SHARED} apart from {BASE}" for s in (0, 1, 2)]


def test_gains_over_a_sharing_configuration_leave_the_papers_table_out(ledger: Ledger) -> None:
    """`--set baseline=2/2` reports the other configurations against a sharing one (issue
    46: 2/2 against the compute-matched control). The paper's gains are over nodes alone,
    so its Table 1 has nothing to sit beside; the gains and the return on compute do."""
    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    tables = replicate_tables(ledger.query, replicates, baseline=SHARED, rounds=2)
    md = replicate_markdown(tables, baseline=SHARED)
    assert "SAPO's Table 1" not in md
    assert "| vs 1/1 | gain |" in md and "| 2/0 | -0.333 |" in md
    # 2/0 trains 36.7 fewer tokens a node than 1/1 and generates the same: no price either way
    back = tables.returns.to_dicts()
    assert {r["configuration"] for r in back} == {BASE}
    assert {r["tokens"]: r["extra_k"] < 0 for r in back} == {"generated": False, "trained": True}
    assert [r["per_1k_extra"] for r in back] == [None, None]
    assert "### return on compute: the gain over 1/1 per 1,000 tokens a node spent" in md


def test_a_baseline_with_no_runs_reports_without_gains(ledger: Ledger) -> None:
    """A baseline label no run carries (a hand-made frame, a typo in code): the per
    configuration tables stand, no gain or return on compute is invented, nothing raises."""
    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    tables = replicate_tables(ledger.query, replicates, baseline="nobody", rounds=2)
    md = replicate_markdown(tables, baseline="nobody")
    assert tables.gains == {} and tables.returns.is_empty()
    assert "### at a glance" in md and "vs nobody" not in md and "return on compute" not in md


def test_peers_drift_is_pooled_per_seed_over_tokens_and_described_over_seeds(
    ledger: Ledger, tmp_path: Path
) -> None:
    """Issue 58's drift over rounds: per seed, peers' tokens pooled over the run's nodes (KL and
    the share cut weighted by tokens, the ESS each update's from its ratios' sums, weighted by
    its tokens), then the mean and t interval over seeds; the numbers worked out in
    replicate_runs.drift."""
    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    tables = replicate_tables(ledger.query, replicates, baseline=BASE, rounds=2)
    drift = tables.drift
    assert drift is not None and drift.runs == 6 and drift.runs_with_drift == 3
    assert drift.own_kl_max == pytest.approx(1e-6)
    rounds = drift.rounds  # peers only: nodes alone have none
    assert set(rounds["configuration"]) == {SHARED} and rounds.height == 3 * 2
    for row in rounds.iter_rows(named=True):
        assert row["tokens"] == 40 * (row["node_round"] + 1)
        assert row["kl"] == pytest.approx(0.25 * (row["seed"] + 1))
        assert row["ess_fraction"] == pytest.approx(5 / 16)
        assert row["capped"] == pytest.approx(0.25)
    blocks = drift.blocks  # two rounds: a block each
    assert blocks["rounds"].to_list() == ["0-0", "1-1"] and set(blocks["n_seeds"]) == {3}
    # KL over seeds: 0.25, 0.5, 0.75: mean 0.5, sd 0.25, half-width t(2) 0.25 / sqrt 3
    half = 4.302653 * 0.25 / 3**0.5
    first = blocks.row(0, named=True)
    assert first["kl"] == pytest.approx(0.5)
    assert (first["kl_low"], first["kl_high"]) == pytest.approx((0.5 - half, 0.5 + half))
    assert first["ess_fraction"] == pytest.approx(5 / 16)
    assert first["capped"] == pytest.approx(0.25)
    text = replicate_markdown(tables, baseline=BASE)
    assert (
        "| 1/1 | 0-0 | 3 | 0.500 [-0.121, 1.121] | 0.312 [0.312, 0.312] | 25.0% [25.0%, 25.0%] |"
        in text
    )
    assert "Peers' drift is in the records of 3 of 6 runs" in text
    write_replicate_report(tables, tmp_path / "out", baseline=BASE)
    assert pl.read_csv(tmp_path / "out" / "drift_rounds.csv").height == 6
