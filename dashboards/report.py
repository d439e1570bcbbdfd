"""The report of a ledger: its SQL (dashboards/sql/sweep_*.sql and swarm_nodes.sql) turned
into summary tables, figures, one self-contained HTML page and a JSON file of the numbers.

Any ledger has a report. Every swarm gets its per-node claimed_reward per round, its
cumulative_claimed_reward, its share of zero-variance groups and who sampled whom. Swarms
whose node manifests name an experiment (`sapo experiment`) are also compared as a sweep:
one row per configuration, with the gain over the experiment's J = 0 baseline. A swarm's
configuration (I, J, policy, experiment) is read from its nodes' manifests, never from
its id; swarms without manifests (older ledgers) are reported with those unknown.

Every number comes from the ledger. MLflow, when given, only cross-checks: each node's
`own_reward` per round must equal the ledger's `claimed_reward` (its mean over what the
node published), and its `cumulative_training_reward` (which counts peers' groups too) is
shown beside the ledger's. The names are docs/running.md's "Rewards, by name".
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
from ledger.schema import sharing_label

Query = Callable[[str], pl.DataFrame]


@dataclass
class ReportTables:
    rewards: pl.DataFrame  # sweep_reward_per_round.sql: per swarm, node and round
    summary: pl.DataFrame  # sweep_summary.sql: one row per swarm (configuration)
    nodes: pl.DataFrame  # swarm_nodes.sql: one row per node
    zero_variance: pl.DataFrame  # sweep_zero_variance.sql: per swarm and round
    peers: pl.DataFrame  # sweep_sampled_peers.sql: groups drawn, receiver x peer

    @property
    def experiments(self) -> list[str]:
        return sorted(e for e in self.summary["experiment"].unique().to_list() if e is not None)


@dataclass
class CrossCheck:
    matched: int = 0
    max_abs_diff: float = 0.0
    missing_in_mlflow: int = 0
    cumulative_training_reward: dict[str, float] = field(default_factory=dict)  # swarm -> sum

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
    """One row per swarm (sweep_summary.sql), plus MLflow's cumulative_training_reward
    when checked."""
    check: CrossCheck | None
    nodes: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Section:
    """One summary table: a sweep (one experiment's swarms) or the swarms outside any."""

    title: str
    rows: list[dict[str, Any]]
    sweep: bool


def summarise(rewards: pl.DataFrame) -> pl.DataFrame:
    """sweep_summary.sql over a frame of sweep_reward_per_round.sql."""
    con = duckdb.connect()
    try:
        con.register("sweep_rewards", rewards.to_arrow())
        return con.execute(dashboards.query("sweep_summary")).pl()
    finally:
        con.close()


def report_tables(query: Query, experiment: str | None = None) -> ReportTables:
    """The report's tables from a ledger query function (e.g. `Ledger.query`): every swarm,
    or only those whose manifests name ``experiment``."""
    rewards = query(dashboards.query("sweep_reward_per_round"))
    if experiment is not None:
        rewards = rewards.filter(pl.col("experiment") == experiment)
        if rewards.is_empty():
            raise ValueError(f"no swarm in this ledger belongs to experiment {experiment!r}")
    if rewards.is_empty():
        raise ValueError("no rollouts in this ledger: nothing to report")
    keep = pl.col("swarm_id").is_in(rewards["swarm_id"].unique().to_list())
    return ReportTables(
        rewards=rewards,
        summary=summarise(rewards),
        nodes=query(dashboards.query("swarm_nodes")).filter(keep),
        zero_variance=query(dashboards.query("sweep_zero_variance")).filter(keep),
        peers=query(dashboards.query("sweep_sampled_peers")).filter(keep),
    )


def cross_check(rewards: pl.DataFrame, tracked: pl.DataFrame) -> CrossCheck:
    """Compare the ledger's per node-round claimed_reward with MLflow's own_reward.

    `tracked` has columns swarm_id, node_id, node_round, own_reward, training_reward.
    """
    keys = ["swarm_id", "node_id", "node_round"]
    joined = rewards.select(*keys, pl.col("claimed_reward").alias("ledger")).join(
        tracked.select(*keys, "own_reward"), on=keys, how="left"
    )
    found = joined.filter(pl.col("own_reward").is_not_null())
    diff = (found["ledger"] - found["own_reward"]).abs().max()
    training = (
        tracked.filter(pl.col("swarm_id").is_in(rewards["swarm_id"].unique().to_list()))
        .group_by("swarm_id")
        .agg(pl.col("training_reward").sum())
    )
    return CrossCheck(
        matched=found.height,
        max_abs_diff=float(diff) if isinstance(diff, int | float) else 0.0,
        missing_in_mlflow=joined.height - found.height,
        cumulative_training_reward=dict(training.select("swarm_id", "training_reward").rows()),
    )


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def sharing(row: dict[str, Any]) -> str:
    """`I/J`, or `unknown` where no manifest says (or the swarm's nodes disagree)."""
    i, j = row.get("local_groups"), row.get("external_groups")
    return "unknown" if i is None or j is None else sharing_label(i, j)


def summary_rows(tables: ReportTables, check: CrossCheck | None) -> list[dict[str, Any]]:
    """One row per swarm in sweep_summary.sql's order, with MLflow's reward when checked."""
    rows = []
    for row in tables.summary.to_dicts():
        if check is not None:
            tracked = check.cumulative_training_reward.get(row["swarm_id"])
            row["cumulative_training_reward_mlflow"] = tracked
        rows.append(row)
    return rows


def sections(rows: list[dict[str, Any]]) -> list[Section]:
    """A sweep table per experiment, then one table of the swarms outside any experiment."""
    experiments = sorted({r["experiment"] for r in rows if r["experiment"] is not None})
    out = [
        Section(f"Sweep {name}", [r for r in rows if r["experiment"] == name], sweep=True)
        for name in experiments
    ]
    rest = [r for r in rows if r["experiment"] is None]
    if rest:
        title = "Swarms outside any experiment" if experiments else "Swarms"
        out.append(Section(title, rest, sweep=False))
    return out


def table_cells(rows: list[dict[str, Any]], *, sweep: bool) -> tuple[list[str], list[list[str]]]:
    """A summary table's header and formatted cells (markdown and HTML share them).

    A sweep table has one row per configuration and the gain over J = 0; a swarm table
    names each swarm instead."""
    with_mlflow = any("cumulative_training_reward_mlflow" in r for r in rows)
    first = ["configuration (I/J)"] if sweep else ["swarm", "I/J"]
    head = [*first, "policy", "nodes x rounds", "cumulative claimed reward", "± s.e."]
    head += ["gain vs J=0"] if sweep else []
    head += ["first-quarter mean", "last-quarter mean"]
    if with_mlflow:
        head.append("cumulative training reward (MLflow)")
    body = []
    for r in rows:
        no_peers = r["external_groups"] == 0  # no peers, no policy
        cells = [sharing(r)] if sweep else [r["swarm_id"], sharing(r)]
        cells += [
            "-" if no_peers else _fmt(r["policy"], ""),
            f"{r['nodes']} x {r['rounds']}",
            _fmt(r["cumulative_claimed_reward"], ".2f"),
            _fmt(r["cumulative_claimed_reward_se"], ".2f"),
        ]
        if sweep:
            cells.append("baseline" if no_peers else _fmt(r["gain_over_baseline"], "+.1%"))
        cells += [_fmt(r["first_quarter_mean"], ".3f"), _fmt(r["last_quarter_mean"], ".3f")]
        if with_mlflow:
            cells.append(_fmt(r.get("cumulative_training_reward_mlflow"), ".2f"))
        body.append([str(c) for c in cells])
    return head, body


def node_cells(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """One swarm's per-node table (swarm_nodes.sql rows)."""
    head = ["node", "I/J", "policy", "model", "rounds", "cumulative claimed reward",
            "mean claimed reward", "zero-variance groups", "groups drawn (peers)"]  # fmt: skip
    body = [
        [
            r["node_id"],
            sharing(r) + _revised(r),
            _fmt(r["policy"], ""),
            _fmt(r["model_id"], "")
            + (f" + {r['adapter']}" if r.get("adapter") else "")
            + (f" ({r['prompt_format']})" if r.get("prompt_format") else ""),
            str(r["rounds"]),
            _fmt(r["cumulative_claimed_reward"], ".2f"),
            _fmt(r["mean_claimed_reward"], ".3f"),
            _fmt(r["zero_variance_fraction"], ".0%"),
            f"{r['groups_drawn']} ({r['peers_drawn_from']})",
        ]
        for r in rows
    ]
    return head, body


def _revised(row: dict[str, Any]) -> str:
    """A mark on a node resumed with another configuration (its first one is shown)."""
    revisions = row.get("manifest_revisions") or 1
    return f" (first of {revisions} configurations)" if revisions > 1 else ""


def markdown_table(rows: list[dict[str, Any]], *, sweep: bool) -> str:
    """A summary table in markdown."""
    head, body = table_cells(rows, sweep=sweep)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def report_markdown(rows: list[dict[str, Any]]) -> str:
    """Every summary table, each under its title (the Prefect artifact, summary.md, CLI)."""
    return "\n\n".join(
        f"**{s.title}**\n\n{markdown_table(s.rows, sweep=s.sweep)}" for s in sections(rows)
    )


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _html_table(head: list[str], body: list[list[str]]) -> str:
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
        f"MLflow cross-check (own_reward vs the ledger's claimed_reward): {verdict}: "
        f"{check.matched} node-rounds matched, largest "
        f"difference {check.max_abs_diff:.2e}, {check.missing_in_mlflow} node-rounds missing "
        "in MLflow."
    )


def _node_sections(tables: ReportTables) -> str:
    parts = []
    for swarm in tables.summary["swarm_id"].to_list():
        rows = tables.nodes.filter(pl.col("swarm_id") == swarm).to_dicts()
        parts.append(f"<h3>{html.escape(swarm)}</h3>{_html_table(*node_cells(rows))}")
    return "\n".join(parts)


def render_report(
    tables: ReportTables, out_dir: Path, *, check: CrossCheck | None, source: str
) -> Report:
    """Write the figures, report.html (images inlined), report.json and summary.md of
    ``tables`` under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = tables.summary
    made = [
        figures.reward_panels(tables.rewards, summary, out_dir / "reward_per_round.png"),
        figures.cumulative_curves(tables.rewards, summary, out_dir / "cumulative.png"),
        figures.zero_variance_lines(tables.zero_variance, summary, out_dir / "zero_variance.png"),
    ]
    peers = figures.peer_matrices(tables.peers, summary, out_dir / "sampled_peers.png")
    if peers is not None:
        made.append(peers)
    rows = summary_rows(tables, check)
    markdown = report_markdown(rows)
    (out_dir / "summary.md").write_text(markdown + "\n\n" + _check_text(check) + "\n")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    experiments = tables.experiments
    swarms = summary["swarm_id"].to_list()
    what = ", ".join(experiments) if experiments else f"{len(swarms)} swarm(s)"
    tables_html = "\n".join(
        f"<h2>{html.escape(s.title)}</h2>{_html_table(*table_cells(s.rows, sweep=s.sweep))}"
        for s in sections(rows)
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>SAPO report: {html.escape(what)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
img{{max-width:100%;margin:1em 0}}code{{background:#f4f4f4}}</style></head><body>
<h1>SAPO report: {html.escape(what)}</h1>
<p>Ledger <code>{html.escape(source)}</code>, written {stamp}. The claimed reward of a node
in a round is the mean reward its published completions claim (its own completions, scored
by its verifier: for an honest node its <code>own_reward</code>); the cumulative claimed
reward sums every node's claimed reward over every round; its ± s.e. is the standard
error of that sum with every node-round taken as independent (they are not quite: nodes
learn from each other; <code>sapo experiment</code>'s statistics pair seeds instead). I
(local groups), J
(external groups), the sampling policy and the experiment come from each node's manifest
("unknown" where a swarm's nodes wrote none).</p>
{tables_html}
<p>{html.escape(_check_text(check))}</p>
{"".join(_image(p) for p in made)}
<h2>Nodes</h2>
{_node_sections(tables)}
<p>Queries: <code>dashboards/sql/sweep_*.sql</code> and
<code>dashboards/sql/swarm_nodes.sql</code>.</p>
</body></html>
"""
    page_path = out_dir / "report.html"
    page_path.write_text(page)
    json_path = out_dir / "report.json"
    nodes = tables.nodes.to_dicts()
    payload = {
        "source": source,
        "experiments": experiments,
        "summary": rows,
        "nodes": nodes,
        "cross_check": None
        if check is None
        else {**check.__dict__, "consistent": check.consistent},
        "figures": [p.name for p in made],
    }
    json_path.write_text(json.dumps(payload, indent=2, default=str))
    return Report(page_path, json_path, markdown, [p.name for p in made], rows, check, nodes)
