"""Peers' drift over rounds (analysis/drift.py) on hand-made record rows: blocks of any
horizon, the ESS an update had, seeds missing from a block, and rows that say nothing."""

from __future__ import annotations

import math

import polars as pl
import pytest

from analysis.drift import block_of, block_rounds, drift_lines, drift_tables

RUNS = pl.DataFrame(
    {
        "swarm_id": ["a-s0", "a-s1", "alone-s0"],
        "configuration": ["2/2", "2/2", "4/0"],
        "seed": [0, 1, 0],
    }
)


def row(swarm: str, node: str, round_: int, **values: object) -> dict[str, object]:
    base: dict[str, object] = {
        "swarm_id": swarm, "node_id": node, "node_round": round_, "peer_node_id": "p",
        "origin": "external", "tokens": 10, "kl": 0.1, "weight_mean": 1.0,
        "weight_sq_mean": 1.0, "capped": 0.0,
    }  # fmt: skip
    return base | values


def frame(rows: list[dict[str, object]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema_overrides={"kl": pl.Float64, "capped": pl.Float64})


@pytest.mark.parametrize(
    ("rounds", "labels"),
    [
        (24, ["0-5", "6-11", "12-17", "18-23"]),
        (6, ["0-1", "2-2", "3-4", "5-5"]),
        (9, ["0-2", "3-4", "5-6", "7-8"]),
        (5, ["0-1", "2-2", "3-3", "4-4"]),
        (2, ["0-0", "1-0", "1-1", "2-1"]),  # blocks 1 and 3 hold no round
    ],
)
def test_blocks_cover_every_round_once_whatever_the_horizon(rounds: int, labels: list[str]) -> None:
    blocks = pl.select(block_of(pl.Series(range(rounds)), rounds)).to_series().to_list()
    assert [block_rounds(b, rounds) for b in range(4)] == labels
    for r, b in enumerate(blocks):  # each round sits inside its block's label
        first, last = map(int, block_rounds(b, rounds).split("-"))
        assert first <= r <= last


def test_an_updates_ess_is_its_own_and_a_missing_seed_shows() -> None:
    """Two nodes of seed 0 whose ratios are each constant (ESS 1 each) but of different
    means pool to ESS 1 per update, not the (2.5^2) / (2 x 4.25) a batch of both would give;
    seed 1 has peers' tokens in the first block only."""
    rows = [
        row("a-s0", "n0", 0, weight_mean=0.5, weight_sq_mean=0.25),
        row("a-s0", "n1", 0, weight_mean=2.0, weight_sq_mean=4.0),
        row("a-s0", "n0", 23, kl=0.3),
        row("a-s1", "n0", 0, kl=0.5, tokens=30),
        row("a-s1", "n0", 0, origin="local", kl=-0.02),
    ]
    tables = drift_tables(frame(rows), RUNS, rounds=24, order=["4/0", "2/2"])
    assert tables is not None and tables.runs_with_drift == 2 and tables.runs == 3
    first, last = tables.blocks.to_dicts()
    assert first["rounds"] == "0-5" and first["n_seeds"] == 2 and first["seeds"] == 2
    assert first["ess_fraction"] == pytest.approx(1.0)
    assert first["kl"] == pytest.approx((0.1 + 0.5) / 2)  # seed 0's 0.1, seed 1's 0.5
    assert last["rounds"] == "18-23" and last["n_seeds"] == 1 and last["kl"] == pytest.approx(0.3)
    assert tables.own_kl_max == pytest.approx(0.02)
    text = "\n".join(drift_lines(tables))
    assert "| 2/2 | 18-23 | 1/2 | 0.300 | 1.000 | 0.0% |" in text


def test_rows_that_say_nothing_are_left_out() -> None:
    """No tokens, a missing or a non-finite measure: the row is not pooled (a NaN would
    otherwise spread to the whole block), and a round past the horizon is no block's."""
    rows = [
        row("a-s0", "n0", 0, kl=0.2, tokens=10),
        row("a-s0", "n1", 0, kl=5.0, tokens=0),
        row("a-s0", "n1", 0, kl=None),
        row("a-s0", "n1", 0, kl=math.nan),
        row("a-s0", "n1", 0, weight_sq_mean=math.inf),
        row("a-s0", "n0", 24, kl=7.0),
    ]
    tables = drift_tables(frame(rows), RUNS, rounds=24)
    assert tables is not None
    (block,) = tables.blocks.to_dicts()
    assert block["kl"] == pytest.approx(0.2) and block["ess_fraction"] == pytest.approx(1.0)


def test_nodes_alone_still_bound_their_own_rows() -> None:
    rows = [row("alone-s0", "n0", 0, origin="local", kl=0.004)]
    tables = drift_tables(frame(rows), RUNS, rounds=24)
    assert tables is not None and tables.blocks.is_empty() and tables.runs_with_drift == 0
    text = "\n".join(drift_lines(tables))
    assert "| configuration |" not in text and "|KL| at most 4.0e-03" in text
    assert drift_tables(frame(rows).clear(), RUNS, rounds=24) is None  # before version 3
