"""A sweep's plan as rows and as a table: what each run is, whether it is done, and how
long it took on this machine (for `sapo experiment --dry-run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows.experiments.progress import run_walls, wall_label
from flows.experiments.sweep import ExperimentConfig
from flows.node.lifecycle import is_complete
from sapo_core.config import BUNDLED_MODEL

SECONDS_PER_ROLLOUT_TOKEN = {BUNDLED_MODEL: 0.0195}
"""Measured wall seconds a swarm spends per rollout and token of its max_new_tokens (generation
and the update), by model, on an idle 2-core CPU machine: the paper-table sweep's 40 runs
(3 nodes x 12 rounds x 4 groups of 8 completions of at most 48 tokens) took about 12 h, 18
min a run (docs/paper-table-cpu.md). A fresh sweep's --dry-run estimates from it; a timed
run replaces it."""


def estimated_hours(rows: list[dict[str, Any]]) -> float | None:
    """Hours the runs ``rows`` would take from SECONDS_PER_ROLLOUT_TOKEN; None when a run's
    model was never measured."""
    total = 0.0
    for row in rows:
        rates = [SECONDS_PER_ROLLOUT_TOKEN.get(m) for m in row["models"].split(",")]
        if any(rate is None for rate in rates):
            return None
        total += row["rollouts"] * row["max_new_tokens"] * max(r for r in rates if r)
    return total / 3600


def plan(exp: ExperimentConfig, records: Path | None = None) -> list[dict[str, Any]]:
    """One row per configuration: what would run (for --dry-run and the report); a run
    with a record in ``records`` counts as done."""
    from flows.experiments.records import record_covers

    rows = []
    for conf, seed in exp.runs():
        swarm = exp.swarm_config(conf, seed)
        specs = swarm.nodes
        node = specs[0].node
        tasks = sorted({t.name for s in specs for t in s.node.tasks.specs})
        rows.append(
            {
                "configuration": exp.label(conf),
                "seed": "-" if seed is None else seed,
                "swarm_id": swarm.swarm_id,
                "policy": conf.policy_kind(exp.swarm),
                "nodes": len(specs),
                "rounds": swarm.rounds,
                "models": ",".join(sorted({s.node.model for s in specs})),
                "tasks": ",".join(tasks),
                "questions": node.questions,
                "completions": node.generation.completions_per_question,
                "max_new_tokens": node.generation.max_new_tokens,
                "rollouts": len(specs)
                * swarm.rounds
                * node.questions
                * node.generation.completions_per_question,
                "done": (records is not None and record_covers(exp, records, swarm.swarm_id))
                or is_complete(swarm),
            }
        )
    return rows


def format_plan(exp: ExperimentConfig, records: Path | None = None) -> str:
    """The plan as a table, with each run's wall time from this machine's progress file
    or its record (the last attempt that ended, and how many attempts were stopped before it)."""
    rows = plan(exp, records)
    times = run_walls(exp, records)
    for row in rows:
        row["wall"] = wall_label(times.get(row["swarm_id"]))
    head = (
        f"experiment {exp.experiment}: {len(exp.configurations)} configurations"
        + ("" if exp.seeds is None else f" x {len(exp.seeds)} seeds = {len(rows)} runs")
        + "; "
        f"ledger {exp.ledger_url()}; MLflow {exp.tracking_uri()}"
    )
    timed = [t["seconds"] for t in times.values() if t["seconds"] is not None]
    if timed:
        head += f"; timed runs: {len(timed)}, {sum(timed) / 3600:.1f} h in all (last attempts)"
    left = sum(not row["done"] for row in rows)
    if timed and left:
        # what whoever resumes the sweep plans around
        estimate = left * sum(timed) / len(timed) / 3600
        head += f"; {left} of {len(rows)} runs left, about {estimate:.1f} h at the timed mean"
    elif left and (guess := estimated_hours([r for r in rows if not r["done"]])) is not None:
        head += (
            f"; {left} runs, about {guess:.1f} h on an idle 2-core CPU machine (measured "
            "cost per rollout; a timed run replaces it)"
        )
    cols = ["configuration", "seed", "swarm_id", "policy", "nodes", "rounds", "questions",
            "completions", "max_new_tokens", "rollouts", "done", "wall"]  # fmt: skip
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = [head, "  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
    first = rows[0]
    lines.append(f"models: {first['models']}")
    lines.append(f"tasks: {first['tasks']}")
    return "\n".join(lines)
