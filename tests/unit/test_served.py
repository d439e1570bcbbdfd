"""A read of indexed groups checked against the index (ledger/served.py): draw order, one
copy per group, and the files whose groups are not what their index rows say."""

from __future__ import annotations

from typing import Any

import polars as pl

from ledger.served import in_draw_order


def rows(group: str, file: str, n: int, question: str = "q", start: int = 0) -> list[dict]:
    base: dict[str, Any] = {"task": "t", "task_config": "{}", "task_seed": 0, "task_index": 0}
    return [
        {**base, "group_id": group, "filename": file, "rollout_id": f"{group}-{start + i}",
         "completion": f"c{start + i}", "question": question, "answer": "a"}
        for i in range(n)
    ]  # fmt: skip


def test_groups_come_in_draw_order_from_their_indexed_file_only() -> None:
    frame = pl.DataFrame(rows("g1", "f1", 2) + rows("g2", "f2", 2) + rows("g1", "old", 2))
    served, bad = in_draw_order(frame, [("g1", "f1", 2), ("g2", "f2", 2)], ["g2", "g1"])
    assert served["rollout_id"].to_list() == ["g2-0", "g2-1", "g1-0", "g1-1"]
    assert set(served["filename"]) == {"f1", "f2"}  # the compacted-away copy is not served
    assert "_draw" not in served.columns and "_size" not in served.columns
    assert bad == []


def test_a_repeated_rollout_id_is_served_once_and_then_the_group_is_short() -> None:
    frame = pl.DataFrame(rows("g1", "f1", 2) + rows("g1", "f1", 1) + rows("g2", "f2", 2))
    served, bad = in_draw_order(frame, [("g1", "f1", 3), ("g2", "f2", 2)], ["g1", "g2"])
    assert served["rollout_id"].to_list() == ["g1-0", "g1-1", "g2-0", "g2-1"]
    assert bad == ["f1"]  # indexed with 3 rows, 2 distinct ones served


def test_files_whose_groups_differ_from_the_index_are_named() -> None:
    mixed = rows("g1", "f1", 1) + rows("g1", "f1", 1, question="other", start=1)
    frame = pl.DataFrame(mixed + rows("g2", "f2", 3) + rows("g4", "f4", 2))
    located = [("g1", "f1", 2), ("g2", "f2", 2), ("g3", "f3", 2), ("g4", "f4", 2)]
    served, bad = in_draw_order(frame, located, ["g1", "g2", "g3", "g4"])
    # f1: two questions in one group; f2: 3 rows where 2 were indexed; f3: nothing read
    assert bad == ["f1", "f2", "f3"]
    assert served.filter(pl.col("filename") == "f4").height == 2
