"""Peers' drift over an experiment's rounds, from run records (analysis/records.py, `drift`).

Per run and round, a node's update measured how far the generator of each group it trained
on was from its own policy before the step (sapo_core/grpo/offpolicy.py): a KL estimate
(mean generator - self log-prob of the sampled tokens), the effective sample size of the
token ratios as a fraction of the tokens, and the share of tokens the correction cut (under
``none``: whose ratio exceeded the cap). Here, peers' tokens only: KL and the share cut are
pooled over every node and peer of a run, weighted by tokens (exact: the records keep
per-token means and their token counts). The ESS is an update's: per node and round, from
the sums of its peer tokens' ratios and their squares (never an average of fractions), then
weighted by those tokens. Pooling it over nodes too would count the gap between two nodes'
mean ratios, which no update saw. Per seed, then described over seeds with t intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analysis.statistics import t_interval

MEASURES = {"kl": "KL (nats a token)", "ess_fraction": "ESS fraction", "capped": "cut"}
BLOCKS = 4  # a 24-round run reads as four blocks of six rounds
DRIFT_SUMS = ("kl", "weight_mean", "weight_sq_mean", "capped")


@dataclass
class DriftTables:
    rounds: pl.DataFrame  # per configuration, seed and round: peers' tokens pooled over nodes
    blocks: pl.DataFrame  # per configuration and block of rounds: mean and interval over seeds
    runs_with_drift: int  # runs whose records carry peers' drift (none before version 3)
    runs: int
    own_kl_max: float | None  # the largest |KL| of a node's own rows (sampler vs trainer)


def _update_sums(peers: pl.DataFrame) -> pl.DataFrame:
    """Per run, node and round (one update): its peer tokens, the token-weighted sums of
    KL and of the share cut, and its ESS fraction from the ratios' sums."""
    tokens = pl.col("tokens").cast(pl.Float64)
    weights = (tokens * pl.col("weight_mean")).sum()
    squares = (tokens * pl.col("weight_sq_mean")).sum()
    keys = ["configuration", "seed", "swarm_id", "node_id", "node_round"]
    return peers.group_by(keys).agg(
        tokens.sum().alias("tokens"),
        (tokens * pl.col("kl")).sum().alias("kl_sum"),
        (tokens * pl.col("capped")).sum().alias("capped_sum"),
        pl.when(squares > 0)
        .then((weights.pow(2) / (tokens.sum() * squares)).clip(upper_bound=1.0))
        .alias("ess_fraction"),
    )


def _pooled() -> list[pl.Expr]:
    """Updates pooled: KL and the share cut over their tokens, the ESS weighted by them."""
    total = pl.col("tokens").sum()
    return [
        total.cast(pl.Int64).alias("tokens"),
        (pl.col("kl_sum").sum() / total).alias("kl"),
        ((pl.col("tokens") * pl.col("ess_fraction")).sum() / total).alias("ess_fraction"),
        (pl.col("capped_sum").sum() / total).alias("capped"),
    ]


def peer_updates(drift: pl.DataFrame, runs: pl.DataFrame) -> pl.DataFrame:
    """Per update, peers' rows of ``runs`` summed (``_update_sums``), in one order whatever
    the records' (sums are then the same bits from a ledger and from records read back).
    Rows with no tokens or a missing or non-finite measure say nothing and are left out."""
    finite = [pl.col(c).is_not_null() & pl.col(c).is_finite() for c in DRIFT_SUMS]
    peers = (
        drift.filter(pl.col("origin") == "external", pl.col("tokens") > 0, *finite)
        .join(runs, on="swarm_id")
        .sort("swarm_id", "node_id", "node_round", "peer_node_id")
    )
    return _update_sums(peers).sort("swarm_id", "node_id", "node_round")


def block_of(node_round: pl.Expr, rounds: int) -> pl.Expr:
    """Which of ``BLOCKS`` near-equal blocks of ``rounds`` a round falls in."""
    return (node_round * BLOCKS) // max(rounds, 1)


def block_rounds(block: int, rounds: int) -> str:
    """The first and last round of ``block`` (block_of's inverse): "6-11"."""
    first = -(-block * rounds // BLOCKS)
    return f"{first}-{-(-(block + 1) * rounds // BLOCKS) - 1}"


def drift_rounds(updates: pl.DataFrame) -> pl.DataFrame:
    """Per run and node round, peers' tokens (``peer_updates``) pooled over the run's nodes
    and peers: tokens, kl, ess_fraction, capped."""
    keys = ["configuration", "seed", "swarm_id", "node_round"]
    return updates.group_by(keys).agg(_pooled()).sort(keys)


def drift_blocks(
    updates: pl.DataFrame, runs: pl.DataFrame, rounds: int, order: list[str] | None = None
) -> pl.DataFrame:
    """Per configuration and block of rounds (``BLOCKS`` of them over ``rounds``): each
    measure pooled per seed over the block's tokens, then its mean and 95% t interval over
    seeds (``<measure>``, ``<measure>_low``, ``<measure>_high``); ``n_seeds``, the seeds
    with peers' tokens in the block, of ``seeds``, the configuration's runs."""
    per_seed = (
        updates.filter(pl.col("node_round") < rounds)
        .with_columns(block_of(pl.col("node_round"), rounds).alias("block"))
        .group_by("configuration", "seed", "block", maintain_order=True)
        .agg(_pooled())
        .sort("configuration", "seed", "block")
    )
    planned = dict(runs.group_by("configuration").agg(pl.col("seed").n_unique()).iter_rows())
    found = set(per_seed["configuration"])
    configurations = [c for c in order if c in found] if order else sorted(found)
    configurations += sorted(found - set(configurations))  # none dropped unseen
    out: list[dict[str, object]] = []
    for configuration in configurations:
        mine = per_seed.filter(pl.col("configuration") == configuration)
        for block in sorted(set(mine["block"])):
            rows = mine.filter(pl.col("block") == block)
            row: dict[str, object] = {
                "configuration": configuration,
                "rounds": block_rounds(block, rounds),
                "n_seeds": rows.height,
                "seeds": planned.get(configuration, rows.height),
            }
            for measure in MEASURES:
                interval = t_interval(rows[measure].drop_nulls().drop_nans().to_list())
                row |= {measure: interval.mean, f"{measure}_low": interval.low,
                        f"{measure}_high": interval.high}  # fmt: skip
            out.append(row)
    return pl.DataFrame(out)


def drift_tables(
    drift: pl.DataFrame, runs: pl.DataFrame, rounds: int, order: list[str] | None = None
) -> DriftTables | None:
    """The drift tables of ``runs`` (swarm_id, configuration, seed); None when no run's
    record carries drift (an experiment recorded before version 3). Runs without peers
    (nodes alone) still bound their own rows' drift."""
    drift = drift.join(runs.select("swarm_id"), on="swarm_id", how="semi")  # complete runs
    if drift.is_empty():
        return None
    own = drift.filter(pl.col("origin") == "local")["kl"].drop_nulls().drop_nans()
    updates = peer_updates(drift, runs)
    return DriftTables(
        rounds=drift_rounds(updates),
        blocks=drift_blocks(updates, runs, rounds, order),
        runs_with_drift=updates["swarm_id"].n_unique(),
        runs=runs.height,
        own_kl_max=float(own.abs().max()) if len(own) else None,  # type: ignore[arg-type]
    )


def _cell(row: dict[str, object], measure: str) -> str:
    mean, low, high = row[measure], row[f"{measure}_low"], row[f"{measure}_high"]
    if not isinstance(mean, float) or mean != mean:
        return "-"
    spec = ".1%" if measure == "capped" else ".3f"
    if not isinstance(low, float) or low != low:
        return format(mean, spec)
    return f"{mean:{spec}} [{low:{spec}}, {high:{spec}}]"


def drift_lines(tables: DriftTables) -> list[str]:
    """The report's section: peers' drift per configuration and block of rounds."""
    lines = [
        "",
        "### peers' drift over rounds (peers' tokens a node trained on, per seed pooled over "
        "its nodes and peers; mean [95% interval] over seeds)",
        "",
        f"Peers' drift is in the records of {tables.runs_with_drift} of {tables.runs} runs "
        "(records written before version 3 carry none; nodes alone have no peers); only "
        "tokens whose generator's log-prob the receiver accepted count. KL: the mean "
        "(generator - receiver) log-prob of the sampled tokens. ESS fraction: the effective "
        "sample size of the token ratios (receiver / generator) of one update's peer tokens "
        "over their number, weighted by those tokens. Cut: the share of tokens the correction "
        "truncated or masked (a sequence-level one cuts every token of a completion whose "
        "ratio it cut); under none, the share whose ratio exceeded the cap, those a "
        "token-level truncation would cut. Seeds: those with peers' tokens in the block, of "
        "the configuration's complete runs.",
    ]
    if not tables.blocks.is_empty():
        lines += [
            "",
            "| configuration | rounds | seeds | " + " | ".join(MEASURES.values()) + " |",
            "|" + "---|" * (3 + len(MEASURES)),
        ]
    for row in tables.blocks.iter_rows(named=True):
        cells = [_cell(row, m) for m in MEASURES]
        seeds = (
            row["n_seeds"] if row["n_seeds"] == row["seeds"] else f"{row['n_seeds']}/{row['seeds']}"
        )
        lines.append(f"| {row['configuration']} | {row['rounds']} | {seeds} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    if tables.own_kl_max is not None:
        lines += [
            "",
            f"A node's own rows: |KL| at most {tables.own_kl_max:.1e} over every run and "
            "round (its sampler's log-probs against its trainer's: 0 where the two compute "
            "alike).",
        ]
    return lines
