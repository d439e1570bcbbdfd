"""An experiment's paired-seed statistics and diagnostics on a hand-made ledger whose
answers are worked out by hand: rollouts, held-out evaluations and training logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from dashboards.figures import configuration_curves
from dashboards.replicates import replicate_markdown, replicate_tables, write_replicate_report
from ledger import Ledger
from tests.factories import round_rows

BASE, SHARED = "2/0", "1/1"
SEEDS = (0, 1, 2)
NODES = ("n0", "n1")
# Own-completion group rewards per (configuration, seed, node): one group per round, two
# rounds. Baseline: 0.25 each round -> each node's cumulative 0.5. Shared: 0.5 + 0.5
# (seeds 0, 1) and 0.25 + 0.25 (seed 2) -> 1.0, 1.0, 0.5; node n0 of seed 0 earns nothing in
# round 0 and everything in round 1 (0 + 1 = 1.0 too): a discovery after a peer's group.
QUARTER, HALF = [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]


def own(conf: str, seed: int, node: str, round_: int) -> list[float]:
    if conf == BASE:
        return QUARTER
    if seed == 0 and node == "n0":
        return [0.0] * 4 if round_ == 0 else [1.0] * 4
    return HALF if seed < 2 else QUARTER


def swarm(conf: str, seed: int) -> str:
    return f"x-{conf.replace('/', 'x')}-s{seed}"


def eval_rows(accuracy: float) -> list[dict[str, object]]:
    return [
        {"task": task, "questions": 4, "completions": 4, "correct": 4 * accuracy,
         "accuracy": accuracy, "policy_version": 0, "eval_seed": 99}
        for task in ("basic_arithmetic", "gcd")
    ]  # fmt: skip


def training_row(group_id: str, origin: str, peer: str, informative: bool) -> dict[str, object]:
    return {"group_id": group_id, "origin": origin, "peer_node_id": peer,
            "task": "basic_arithmetic", "completions": 4,
            "reward_mean": 0.5 if informative else 0.0,
            "informative": informative, "trained": informative}  # fmt: skip


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger.open(str(tmp_path / "ledger"))
    for conf in (BASE, SHARED):
        for seed in SEEDS:
            sid = swarm(conf, seed)
            for node in NODES:
                for r in (0, 1):
                    led.publish(round_rows(node, r, [own(conf, seed, node, r)], swarm_id=sid))
                    peer = "n1" if node == "n0" else "n0"
                    rows = [
                        training_row(
                            f"{sid}.{node}.r{r}.g0",
                            "local",
                            node,
                            not (conf == SHARED and seed == 0 and node == "n0" and r == 0),
                        )
                    ]
                    if conf == SHARED:
                        rows.append(training_row(f"{sid}.{peer}.r{r}.g0", "external", peer, True))
                    led.write_training(sid, node, r, rows)
                led.write_evaluation(sid, node, 0, eval_rows(0.125))
                led.write_evaluation(sid, node, 2, eval_rows(0.25 if conf == BASE else 0.5))
    return led


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
    assert "| 1/1 | 3 | 80.000 | 153.333 |" in md  # tokens generated and trained, mean
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
    assert "samplers at the same I/J" not in md  # no sampler of our own was run
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
    tables = replicate_tables(ledger.query, replicates, baseline=BASE, rounds=2, nodes=2)
    (partial,) = tables.runs.filter(~tables.runs["complete"]).to_dicts()
    assert partial["seed"] == 3
    assert partial["cumulative_claimed_reward"] is None and partial["final_accuracy"] is None
    (gain,) = tables.gains["cumulative_claimed_reward"].to_dicts()
    assert gain["n_seeds"] == 3  # seed 3 has no baseline nor a complete run: not paired
    text = replicate_markdown(tables, baseline=BASE)
    assert "Incomplete runs, left out of the statistics: 1/1 seed 3." in text


def test_run_metrics_average_nodes_and_measure_oscillation() -> None:
    import polars as pl

    from dashboards.replicates import run_metrics

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

    from dashboards.replicates import run_metrics

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
    from dashboards.families import family_markdown, family_tables
    from dashboards.records import records_from_ledger
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
    from dashboards.replicates import run_metrics

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
    from dashboards.records import records_from_ledger
    from dashboards.replicates import tables_from_records

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
    assert "| 1/1 | 3/2 | 80.000 | 153.333 | 4.000 |" in text
    assert "| 2/0 | 3 | 80.000 | 80.000 | 4.000 |" in text
    # a baseline that was never evaluated: no gains for that metric, the rest reported
    records.node_rounds = rows.with_columns(
        pl.when(pl.col("configuration") == BASE).then(None).otherwise(pl.col("accuracy"))
        .alias("accuracy")
    )  # fmt: skip
    tables = tables_from_records(records, baseline=BASE, rounds=2, planned=planned)
    assert "final_accuracy" not in tables.gains
    assert "cumulative_claimed_reward" in tables.gains


def test_run_records_round_trip_to_the_same_statistics(ledger: Ledger, tmp_path: Path) -> None:
    """A sweep finished across machines: half its runs come back from committed records,
    the rest from this machine's ledger, and every number is what the ledger alone gives."""
    from dashboards.records import RunRecords, read_records, records_from_ledger, write_record
    from dashboards.replicates import tables_from_records

    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    heldout = {("basic_arithmetic", "q0 of n1"), ("gcd", "never generated")}
    records = records_from_ledger(ledger.query, replicates, heldout=heldout)
    assert records.heldout_seen.height == 6  # every run generated "q0 of n1"
    assert set(records.heldout_seen["question"]) == {"q0 of n1"}
    assert records.models.is_empty()  # the hand-made ledger has no manifests
    assert records.peer_groups.height == 3 * 2 * 2  # shared seeds x nodes x rounds
    root = tmp_path / "records"
    elsewhere = [swarm(SHARED, s) for s in SEEDS] + [swarm(BASE, 0)]
    for swarm_id in elsewhere:
        folder = write_record(records, swarm_id, root, code="abc", host="old-machine")
        assert sorted(p.name for p in folder.iterdir()) == [
            "discoveries.csv", "heldout_seen.csv", "models.csv", "node_rounds.csv",
            "peer_groups.csv", "record.json",
        ]  # fmt: skip
    assert not list(root.glob(".*"))  # no staging folder left behind
    here = records.only(s for s in replicates if s not in elsewhere)
    combined = RunRecords.concat([here, read_records(root, list(replicates))])
    assert combined.swarm_ids() == sorted(replicates)
    direct = tables_from_records(records, baseline=BASE, rounds=2)
    mixed = tables_from_records(combined, baseline=BASE, rounds=2)
    for metric in ("cumulative_claimed_reward", "cumulative_training_reward", "final_accuracy"):
        assert mixed.gains[metric].to_dicts() == direct.gains[metric].to_dicts()
    assert mixed.runs.sort("swarm_id").equals(direct.runs.sort("swarm_id"))
    assert mixed.mechanism.equals(direct.mechanism)
    assert mixed.discoveries.equals(direct.discoveries)


def test_a_damaged_run_record_is_an_error_naming_its_file(ledger: Ledger, tmp_path: Path) -> None:
    from dashboards.records import RecordError, read_record, records_from_ledger, write_record

    sid = swarm(SHARED, 1)
    records = records_from_ledger(ledger.query, {sid: (SHARED, 1)})
    folder = write_record(records, sid, tmp_path)
    assert read_record(folder).node_rounds.height == records.node_rounds.height
    rows = folder / "node_rounds.csv"
    good = rows.read_text()
    manifest = folder / "record.json"
    written = json.loads(manifest.read_text())
    assert written["version"] == 2 and set(written["sha256"]) == {
        p.name for p in folder.glob("*.csv")
    }
    # A copy cut short: mid-row, or at a row's end (which parses as a smaller table: only
    # the digest tells); any edit at all.
    rows.write_text(good[: len(good) // 2])
    with pytest.raises(RecordError, match=r"node_rounds\.csv: cut short"):
        read_record(folder)
    whole_rows = good[: good.index("\n", len(good) // 2) + 1]
    rows.write_text(whole_rows)
    with pytest.raises(RecordError, match=r"node_rounds\.csv: not the file record.json"):
        read_record(folder)
    rows.write_text(good.replace(sid, swarm(BASE, 1)))
    with pytest.raises(RecordError, match="SHA-256 differs"):
        read_record(folder)
    # Version 1 (the issue-32 sweep's records) has no digests: read, with the checks that
    # need none.
    manifest.write_text(json.dumps({**written, "version": 1, "sha256": None}))
    rows.write_text(good)
    assert read_record(folder).node_rounds.height == records.node_rounds.height
    rows.write_text(whole_rows)
    assert read_record(folder).node_rounds.height < records.node_rounds.height  # undetectable
    rows.write_text(good.replace("\n", "\nnot,a,row\n", 1))
    with pytest.raises(RecordError, match=r"node_rounds\.csv: row 2 has 3 fields"):
        read_record(folder)
    rows.write_text(good.replace(sid, swarm(BASE, 1)))  # another run's rows in this folder
    with pytest.raises(RecordError, match="rows of another run"):
        read_record(folder)
    rows.write_text(good)
    manifest.write_text(json.dumps({**written, "sha256": {"node_rounds.csv": "0" * 64}}))
    with pytest.raises(RecordError, match="no SHA-256 for each of its files"):
        read_record(folder)
    # a malformed digest is record.json's fault, not the CSV's
    upper = {k: v.upper() for k, v in written["sha256"].items()}
    for digests in (upper, dict.fromkeys(written["sha256"], None)):
        manifest.write_text(json.dumps({**written, "sha256": digests}))
        with pytest.raises(RecordError, match=r"record\.json: no SHA-256 for each of its files"):
            read_record(folder)
    # a version that only compares equal to 1 does not skip the digests
    for version in (True, 1.0, "2"):
        manifest.write_text(json.dumps({**written, "version": version}))
        with pytest.raises(RecordError, match="unknown record version"):
            read_record(folder)
    manifest.write_text(json.dumps(written))
    assert read_record(folder).node_rounds.height == records.node_rounds.height
    # a blanked swarm_id is not this run's row (v1: no digest to catch it)
    manifest.write_text(json.dumps({**written, "version": 1}))
    rows.write_text(good.replace(f"\n{sid},", "\n,", 1))
    with pytest.raises(RecordError, match="rows of another run"):
        read_record(folder)
    rows.write_text(good)
    (folder / "record.json").write_text('{"version": 99}')
    with pytest.raises(RecordError, match="unknown record version"):
        read_record(folder)
    (folder / "record.json").write_text("{")
    with pytest.raises(RecordError, match="not a run record"):
        read_record(folder)


def test_a_record_keeps_long_fields_and_its_own_version(ledger: Ledger, tmp_path: Path) -> None:
    from dashboards.records import read_record, records_from_ledger, write_record

    sid = swarm(SHARED, 1)
    long_question = "What is " + " + ".join(["1"] * 60_000) + "?"  # past csv's 128 KiB default
    records = records_from_ledger(ledger.query, {sid: (SHARED, 1)}, heldout={("gcd", "x")})
    records.heldout_seen = pl.DataFrame(
        {"swarm_id": [sid], "task": ["gcd"], "question": [long_question]}
    )
    # a fact named like the manifest's own keys does not replace them
    folder = write_record(records, sid, tmp_path, version=99, sha256="forged", host="h")
    meta = json.loads((folder / "record.json").read_text())
    assert meta["version"] == 2 and isinstance(meta["sha256"], dict) and meta["host"] == "h"
    assert read_record(folder).heldout_seen["question"].to_list() == [long_question]


def mini_experiment(workdir: Path) -> dict[str, Any]:
    """The experiment whose runs the ``ledger`` fixture holds (under ``workdir``)."""
    return {
        "experiment": "x", "workdir": str(workdir), "seeds": list(SEEDS),
        "swarm": {"rounds": 2, "node_count": 2, "tracking": {"enabled": False},
                  "defaults": {"model": "some/model", "evaluation": {"every": 2}}},
        "configurations": [{"local_groups": 2, "external_groups": 0},
                           {"local_groups": 1, "external_groups": 1}],
    }  # fmt: skip


def test_a_record_keeps_its_runs_wall_time_for_a_new_machine(
    ledger: Ledger, tmp_path: Path
) -> None:
    """The progress file stays on its machine; the record carries each run's wall time, so
    the plan of a sweep resumed elsewhere still says what its earlier runs took."""
    import shutil

    from dashboards.records import record_manifest, records_from_ledger
    from flows.experiments.plan import format_plan
    from flows.experiments.progress import record_progress, run_walls
    from flows.experiments.sweep import ExperimentConfig
    from flows.reports.report import record_runs

    exp = ExperimentConfig.model_validate(mini_experiment(tmp_path / "old-machine"))
    records = records_from_ledger(ledger.query, exp.replicates())
    timed, untimed = swarm(SHARED, 1), swarm(BASE, 0)
    record_progress(exp, timed, "started")  # stopped with a session, then resumed
    record_progress(exp, timed, "started")
    record_progress(exp, timed, "finished", failed=0)
    root = tmp_path / "records"
    assert sorted(record_runs(exp, root, records=records)) == sorted(exp.replicates())
    wall = record_manifest(root, timed)["wall"]
    assert isinstance(wall, dict) and wall["attempts"] == 2 and wall["interrupted"] == 1
    assert wall["seconds"] is not None and 0 <= wall["seconds"] < 60
    assert record_manifest(root, untimed)["wall"] is None  # never started on that machine

    shutil.rmtree(tmp_path / "old-machine")  # a new machine: no progress file
    assert timed not in run_walls(exp) and run_walls(exp, root)[timed] == wall
    (row,) = [line for line in format_plan(exp, root).splitlines() if timed in line]
    assert row.rstrip().endswith("0.0 min (+1 earlier)")
    # re-recorded where it was never timed (a report on the new machine): the wall is kept
    record_runs(exp, root, records=records)
    assert record_manifest(root, timed)["wall"] == wall
    # this machine's own finished time comes first; one it never saw end does not hide the
    # record's (stopped here before the record arrived from where it finished)
    manifest = root / timed / "record.json"
    meta = json.loads(manifest.read_text())
    recorded_wall = {"seconds": 1260.0, "attempts": 1, "interrupted": 0}
    manifest.write_text(json.dumps({**meta, "wall": recorded_wall}))
    record_progress(exp, timed, "started")
    assert run_walls(exp, root)[timed] == recorded_wall
    record_progress(exp, timed, "skipped", recorded=True)
    (row,) = [line for line in format_plan(exp, root).splitlines() if timed in line]
    assert row.rstrip().endswith("21.0 min")
    record_progress(exp, timed, "started")
    record_progress(exp, timed, "finished", failed=0)
    local = run_walls(exp, root)[timed]
    assert local["attempts"] == 2 and local["seconds"] < 60
    shutil.rmtree(tmp_path / "old-machine")
    # a hand-edited wall time is not believed
    bad_walls = [
        {"seconds": -5, "attempts": 1, "interrupted": 0}, {"seconds": 3}, "21 min",
        {"seconds": True, "attempts": True, "interrupted": False},
        {"seconds": float("nan"), "attempts": 1, "interrupted": 0},
        {"seconds": float("inf"), "attempts": 1, "interrupted": 0},
        {"seconds": 60, "attempts": 1, "interrupted": 5},
        {"seconds": 60, "attempts": 0, "interrupted": 0},
        {"seconds": None, "attempts": 1, "interrupted": 1},
    ]  # fmt: skip
    for bad in bad_walls:
        manifest.write_text(json.dumps({**meta, "wall": bad}))
        assert timed not in run_walls(exp, root), bad
    assert "timed runs" not in format_plan(exp, root)
    # nor is a record.json of another run put in this run's folder
    manifest.write_text(json.dumps({**meta, "wall": recorded_wall, "swarm_id": untimed}))
    assert timed not in run_walls(exp, root)


def test_report_only_reads_the_records_and_starts_no_run(ledger: Ledger, tmp_path: Path) -> None:
    """`sapo experiment --report-only` beside a sweep: the recorded runs and the runs this
    machine's ledger holds (one of them not recorded yet), with SAPO's Table 1 beside them;
    nothing trained and no record written or rewritten (the running sweep writes its own)."""
    import yaml
    from typer.testing import CliRunner

    from dashboards.records import records_from_ledger, write_record
    from flows.cli import app

    replicates = {swarm(c, s): (c, s) for c in (BASE, SHARED) for s in SEEDS}
    records = records_from_ledger(ledger.query, replicates)
    root = tmp_path / "records"
    for swarm_id in replicates:
        if swarm_id != swarm(SHARED, 2):
            write_record(records, swarm_id, root, code="abc", host="elsewhere")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    experiment = mini_experiment(tmp_path)  # its ledger: ours
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(experiment))

    def report_only(out: Path) -> str:
        result = CliRunner().invoke(
            app, ["experiment", "-c", str(path), "--records", str(root), "--report-only",
                  "--report-dir", str(out)],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        return result.output

    out = tmp_path / "report"
    output = report_only(out)
    assert not (tmp_path / "progress.json").exists() and not (tmp_path / "swarms").exists()
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    runs = pl.read_csv(out / "runs.csv")
    assert sorted(runs["swarm_id"]) == sorted(replicates)  # seed 2 of 1/1 from the ledger
    text = (out / "statistics.md").read_text()
    assert "| 4/4 | 1093.310 | +94.6% | 1/1 | 3 | 0.500 | 0.833 | +66.7% |" in text
    assert "| 1/1 vs 2/0 | 3 | +94.6% | 0.500 | 0.833 | 0.333 | +66.7% |" in text  # the shape
    assert "## Paired seeds" in output and (out / "curves.png").is_file()

    # On a machine that never ran the sweep: the records alone, and no empty ledger or
    # MLflow store made where the working directory would be.
    experiment["workdir"] = str(tmp_path / "never-ran")
    path.write_text(yaml.safe_dump(experiment))
    elsewhere = tmp_path / "elsewhere"
    output = report_only(elsewhere)
    assert not (tmp_path / "never-ran").exists()
    runs = pl.read_csv(elsewhere / "runs.csv")
    assert sorted(runs["swarm_id"]) == sorted(s for s in replicates if s != swarm(SHARED, 2))
    assert "Planned runs with no rounds here: 1/1 seed 2." in output
    # another experiment's file against these records: says where it looked
    experiment["experiment"] = "y"
    path.write_text(yaml.safe_dump(experiment))
    result = CliRunner().invoke(
        app, ["experiment", "-c", str(path), "--records", str(root), "--report-only"]
    )
    assert result.exit_code == 2
    assert f"none of y's 6 planned runs has rounds in the records in {root}" in result.output
