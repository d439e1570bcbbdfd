"""Peers' drift over an experiment's rounds, from run records (analysis/records.py, `drift`).

Per run and round, a node's update measured how far the generator of each group it trained
on was from its own policy before the step (sapo_core/grpo/offpolicy.py): a KL estimate
(mean generator - self log-prob of the sampled tokens), the effective sample size of the
token ratios as a fraction of the tokens, and the share of tokens whose ratio exceeded the
cap. Here they are pooled over the tokens of every node and peer of a run, per round and per
block of rounds: KL and the share over the cap weighted by tokens, and the ESS those tokens
would have as one batch (from the sums of the ratios and their squares, never an average of
fractions), then described over seeds with t intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analysis.statistics import t_interval

MEASURES = {"kl": "KL (nats a token)", "ess_fraction": "ESS fraction", "capped": "over the cap"}
BLOCKS = 4  # a 24-round run reads as four blocks of six rounds


@dataclass
class DriftTables:
    rounds: pl.DataFrame  # per configuration, seed and round: peers' tokens pooled over nodes
    blocks: pl.DataFrame  # per configuration and block of rounds: mean and interval over seeds
    runs_with_drift: int  # runs whose records carry drift (records before version 3 do not)
    runs: int
    own_kl_max: float | None  # the largest |KL| of a node's own rows (sampler vs trainer)


def _pooled() -> list[pl.Expr]:
    tokens = pl.col("tokens").cast(pl.Float64)
    total = tokens.sum()
    weights = (tokens * pl.col("weight_mean")).sum()
    squares = (tokens * pl.col("weight_sq_mean")).sum()
    return [
        pl.col("tokens").sum().alias("tokens"),
        ((tokens * pl.col("kl")).sum() / total).alias("kl"),
        pl.when(squares > 0)
        .then((weights.pow(2) / (total * squares)).clip(upper_bound=1.0))
        .alias("ess_fraction"),
        ((tokens * pl.col("capped")).sum() / total).alias("capped"),
    ]


def _peers(drift: pl.DataFrame, runs: pl.DataFrame) -> pl.DataFrame:
    """Peers' rows of ``runs``, in one order whatever the records' (sums are then the same
    bits from a ledger and from records read back)."""
    peers = drift.filter(pl.col("origin") == "external").join(runs, on="swarm_id")
    return peers.sort("swarm_id", "node_id", "node_round", "peer_node_id")


def drift_rounds(drift: pl.DataFrame, runs: pl.DataFrame) -> pl.DataFrame:
    """Per run (``runs``: swarm_id, configuration, seed) and node round, peers' tokens pooled
    over the run's nodes and peers: tokens, kl, ess_fraction, capped."""
    peers = _peers(drift, runs)
    keys = ["configuration", "seed", "swarm_id", "node_round"]
    return peers.group_by(keys).agg(_pooled()).sort(keys)


def drift_blocks(
    drift: pl.DataFrame, runs: pl.DataFrame, rounds: int, order: list[str] | None = None
) -> pl.DataFrame:
    """Per configuration and block of rounds (``BLOCKS`` of them over ``rounds``): each
    measure pooled per seed over the block's tokens, then its mean and 95% t interval over
    seeds (``<measure>``, ``<measure>_low``, ``<measure>_high``) and ``n_seeds``."""
    size = max(1, -(-rounds // BLOCKS))
    per_seed = (
        _peers(drift, runs)
        .with_columns((pl.col("node_round") // size).alias("block"))
        .group_by("configuration", "seed", "block", maintain_order=True)
        .agg(_pooled())
        .sort("configuration", "seed", "block")
    )
    configurations = order or sorted(set(per_seed["configuration"]))
    out: list[dict[str, object]] = []
    for configuration in configurations:
        mine = per_seed.filter(pl.col("configuration") == configuration)
        for block in sorted(set(mine["block"])):
            rows = mine.filter(pl.col("block") == block)
            first = block * size
            row: dict[str, object] = {
                "configuration": configuration,
                "rounds": f"{first}-{min(first + size, rounds) - 1}",
                "n_seeds": rows.height,
            }
            for measure in MEASURES:
                interval = t_interval(rows[measure].drop_nulls().to_list())
                row |= {measure: interval.mean, f"{measure}_low": interval.low,
                        f"{measure}_high": interval.high}  # fmt: skip
            out.append(row)
    return pl.DataFrame(out)


def drift_tables(
    drift: pl.DataFrame, runs: pl.DataFrame, rounds: int, order: list[str] | None = None
) -> DriftTables | None:
    """The drift tables of ``runs`` (swarm_id, configuration, seed); None when no run's
    record carries drift (an experiment recorded before version 3, or one without peers)."""
    drift = drift.join(runs.select("swarm_id"), on="swarm_id", how="semi")  # complete runs
    if drift.filter(pl.col("origin") == "external").is_empty():
        return None
    own = drift.filter(pl.col("origin") == "local")["kl"].drop_nulls()
    return DriftTables(
        rounds=drift_rounds(drift, runs),
        blocks=drift_blocks(drift, runs, rounds, order),
        runs_with_drift=drift.select(pl.col("swarm_id").n_unique()).item(),
        runs=runs.height,
        own_kl_max=float(own.abs().max()) if len(own) else None,  # type: ignore[arg-type]
    )


def _cell(row: dict[str, object], measure: str) -> str:
    mean, low, high = row[measure], row[f"{measure}_low"], row[f"{measure}_high"]
    if not isinstance(mean, float):
        return "-"
    spec = ".1%" if measure == "capped" else ".3f"
    if not isinstance(low, float) or low != low:
        return format(mean, spec)
    return f"{mean:{spec}} [{low:{spec}}, {high:{spec}}]"


def drift_lines(tables: DriftTables) -> list[str]:
    """The report's section: peers' drift per configuration and block of rounds."""
    lines = [
        "",
        "### peers' drift over rounds (peers' tokens a node trained on, pooled per seed over "
        "its nodes and peers; mean [95% interval] over seeds)",
        "",
        f"Drift is in the records of {tables.runs_with_drift} of {tables.runs} runs (records "
        "written before version 3 carry none; nodes alone have no peers). KL: the mean "
        "(generator - receiver) log-prob of the sampled tokens; ESS fraction: the effective "
        "sample size of the token ratios (receiver / generator) over the tokens; over the cap: "
        "the share of tokens whose ratio exceeded the cap (the tokens a truncating correction "
        "cuts).",
        "",
        "| configuration | rounds | seeds | " + " | ".join(MEASURES.values()) + " |",
        "|" + "---|" * (3 + len(MEASURES)),
    ]
    for row in tables.blocks.iter_rows(named=True):
        cells = [_cell(row, m) for m in MEASURES]
        lines.append(f"| {row['configuration']} | {row['rounds']} | {row['n_seeds']} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    if tables.own_kl_max is not None:
        lines += [
            "",
            f"A node's own rows: |KL| at most {tables.own_kl_max:.1e} over every run and "
            "round (its sampler's log-probs against its trainer's: 0 where the two compute "
            "alike).",
        ]
    return lines
