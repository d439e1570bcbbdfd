"""Issue 27, values out of range: a peer's file of the right types whose numbers or times no
reader, node or report can convert or add. Each is skipped with a counted reason; nothing a
row holds stops a reader, a node's round or a report.

Each test failed on main at 2825c99 (a panic in polars' datetime conversion, an OverflowError,
an INT64 overflow in the report).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from flows.node.steps import peer_groups
from flows.reports.report import report_ledger
from ledger import validation as v
from ledger.records import to_table
from ledger.synthetic import synthetic_round
from tests import hostile
from tests.factories import round_rows
from tests.integration.test_attacks import assert_serves_the_honest_data

plant = hostile.plant


@pytest.fixture
def honest(site):
    return hostile.seed_honest(site.open())


@pytest.mark.parametrize(
    "micros", [hostile.YEAR_10000_US, hostile.INT64_MAX], ids=["year-10000", "int64-max"]
)
def test_a_publish_time_outside_the_calendar_is_skipped_and_converts_nowhere(site, honest, micros):
    plant(honest, "r0-time.parquet", hostile.stamped_at(micros))
    reader = site.open()
    assert reader.validate().skipped[v.INVALID_TIME] == 2
    assert_serves_the_honest_data(reader)
    # What `sapo ledger query "SELECT * FROM rollouts"` and `sapo ledger sample` print.
    every = reader.query("SELECT * FROM rollouts")
    assert every.height == hostile_rows(reader) and "evil" not in every["node_id"].to_list()
    drawn = reader.sample("me", 10, seed=3, swarm_id="sw")
    assert drawn.rows()  # converts to Python values, as the CLI prints them


def hostile_rows(reader) -> int:
    return int(reader.query("SELECT count(*) FROM rollouts").item())


def test_a_publisher_cannot_publish_a_time_readers_skip(site):
    led = site.open()
    stamp = datetime(2250, 1, 1, tzinfo=UTC)
    with pytest.raises(Exception, match=v.INVALID_TIME):
        led.publish(to_table(round_rows("n1", 0, [[1, 0]], published_at=stamp)))


def test_a_node_drops_rows_it_cannot_convert_and_keeps_the_rest():
    """The node's last line: whatever a drawn frame holds, the round goes on."""
    good = synthetic_round("sw", "peer", 0, n_groups=2, group_size=2, skill=0.5, seed=1)
    frame = pl.from_arrow(good)
    assert isinstance(frame, pl.DataFrame)
    # A timestamp polars holds but Python cannot (beyond year 9999), and a round no int holds.
    beyond = pl.Series("published_at", [hostile.INT64_MAX] * frame.height).cast(
        pl.Datetime("us", "UTC")
    )
    frame = frame.with_columns(beyond)
    frame = frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 0)
        .then(None)
        .otherwise(pl.col("node_round"))
        .alias("node_round")
    )
    with pytest.raises(BaseException, match="overflow"):
        frame.rows()  # what converting every column did: a pyo3 PanicException
    groups, dropped = peer_groups(frame)
    assert dropped == 1
    assert sum(len(g.rollouts) for g in groups) == frame.height - 1


def test_a_round_of_int64_max_is_skipped_and_the_report_adds_up(local_site, tmp_path: Path):
    led = hostile.seed_honest(local_site.open())
    plant(led, "r1-endless.parquet", hostile.endless_round())
    reader = local_site.open()
    assert reader.validate().skipped[v.INVALID_VALUE] == 2
    assert reader.query("SELECT max(node_round) FROM rollouts").item() == 0
    report = report_ledger(local_site.url, tmp_path / "out")  # overflowed on INT64 sums
    assert {row["swarm_id"] for row in report.summary} == {"sw"}
    assert max(row["rounds"] for row in report.summary) == 1
