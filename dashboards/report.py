"""The sweep report: the ledger's SQL (dashboards/sql/sweep_*.sql) turned into a summary
table, figures, one self-contained HTML page and a JSON file of the numbers.

Every number comes from the ledger. MLflow, when given, only cross-checks: each node's
`generated_reward_mean` per round must equal the ledger's mean over what it published,
and its training-set reward (the paper's measure, which counts peers' groups too) is shown
beside the ledger's.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

import dashboards
from dashboards import figures

Query = Callable[[str], pl.DataFrame]


@dataclass
class SweepTables:
    rewards: pl.DataFrame  # sweep_reward_per_round.sql
    summary: pl.DataFrame  # sweep_summary.sql
    zero_variance: pl.DataFrame  # sweep_zero_variance.sql
    peers: pl.DataFrame  # sweep_sampled_peers.sql


@dataclass
class CrossCheck:
    matched: int = 0
    max_abs_diff: float = 0.0
    missing_in_mlflow: int = 0
    training_set_reward: dict[str, float] = field(default_factory=dict)  # swarm -> sum

    @property
    def consistent(self) -> bool:
        return self.matched > 0 and self.max_abs_diff <= 1e-9 and self.missing_in_mlflow == 0


@dataclass
class Report:
    html: Path
    json: Path
    markdown: str
    figures: list[str]
    summary: list[dict[str, Any]]
    check: CrossCheck | None


def summarise(rewards: pl.DataFrame) -> pl.DataFrame:
    """sweep_summary.sql over a frame of sweep_reward_per_round.sql."""
    con = duckdb.connect()
    try:
        con.register("sweep_rewards", rewards.to_arrow())
        return con.execute(dashboards.query("sweep_summary")).pl()
    finally:
        con.close()


def sweep_tables(query: Query, experiment: str | None = None) -> SweepTables:
    """The sweep's tables from a ledger query function (e.g. `Ledger.query`)."""
    rewards = query(dashboards.query("sweep_reward_per_round"))
    if experiment is not None:
        rewards = rewards.filter(pl.col("experiment") == experiment)
    if rewards.is_empty():
        raise ValueError(
            "no sweep in this ledger: expected swarms named <experiment>-<I>x<J>[-<policy>]"
            + (f" for experiment {experiment!r}" if experiment else "")
        )
    swarms = rewards["swarm_id"].unique().to_list()
    keep = pl.col("swarm_id").is_in(swarms)
    return SweepTables(
        rewards=rewards,
        summary=summarise(rewards),
        zero_variance=query(dashboards.query("sweep_zero_variance")).filter(keep),
        peers=query(dashboards.query("sweep_sampled_peers")).filter(keep),
    )


def cross_check(rewards: pl.DataFrame, tracked: pl.DataFrame) -> CrossCheck:
    """Compare the ledger's per node-round reward with MLflow's metrics.

    `tracked` has columns swarm_id, node_id, node_round, generated_reward_mean, reward_mean.
    """
    keys = ["swarm_id", "node_id", "node_round"]
    joined = rewards.select(*keys, pl.col("reward_mean").alias("ledger")).join(
        tracked.select(*keys, "generated_reward_mean"), on=keys, how="left"
    )
    found = joined.filter(pl.col("generated_reward_mean").is_not_null())
    diff = (found["ledger"] - found["generated_reward_mean"]).abs().max()
    training = (
        tracked.filter(pl.col("swarm_id").is_in(rewards["swarm_id"].unique().to_list()))
        .group_by("swarm_id")
        .agg(pl.col("reward_mean").sum())
    )
    return CrossCheck(
        matched=found.height,
        max_abs_diff=float(diff) if isinstance(diff, int | float) else 0.0,
        missing_in_mlflow=joined.height - found.height,
        training_set_reward=dict(training.select("swarm_id", "reward_mean").rows()),
    )


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def summary_rows(tables: SweepTables, check: CrossCheck | None) -> list[dict[str, Any]]:
    rows = []
    for row in tables.summary.sort("external_groups", "policy").to_dicts():
        if check is not None:
            row["training_set_reward_mlflow"] = check.training_set_reward.get(row["swarm_id"])
        rows.append(row)
    return rows


def table_cells(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The summary's header and formatted cells, shared by the markdown and HTML tables."""
    with_mlflow = any("training_set_reward_mlflow" in r for r in rows)
    head = ["configuration (I/J)", "policy", "nodes x rounds", "cumulative reward", "± s.e.",
            "gain vs J=0", "first-quarter mean", "last-quarter mean"]  # fmt: skip
    if with_mlflow:
        head.append("training-set reward (MLflow)")
    body = []
    for r in rows:
        gain = "baseline" if r["external_groups"] == 0 else _fmt(r["gain_over_baseline"], "+.1%")
        cells = [
            f"{r['local_groups']}/{r['external_groups']}",
            r["policy"] if r["external_groups"] else "-",  # no peers, no policy
            f"{r['nodes']} x {r['rounds']}",
            _fmt(r["cumulative_reward"], ".2f"),
            _fmt(r["cumulative_reward_se"], ".2f"),
            gain,
            _fmt(r["first_quarter_mean"], ".3f"),
            _fmt(r["last_quarter_mean"], ".3f"),
        ]
        if with_mlflow:
            cells.append(_fmt(r.get("training_set_reward_mlflow"), ".2f"))
        body.append([str(c) for c in cells])
    return head, body


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The summary as a markdown table (the Prefect artifact and the closing note)."""
    head, body = table_cells(rows)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _html_table(rows: list[dict[str, Any]]) -> str:
    head, body = table_cells(rows)
    top = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body
    )
    return f"<table><tr>{top}</tr>{cells}</table>"


def _check_text(check: CrossCheck | None) -> str:
    if check is None:
        return "MLflow cross-check: not run (no tracking URI given)."
    verdict = "consistent" if check.consistent else "INCONSISTENT"
    return (
        f"MLflow cross-check: {verdict}: {check.matched} node-rounds matched, largest "
        f"difference {check.max_abs_diff:.2e}, {check.missing_in_mlflow} node-rounds missing "
        "in MLflow."
    )


def write_report(
    tables: SweepTables, out_dir: Path, *, check: CrossCheck | None, source: str
) -> Report:
    """Figures, report.html (images inlined), report.json and summary.md under out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    made = [
        figures.reward_panels(tables.rewards, tables.summary, out_dir / "reward_per_round.png"),
        figures.cumulative_curves(tables.rewards, tables.summary, out_dir / "cumulative.png"),
        figures.zero_variance_lines(
            tables.zero_variance, tables.summary, out_dir / "zero_variance.png"
        ),
    ]
    peers = figures.peer_matrices(tables.peers, tables.summary, out_dir / "sampled_peers.png")
    if peers is not None:
        made.append(peers)
    rows = summary_rows(tables, check)
    markdown = markdown_table(rows)
    (out_dir / "summary.md").write_text(markdown + "\n\n" + _check_text(check) + "\n")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    experiments = ", ".join(sorted(tables.rewards["experiment"].unique().to_list()))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>SAPO sweep {html.escape(experiments)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
img{{max-width:100%;margin:1em 0}}code{{background:#f4f4f4}}</style></head><body>
<h1>SAPO sharing sweep: {html.escape(experiments)}</h1>
<p>Ledger <code>{html.escape(source)}</code>, written {stamp}. Rewards are each node's own
completions (what it generated and published each round, scored by its verifier); the
cumulative reward sums every node's mean reward over every round.</p>
{_html_table(rows)}
<p>{html.escape(_check_text(check))}</p>
{"".join(_image(p) for p in made)}
<p>Queries: <code>dashboards/sql/sweep_*.sql</code>.</p>
</body></html>
"""
    page_path = out_dir / "report.html"
    page_path.write_text(page)
    json_path = out_dir / "report.json"
    payload = {
        "source": source,
        "summary": rows,
        "cross_check": None
        if check is None
        else {**check.__dict__, "consistent": check.consistent},
        "figures": [p.name for p in made],
    }
    json_path.write_text(json.dumps(payload, indent=2, default=str))
    return Report(page_path, json_path, markdown, [p.name for p in made], rows, check)
