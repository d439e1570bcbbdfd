"""`sapo compare`: every node run of an MLflow tracking store side by side (a server's, where
nodes on many machines log, or a local file), each sharing configuration's mean, and the
best node's model registered.

The runs are found by the tags every node run carries (`sapo.node_id`, `sapo.swarm_id`,
`sapo.sharing`, `sapo.sampling_policy`: flows/node/runtime.py), so nodes started by `sapo swarm`,
by `sapo node` on other machines or by scheduled deployments compare alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import polars as pl

from flows.tracking import MODEL_PATH_TAG, existing_store
from ledger.retrying import first_line

RANKED_BY = "cumulative_own_reward"
COMPARED = ("own_reward", "training_reward", "cumulative_own_reward", "cumulative_training_reward")
"""Each node run's last value of these (docs/running.md, "Rewards, by name")."""

NODE_SCHEMA: dict[str, Any] = {
    "experiment": pl.String,
    "swarm_id": pl.String,
    "node_id": pl.String,
    "sharing": pl.String,
    "policy": pl.String,
    "model": pl.String,
    "prompt_format": pl.String,
    "adapter": pl.String,
    "rounds": pl.Int64,
    **{name: pl.Float64 for name in COMPARED},
    "logged_model": pl.String,
    "run_id": pl.String,
}


@dataclass(frozen=True)
class Comparison:
    nodes: pl.DataFrame
    """One row per node run, best first."""
    configurations: pl.DataFrame
    """One row per swarm and sharing configuration: its nodes' means."""


def node_rows(runs: list[Any], experiments: dict[str, str], rounds: dict[str, int]) -> pl.DataFrame:
    """MLflow runs (``mlflow.entities.Run``) of nodes as rows; ``experiments``: id -> name;
    ``rounds``: run id -> rounds logged. `model` is what the node ran (its configured model:
    a hub id, a path or a bundled name), `prompt_format` how it prompted it and `adapter`
    what it trained on it (`lora-r16`; `none`: every weight; null: a run from before);
    `logged_model` is the artifact path of the run's newest logged model (null: none)."""
    rows = []
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        rows.append(
            {
                "experiment": experiments.get(run.info.experiment_id, run.info.experiment_id),
                "swarm_id": tags.get("sapo.swarm_id", ""),
                "node_id": tags["sapo.node_id"],
                "sharing": tags.get("sapo.sharing", ""),
                "policy": tags.get("sapo.sampling_policy", ""),
                "model": tags.get("sapo.model"),
                "prompt_format": tags.get("sapo.prompt_format"),
                "adapter": tags.get("sapo.adapter"),
                "rounds": rounds.get(run.info.run_id),
                **{name: metrics.get(name) for name in COMPARED},
                "logged_model": tags.get(MODEL_PATH_TAG),
                "run_id": run.info.run_id,
            }
        )
    # A NaN would sort above every number and be registered: treat it as missing.
    frame = pl.DataFrame(rows, schema=NODE_SCHEMA).with_columns(pl.col(COMPARED).fill_nan(None))
    return frame.sort(
        [RANKED_BY, "swarm_id", "node_id"], descending=[True, False, False], nulls_last=True
    )


def configurations(nodes: pl.DataFrame) -> pl.DataFrame:
    """Each swarm's sharing configurations (I/J and policy): node count, the models its
    nodes ran, and mean rewards."""
    return (
        nodes.group_by(["experiment", "swarm_id", "sharing", "policy"])
        .agg(
            pl.len().alias("nodes"),
            pl.col("model").drop_nulls().unique().sort().str.join(", ").alias("models"),
            pl.col("rounds").max(),
            *[pl.col(name).mean() for name in COMPARED],
        )
        .sort([RANKED_BY, "swarm_id"], descending=[True, False], nulls_last=True)
    )


def best_with_model(nodes: pl.DataFrame) -> dict[str, Any] | None:
    """The best ranked node run that logged a model (None: no run did)."""
    eligible = nodes.filter(pl.col("logged_model").is_not_null() & pl.col(RANKED_BY).is_not_null())
    return eligible.row(0, named=True) if eligible.height else None


def read_comparison(tracking_uri: str, experiment: str | None = None) -> Comparison:
    """The node runs of one MLflow experiment (default: all) at ``tracking_uri``.
    ValueError (one line) when the experiment is unknown or holds no node runs."""
    from flows.env import apply_offline_defaults

    apply_offline_defaults()
    from mlflow.tracking import MlflowClient

    existing_store(tracking_uri)  # a mistyped store is an error, never a new empty one
    with _one_line(tracking_uri):
        return _read(MlflowClient(tracking_uri=tracking_uri), tracking_uri, experiment)


@contextmanager
def _one_line(tracking_uri: str) -> Iterator[None]:
    """MLflow's errors (a server down, a bad URI; open_tracker's RuntimeError after its
    retries) as a ValueError of one line."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except (MlflowException, RuntimeError) as exc:
        raise ValueError(f"{tracking_uri}: {first_line(exc)}") from exc


def _read(client: Any, tracking_uri: str, experiment: str | None) -> Comparison:
    if experiment is not None:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise ValueError(f"{tracking_uri}: no MLflow experiment named {experiment!r}")
        known = {found.experiment_id: found.name}
    else:
        known = {e.experiment_id: e.name for e in _all_pages(client.search_experiments)}
    query = "tags.`sapo.node_id` != ''"
    runs = _all_pages(
        lambda page_token: client.search_runs(list(known), query, page_token=page_token)
    )
    if not runs:
        where = f"experiment {experiment!r}" if experiment else "any experiment"
        raise ValueError(f"{tracking_uri}: no node runs in {where}")
    # Rounds count from 0: a node's rounds are its last logged step plus one.
    rounds = {}
    for run in runs:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, RANKED_BY)]
        if steps:
            rounds[run.info.run_id] = max(steps) + 1
    nodes = node_rows(runs, known, rounds)
    return Comparison(nodes, configurations(nodes))


def _all_pages(search: Callable[..., Any]) -> list[Any]:
    """Every item of an MLflow search, page after page."""
    items: list[Any] = []
    token = None
    while True:
        page = search(page_token=token)
        items.extend(page)
        token = page.token
        if not token:
            return items


def register_best_model(
    tracking_uri: str, nodes: pl.DataFrame, name: str
) -> tuple[dict[str, Any], str, bool] | None:
    """Register the model of the best node run that logged one as a version of ``name``,
    unless it already is one; returns that node's row, the version and whether it was new
    (None: no run logged a model)."""
    from flows.tracking import open_tracker

    best = best_with_model(nodes)
    if best is None:
        return None
    with _one_line(tracking_uri):
        tracker = open_tracker(tracking_uri, best["experiment"], None)
        version, new = tracker.ensure_registered(name, best["run_id"], best["logged_model"])
        return best, version, new
