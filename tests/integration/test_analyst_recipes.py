"""The docs' recipes for reading the ledger with plain DuckDB and polars run as written
(docs/ledger.md; issue 61: one truncated `.parquet` made every plain query fail, and node
logs carried their node only in their path, so polars' `read_ndjson` lost it)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

from ledger import Ledger
from tests.factories import T0, round_rows
from tests.integration.test_node_logs import training

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ledger.md"


def recipe(name: str, ledger_url: str) -> dict[str, object]:
    """Run the docs' block after ``<!-- analyst:NAME -->`` over ``ledger_url``; its names."""
    found = re.search(rf"<!-- analyst:{name} -->\n```python\n(.*?)```", DOCS.read_text(), re.S)
    assert found, f"docs/ledger.md has no analyst:{name} block"
    code = found.group(1).replace('url = "sapo-work/ledger"', f"url = {ledger_url!r}")
    names: dict[str, object] = {}
    exec(compile(code, f"docs/ledger.md:{name}", "exec"), names)
    return names


@pytest.fixture
def damaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ledger of two nodes' rounds and trainings, one of whose files is cut short."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    url = str(tmp_path / "ledger")
    with Ledger.open(url) as led:
        for node in ("n1", "n2"):
            for node_round in (0, 1):
                led.publish(round_rows(node, node_round, [[1, 0], [1, 1]]))
                rows = [training(f"sw.{node}.r{node_round}.g0", "local", node, 0.5, True)]
                led.write_training("sw", node, node_round, rows, now=T0)
    victim = sorted(Path(url).rglob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    return url


def test_plain_tools_fail_on_a_damaged_file_and_the_recipe_reads_around_it(damaged: str):
    everything = f"read_parquet('{damaged}/**/*.parquet', hive_partitioning = true)"
    with pytest.raises(duckdb.Error):
        duckdb.sql(f"SELECT count(*) FROM {everything}").fetchall()
    names = recipe("admitted", damaged)
    rows = names["rows"]
    assert isinstance(rows, pl.DataFrame)
    # three of the four rounds are whole; the damaged one is left out, not the whole query
    assert rows.height == 3 and set(rows["node_id"]) == {"n1", "n2"}
    same = names["same"]
    assert isinstance(same, pl.DataFrame) and same["len"].sum() == 3 * 4


def test_node_logs_read_with_their_node_as_a_column(damaged: str):
    names = recipe("node-logs", damaged)
    for frame in (names["trainings"], names["logged"]):
        assert isinstance(frame, pl.DataFrame)
        assert sorted(frame.select("node_id", "node_round").rows()) == [
            ("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1),
        ]  # fmt: skip
