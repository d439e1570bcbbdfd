"""`sapo report` on hand-made ledgers: any swarm has a report, a sweep is recognised by its
nodes' manifests (never by its swarm id), and the numbers equal plain DuckDB's."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest

import dashboards
from flows.reports import report as reporting
from flows.reports.report import report_ledger
from ledger import Ledger, NodeManifest, parse_policy
from ledger.synthetic import synthetic_round
from tests.conftest import LedgerSite

NODES = ("node-0", "node-1", "node-2")
ROUNDS = 4


def run_swarm(
    led: Ledger,
    swarm_id: str,
    *,
    local: int,
    external: int,
    experiment: str | None,
    manifests: bool = True,
    policy: str = "paper",
) -> list[pa.Table]:
    """What a swarm leaves in the ledger: each node's rounds, its draws and its manifest."""
    if manifests:
        for seed, node in enumerate(NODES):
            led.write_manifest(
                NodeManifest.for_node(
                    swarm_id=swarm_id, node_id=node, experiment=experiment,
                    local_groups=local, external_groups=external,
                    policy=parse_policy(policy), model_id="tiny/model", seed=seed,
                )
            )  # fmt: skip
    published = []
    for node_round in range(ROUNDS):
        for k, node in enumerate(NODES):
            table = synthetic_round(
                swarm_id, node, node_round, n_groups=4, group_size=4,
                skill=0.2 + 0.2 * k + 0.05 * external, seed=len(swarm_id),
            )  # fmt: skip
            led.publish(table)
            published.append(table)
        for node in NODES if external else ():
            drawn = led.sample(node, external, policy, seed=node_round, swarm_id=swarm_id)
            led.write_sample(swarm_id, node, node_round, drawn,
                             policy=parse_policy(policy).kind, seed=node_round)  # fmt: skip
    return published


def cumulative(tables: list[pa.Table]) -> dict[str, float]:
    """Per swarm: the sum over node-rounds of the mean reward, in plain Python."""
    rewards: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for table in tables:
        for row in table.select(["swarm_id", "node_id", "node_round", "reward"]).to_pylist():
            rewards[(row["swarm_id"], row["node_id"], row["node_round"])].append(row["reward"])
    totals: dict[str, float] = defaultdict(float)
    for (swarm, _, _), values in rewards.items():
        totals[swarm] += sum(values) / len(values)
    return dict(totals)


def plain_duckdb(ledger: str) -> duckdb.DuckDBPyConnection:
    """A DuckDB session with the relations defined as the SQL files' headers say."""
    con = duckdb.connect()
    header = dashboards.query("sweep_reward_per_round")
    views = [
        header[header.index("CREATE VIEW rollouts") : header.index("union_by_name = true);") + 22],
        header[header.index("CREATE VIEW manifests") : header.index("= 1;") + 4],
    ]
    groups = dashboards.query("zero_variance_groups")
    views.append(groups[groups.index("CREATE VIEW groups") : groups.index("group_id;") + 9])
    samples = dashboards.query("most_sampled_peers")
    views.append(samples[samples.index("CREATE VIEW samples") : samples.index("true);") + 6])
    nodes = dashboards.query("swarm_nodes")
    start = nodes.index("CREATE VIEW manifest_revisions")
    views.append(nodes[start : nodes.index("}) m;", start) + 5])
    for view in views:
        con.execute(view.replace("--", "").replace("<ledger>", ledger))
    return con


def test_report_of_a_plain_swarm(local_site: LedgerSite, tmp_path: Path) -> None:
    with local_site.open() as led:
        published = run_swarm(led, "my-swarm", local=2, external=2, experiment=None)
    report = report_ledger(local_site.url, tmp_path / "out")

    page = report.html.read_text()
    assert report.figures == [
        "reward_per_round.png", "cumulative.png", "zero_variance.png", "sampled_peers.png"
    ]  # fmt: skip
    assert page.count("data:image/png;base64,") == len(report.figures)
    for name in report.figures:
        assert (tmp_path / "out" / name).stat().st_size > 1000
    assert "<h2>Swarms</h2>" in page and "gain vs J=0" not in page  # no sweep here
    assert all(f"<td>{node}</td>" in page for node in NODES)  # the per-node table
    (row,) = report.summary
    assert (row["swarm_id"], row["experiment"]) == ("my-swarm", None)
    assert (row["local_groups"], row["external_groups"], row["policy"]) == (2, 2, "paper")
    assert (row["nodes"], row["rounds"]) == (3, ROUNDS)
    assert row["cumulative_claimed_reward"] == pytest.approx(cumulative(published)["my-swarm"])
    assert "| my-swarm | 2/2 | paper | 3 x 4 |" in report.markdown
    nodes = {n["node_id"]: n for n in report.nodes}
    assert set(nodes) == set(NODES)
    assert all(n["groups_drawn"] == 2 * ROUNDS for n in nodes.values())
    saved = json.loads(report.json.read_text())
    total = row["cumulative_claimed_reward"]
    assert saved["summary"][0]["cumulative_claimed_reward"] == pytest.approx(total)
    assert saved["experiments"] == [] and report.check is None


def test_sweep_tables_come_from_manifests_not_swarm_ids(
    local_site: LedgerSite, tmp_path: Path
) -> None:
    with local_site.open() as led:
        published = run_swarm(led, "alpha", local=2, external=0, experiment="exp")
        published += run_swarm(led, "beta", local=1, external=1, experiment="exp")
        published += run_swarm(
            led, "gamma", local=1, external=1, experiment="exp", policy="variance_weighted"
        )
        published += run_swarm(led, "solo", local=2, external=0, experiment=None)
        published += run_swarm(led, "old-1x1", local=1, external=1, experiment=None,
                               manifests=False)  # fmt: skip
    expected = cumulative(published)
    report = report_ledger(local_site.url, tmp_path / "out")

    rows = {r["swarm_id"]: r for r in report.summary}
    assert set(rows) == set(expected)
    for swarm, total in expected.items():
        assert rows[swarm]["cumulative_claimed_reward"] == pytest.approx(total, abs=1e-12)
    assert rows["alpha"]["gain_over_baseline"] == pytest.approx(0.0)
    assert rows["beta"]["gain_over_baseline"] == pytest.approx(
        expected["beta"] / expected["alpha"] - 1
    )
    assert rows["gamma"]["policy"] == "variance_weighted"
    # Outside the experiment: no gain; no manifest: configuration unknown, still reported.
    assert rows["solo"]["gain_over_baseline"] is None and rows["solo"]["local_groups"] == 2
    old = rows["old-1x1"]  # the id looks like a configuration: nothing reads it
    assert (old["experiment"], old["local_groups"], old["external_groups"]) == (None, None, None)
    assert old["nodes"] == 3

    markdown = report.markdown
    assert markdown.index("**Sweep exp**") < markdown.index("**Swarms outside any experiment**")
    assert "| 2/0 | - | 3 x 4 |" in markdown and "baseline" in markdown
    gain = expected["beta"] / expected["alpha"] - 1
    assert f"{gain:+.1%}" in markdown
    assert "| old-1x1 | unknown |" in markdown
    page = report.html.read_text()
    assert "<h2>Sweep exp</h2>" in page and "<h3>old-1x1</h3>" in page

    # --experiment keeps that experiment's swarms only; an unknown one is a clear error.
    only = report_ledger(local_site.url, tmp_path / "exp", experiment="exp")
    assert {r["swarm_id"] for r in only.summary} == {"alpha", "beta", "gamma"}
    with pytest.raises(ValueError, match="no swarm in this ledger belongs to experiment 'nope'"):
        report_ledger(local_site.url, tmp_path / "nope", experiment="nope")


def test_report_numbers_equal_plain_duckdb_over_the_files(
    local_site: LedgerSite, tmp_path: Path
) -> None:
    with local_site.open() as led:
        run_swarm(led, "alpha", local=2, external=0, experiment="exp")
        run_swarm(led, "beta", local=1, external=1, experiment="exp")
        run_swarm(led, "old", local=1, external=1, experiment=None, manifests=False)
    report = report_ledger(local_site.url, tmp_path / "out")

    # Straight from the Parquet files, no project code.
    direct = dict(
        duckdb.sql(
            f"""SELECT swarm_id, sum(r) FROM (
                  SELECT swarm_id, node_id, node_round, avg(reward) AS r
                  FROM read_parquet('{local_site.url}/**/*.parquet', hive_partitioning = true)
                  GROUP BY ALL)
                GROUP BY swarm_id"""
        ).fetchall()
    )
    got = {r["swarm_id"]: r["cumulative_claimed_reward"] for r in report.summary}
    assert got == pytest.approx(direct, abs=1e-12)

    # The shipped SQL files, pasted into plain DuckDB as their headers say, agree with the
    # report table by table.
    con = plain_duckdb(local_site.url)
    con.execute(f"CREATE TABLE sweep_rewards AS {dashboards.query('sweep_reward_per_round')}")
    summary = con.execute(dashboards.query("sweep_summary")).pl()
    keys = ["swarm_id", "experiment", "local_groups", "external_groups", "policy", "nodes"]
    numbers = ["cumulative_claimed_reward", "gain_over_baseline", "last_quarter_mean"]
    assert summary.select(*keys).rows() == [tuple(r[k] for k in keys) for r in report.summary]
    for name in numbers:
        assert summary[name].to_list() == pytest.approx([r[name] for r in report.summary])
    nodes = con.execute(dashboards.query("swarm_nodes")).pl()
    theirs = pl.DataFrame(report.nodes).select(nodes.columns)
    inexact = ("cumulative_claimed_reward", "mean_claimed_reward", "zero_variance_fraction")
    assert nodes.drop(*inexact).equals(theirs.drop(*inexact))
    assert nodes["cumulative_claimed_reward"].to_list() == pytest.approx(
        theirs["cumulative_claimed_reward"].to_list()
    )


def test_an_empty_ledger_is_a_one_line_error(local_site: LedgerSite, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no rollouts in this ledger") as caught:
        report_ledger(local_site.url, tmp_path / "out")
    assert "\n" not in str(caught.value) and local_site.url in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_report_is_cross_checked_against_mlflow(
    local_site: LedgerSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with local_site.open() as led:
        run_swarm(led, "alpha", local=2, external=0, experiment="exp")
        truth = led.query(dashboards.query("reward_per_node_round"))
    tracked = truth.select(
        "swarm_id", "node_id", "node_round",
        pl.col("claimed_reward").alias("own_reward"),
        pl.col("claimed_reward").alias("training_reward"),
    )  # fmt: skip
    asked: list[Any] = []

    def fake_metrics(uri: str, experiment: str | None = None) -> pl.DataFrame:
        asked.append((uri, experiment))
        return tracked

    monkeypatch.setattr(reporting, "tracked_metrics", fake_metrics)
    store = tmp_path / "mlflow.db"
    store.touch()  # a store must exist to be read (flows.tracking.existing_store)
    uri = f"sqlite:///{store}"
    report = report_ledger(local_site.url, tmp_path / "out", tracking_uri=uri, experiment="exp")
    assert asked == [(uri, "exp")]
    assert report.check is not None and report.check.consistent
    assert report.check.matched == len(NODES) * ROUNDS
    assert "cumulative training reward (MLflow)" in report.markdown


def test_every_listed_dashboard_runs_over_a_ledger(local_site: LedgerSite, tmp_path: Path) -> None:
    """Issue 47: `sapo ledger query --dashboard sweep_summary` failed ("Table with name
    sweep_rewards does not exist"): it reads another query's result, which only the report
    provided. Every name `--dashboard` lists runs from the command line, and the summary a
    user gets equals the report's."""
    from typer.testing import CliRunner

    from flows.cli import app

    with local_site.open() as led:
        run_swarm(led, "base", local=2, external=0, experiment="exp")
        run_swarm(led, "shared", local=1, external=1, experiment="exp")
        expected = reporting.report_tables(led.query).summary
        # Sums of integers are integers (DuckDB's 128-bit sum printed as decimal[38,0]).
        for name in dashboards.names():
            frame = led.query(dashboards.runnable(name))
            assert not [c for c, t in frame.schema.items() if t == pl.Decimal], name
    runner = CliRunner()
    # These read node logs (held-out scores, training sets) that this ledger has none of.
    from_node_logs = {
        "heldout_accuracy",
        "training_compute",
        "informative_groups",
        "peer_drift",
        "drift_by_lag",
    }
    for name in dashboards.names():
        out = runner.invoke(
            app, ["ledger", "query", local_site.url, "--dashboard", name, "-f", "json"]
        )
        assert out.exit_code == 0, (name, out.output)
        assert bool(json.loads(out.output)) != (name in from_node_logs), name
    out = runner.invoke(
        app, ["ledger", "query", local_site.url, "--dashboard", "sweep_summary", "-f", "json"]
    )
    assert pl.DataFrame(json.loads(out.output)).equals(expected)


def test_a_users_sums_of_integers_are_integers(local_site: LedgerSite) -> None:
    """Issue 47, run as a user runs it: `sapo ledger query URL "SELECT node_id,
    sum(completion_tokens) ..."` printed the tokens as decimal[38,0] (DuckDB's 128-bit sum);
    the shipped dashboards cast theirs, a user's own SQL did not."""
    with local_site.open() as led:
        run_swarm(led, "base", local=2, external=0, experiment="exp")
        rows = led.query("SELECT completion_tokens FROM rollouts")["completion_tokens"]
        frame = led.query(
            "SELECT sum(completion_tokens) AS tokens, count(*) AS n, avg(reward) AS mean,"
            " 2::HUGEINT << 100 AS big, sum(reward)::DECIMAL(9, 2) AS cents,"
            " count(*)::DECIMAL(18, 0) AS asked FROM rollouts"
        )
    assert frame.schema["tokens"] == pl.Int64 and frame["tokens"][0] == rows.sum()
    assert frame.schema["n"] == pl.Int64 and frame.schema["mean"] == pl.Float64
    assert frame.schema["cents"] == pl.Decimal(9, 2)  # not whole: kept
    assert frame.schema["big"] == pl.Decimal(38, 0)  # beyond 64 bits: kept
    assert frame.schema["asked"] == pl.Decimal(18, 0)  # the SQL's own type: kept
