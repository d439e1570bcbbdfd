"""The return on compute (analysis/returns.py): the gain over the baseline per 1,000 tokens
a node spent and per 1,000 extra tokens, on runs worked out by hand."""

from __future__ import annotations

import polars as pl
import pytest

from analysis.returns import token_returns


def runs() -> pl.DataFrame:
    """Two seeds, 2 nodes a run; the claimed reward is a rate (a sum over rounds of mean
    rewards), the tokens a run's sums over its nodes. 4/0: 1.0 for 10k generated and 4k
    trained a run. 2/2: 1.5 on the same generation, 8k trained. The control makes twice the
    questions: 1.3 and 1.1 for 20k generated and 8k trained. 'lean': 1.2 for 9k generated
    and 4.1k trained."""
    rows = []
    for seed in (0, 1):
        rows += [
            ("4/0", seed, 1.0, 10_000, 4_000),
            ("2/2", seed, 1.5, 10_000, 8_000),
            ("4/0-q8", seed, 1.3 if seed == 0 else 1.1, 20_000, 8_000),
            ("lean", seed, 1.2, 9_000, 4_100),
        ]
    return pl.DataFrame(
        rows,
        schema=["configuration", "seed", "cumulative_claimed_reward", "tokens_generated",
                "tokens_trained"],
        orient="row",
    ).with_columns(nodes=pl.lit(2))  # fmt: skip


def by_kind(frame: pl.DataFrame) -> dict[tuple[str, str], dict[str, object]]:
    return {(r["configuration"], r["tokens"]): r for r in frame.iter_rows(named=True)}


def test_the_gain_is_priced_per_thousand_tokens_a_node_spent_and_per_extra_thousand() -> None:
    back = by_kind(token_returns(runs(), baseline="4/0"))
    assert list(dict.fromkeys(c for c, _ in back)) == ["2/2", "4/0-q8", "lean"]
    # The control: gains 0.3 and 0.1 (mean 0.2) for 10k generated a node (5k more than
    # 4/0's 5k) and 4k trained (2k more).
    gen, trained = back["4/0-q8", "generated"], back["4/0-q8", "trained"]
    assert gen["gain"] == pytest.approx(0.2) and gen["k_tokens"] == pytest.approx(10.0)
    assert gen["per_1k"] == pytest.approx(0.02)  # 0.03 and 0.01 per seed
    half = 12.7062 * (0.02 / 2**0.5) / 2**0.5  # t(1) x sd / sqrt(n), sd of (0.03, 0.01)
    assert (gen["per_1k_low"], gen["per_1k_high"]) == pytest.approx(
        (0.02 - half, 0.02 + half), rel=1e-4
    )
    assert gen["extra_k"] == pytest.approx(5.0) and gen["per_1k_extra"] == pytest.approx(0.04)
    assert trained["per_1k"] == pytest.approx(0.05) and trained["per_1k_extra"] == pytest.approx(
        0.1
    )
    # 2/2 gains 0.5 on 4/0's generation: 0.1 per 1k generated, and no price per extra one.
    assert back["2/2", "generated"]["per_1k"] == pytest.approx(0.1)
    assert back["2/2", "generated"]["extra_k"] == pytest.approx(0.0)
    assert back["2/2", "generated"]["per_1k_extra"] is None
    assert back["2/2", "trained"]["per_1k_extra"] == pytest.approx(0.5 / 2.0)
    # Spending less (generation) or no more than 5% more (training: +50 a node on 2,000).
    assert back["lean", "generated"]["per_1k_extra"] is None
    assert back["lean", "trained"]["per_1k_extra"] is None


def test_the_same_gain_for_twice_the_generation_reads_half() -> None:
    """Against the control (issue 46's comparison): 2/2 gains 0.2 and 0.4 on half the
    generation and the same training; per 1k generated it earns 0.2 / 5 and 0.4 / 5."""
    frame = runs().filter(pl.col("configuration").is_in(["2/2", "4/0-q8"]))
    back = by_kind(token_returns(frame, baseline="4/0-q8"))
    gen = back["2/2", "generated"]
    assert gen["gain"] == pytest.approx(0.3) and gen["per_1k"] == pytest.approx(0.06)
    assert gen["extra_k"] == pytest.approx(-5.0) and gen["per_1k_extra"] is None
    assert back["2/2", "trained"]["per_1k_extra"] is None  # the same training


def test_the_gain_and_the_spend_are_paired_on_the_same_seeds() -> None:
    """A seed whose trained tokens are unknown (a lost training log) leaves the trained
    figures, gain included, on the other seeds: not a gain over three seeds divided by a
    spend over two."""
    frame = pl.DataFrame(
        {
            "configuration": ["a"] * 3 + ["b"] * 3,
            "seed": [0, 1, 2] * 2,
            "cumulative_claimed_reward": [1.0, 1.0, 1.0, 1.6, 1.1, 1.1],
            "tokens_generated": [2000] * 6,
            "tokens_trained": [1000, 1000, 1000, None, 2000, 2000],
            "nodes": [1] * 6,
        }
    )
    back = by_kind(token_returns(frame, baseline="a"))
    assert back["b", "generated"]["n_seeds"] == 3
    assert back["b", "generated"]["gain"] == pytest.approx(0.8 / 3)
    trained = back["b", "trained"]
    assert trained["n_seeds"] == 2 and trained["gain"] == pytest.approx(0.1)
    assert trained["extra_k"] == pytest.approx(1.0)
    assert trained["per_1k_extra"] == pytest.approx(0.1)  # not (0.8 / 3) / 1.0
    # a configuration sharing no seed with the baseline, or tokens never counted: no row
    alone = frame.with_columns(
        seed=pl.when(pl.col("configuration") == "b").then(9).otherwise("seed")
    )
    assert token_returns(alone, baseline="a").is_empty()
    assert token_returns(frame.drop("tokens_trained"), baseline="a")["tokens"].to_list() == [
        "generated"
    ]
