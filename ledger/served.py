"""A read of indexed groups checked against the index, as pure data logic.

The catalog reads the rows of the groups a sampler drew from the files they were indexed
from; what comes back is a peer's file read a second time, so it is checked again here:
each group must have the size its index row says and rows of one question, or its file is
named for the catalog to condemn.
"""

from __future__ import annotations

import polars as pl

CONSISTENT_COLUMNS = ("task", "task_config", "task_seed", "task_index", "question", "answer")
"""Columns every row of a served group shares (the question it answers)."""


def in_draw_order(
    rows: pl.DataFrame, located: list[tuple[str, str, int]], group_ids: list[str]
) -> tuple[pl.DataFrame, list[str]]:
    """The ``rows`` read (with their ``filename``) of each group in ``located`` (group id,
    its indexed file, its indexed size), from that file only and in the order of
    ``group_ids``; a rollout id a peer repeated inside its file is served once. Also the
    files whose served group is not as indexed, sorted (their rows are still in the frame).
    """
    # Compaction may leave a group in two files for a while: each comes from its indexed one.
    draw_order = {g: i for i, g in enumerate(group_ids)}
    chosen = pl.DataFrame(
        {
            "group_id": [g for g, _, _ in located],
            "filename": [f for _, f, _ in located],
            "_draw": [draw_order[g] for g, _, _ in located],
            "_size": [n for _, _, n in located],
        },
        schema_overrides={"_size": pl.Int64},
    )
    served = (
        rows.join(chosen, on=["group_id", "filename"], how="inner")
        .sort(["_draw", "rollout_id", "completion"])
        .unique(subset="rollout_id", keep="first", maintain_order=True)
    )
    return served.drop("_draw", "_size"), _not_as_indexed(served, chosen)


def _not_as_indexed(served: pl.DataFrame, chosen: pl.DataFrame) -> list[str]:
    """Files with a served group not of its indexed size, or not of one question, or
    missing from what was read."""
    summary = served.group_by("group_id", "filename").agg(
        pl.len().alias("rows"),
        pl.col("_size").first(),
        *(pl.col(c).n_unique().alias(f"n_{c}") for c in CONSISTENT_COLUMNS),
    )
    bad = summary.filter(
        (pl.col("rows") != pl.col("_size"))
        | pl.any_horizontal(pl.col(f"n_{c}") > 1 for c in CONSISTENT_COLUMNS)
    )
    missing = chosen.join(served, on=["group_id", "filename"], how="anti")
    return sorted(set(bad["filename"].to_list()) | set(missing["filename"].to_list()))
