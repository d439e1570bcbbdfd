"""The return on compute: what a configuration's gain over the baseline cost in tokens.

The cumulative claimed reward is a rate: each round's mean reward over a node's own
completions, summed over rounds. It measures the policy's skill whatever the number of
completions a node makes, so its gain over the baseline is what a configuration bought, and
the tokens a node generated and trained on are what it spent. A node alone that makes twice
the questions (the compute-matched control of docs/compute-matched-cpu.md) spends twice on
generation for whatever it gains. Two readings, fixed before that sweep's results:

- **gain per 1,000 tokens**: per seed, the paired gain over the baseline divided by the
  thousands of tokens a node of the configuration spent (generated, or trained on); the
  mean and 95% t interval over seeds. The same gain for twice the tokens reads half;
- **gain per 1,000 extra tokens** (the marginal price): the mean paired gain divided by
  the mean extra tokens a node spent over the baseline on the same seeds (a ratio of
  means, no interval); only where the configuration spent more than ``SAME_SPEND`` over
  the baseline. 2/2 makes as many completions as 4/0, so it has no price per extra
  generated token: a gain over a difference that small, or a negative one, is no price.

Tokens are a run's sums over its nodes, so they are divided by its nodes: a node's spend,
beside a node's reward.
"""

from __future__ import annotations

import polars as pl

from analysis.statistics import t_interval

TOKENS = {"generated": "tokens_generated", "trained": "tokens_trained"}
SAME_SPEND = 0.05

RETURNS_SCHEMA: dict[str, type[pl.DataType]] = {
    "configuration": pl.String,
    "tokens": pl.String,  # "generated" or "trained"
    "n_seeds": pl.Int64,
    "gain": pl.Float64,  # mean paired gain in cumulative claimed reward
    "k_tokens": pl.Float64,  # thousands of tokens a node spent, mean over the seeds
    "per_1k": pl.Float64,
    "per_1k_low": pl.Float64,
    "per_1k_high": pl.Float64,
    "extra_k": pl.Float64,  # over the baseline's, mean over the seeds
    "per_1k_extra": pl.Float64,  # null: no more than SAME_SPEND over the baseline
}


def _per_seed(
    runs: pl.DataFrame, configuration: str, column: str
) -> dict[int, tuple[float, float]]:
    """seed -> (cumulative claimed reward, thousands of ``column`` tokens a node spent), for
    the runs where both are known: the gain and the spend are paired on the same seeds."""
    rows = runs.filter(
        pl.col("configuration") == configuration,
        pl.col("cumulative_claimed_reward").is_not_null(),
        pl.col(column).is_not_null(),
    )
    return {
        r["seed"]: (r["cumulative_claimed_reward"], r[column] / r["nodes"] / 1000)
        for r in rows.iter_rows(named=True)
    }


def token_returns(runs: pl.DataFrame, *, baseline: str) -> pl.DataFrame:
    """Per configuration other than ``baseline`` and per kind of tokens (generated,
    trained): the gain per 1,000 tokens with its interval over seeds and the gain per
    1,000 extra tokens (``RETURNS_SCHEMA``), from ``run_metrics``'s rows (configuration,
    seed, cumulative_claimed_reward, tokens_generated, tokens_trained, nodes). Empty where
    nothing pairs with the baseline."""
    configurations = runs.get_column("configuration").unique(maintain_order=True).to_list()
    # the baseline's seeds once per kind of tokens, not again for every configuration
    references = {
        kind: _per_seed(runs, baseline, column)
        for kind, column in TOKENS.items()
        if column in runs.columns
    }
    out: list[dict[str, object]] = []
    for configuration in configurations:
        if configuration == baseline:
            continue
        for kind, reference in references.items():
            mine = _per_seed(runs, configuration, TOKENS[kind])
            seeds = sorted(set(mine) & set(reference))
            if not seeds:
                continue
            gains = [mine[s][0] - reference[s][0] for s in seeds]
            spent = [mine[s][1] for s in seeds]
            extra = [mine[s][1] - reference[s][1] for s in seeds]
            rates = t_interval([g / k for g, k in zip(gains, spent, strict=True) if k > 0])
            mean_gain, mean_extra = sum(gains) / len(seeds), sum(extra) / len(seeds)
            base_spend = sum(reference[s][1] for s in seeds) / len(seeds)
            priced = mean_extra > SAME_SPEND * base_spend
            out.append(
                {"configuration": configuration, "tokens": kind, "n_seeds": len(seeds),
                 "gain": mean_gain, "k_tokens": sum(spent) / len(seeds),
                 "per_1k": rates.mean, "per_1k_low": rates.low, "per_1k_high": rates.high,
                 "extra_k": mean_extra,
                 "per_1k_extra": mean_gain / mean_extra if priced else None}
            )  # fmt: skip
    frame = pl.DataFrame(out, schema=RETURNS_SCHEMA)
    # NaN bounds (one seed) read as unknown, like every other interval of the report
    return frame.with_columns(pl.col(c).fill_nan(None) for c in ("per_1k_low", "per_1k_high"))
