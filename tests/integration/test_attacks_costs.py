"""Issue 27, costs bounded before they are paid: a file within every limit its footer
declares can still cost what decoding it costs, or what parsing its footer costs.

Both failed on main at 2825c99: the repeated string was served (11.6 GB of text decoded from
a 0.4 MB file), the 4 MB footer was parsed at every read.
"""

from __future__ import annotations

import time

import pytest

from ledger import RowLimits
from ledger import validation as v
from ledger.changes import marker_key
from tests import hostile
from tests.conftest import LedgerSite
from tests.factories import round_rows
from tests.integration.test_attacks import assert_serves_the_honest_data
from tests.netproxy import ForbiddingProxy

plant = hostile.plant


def bad_files(reader) -> dict[str, tuple[str, str]]:
    return {key: (status, detail) for key, status, detail in reader.validate().bad_files}


def test_text_is_counted_as_decoded_not_as_the_footer_declares(site):
    honest = hostile.seed_honest(site.open())
    data = hostile.repeated_text(2000, 32_000)  # 64 MB of text in a file of a few KB
    assert len(data) < 2**20
    key = plant(honest, "r0-repeated.parquet", data)
    # Within the footer's measure (what main checked), beyond the decoded one.
    reader = site.open(limits=RowLimits(max_uncompressed_bytes=8 * 2**20, max_text_bytes=2**24))
    assert_serves_the_honest_data(reader)
    status, detail = bad_files(reader)[key]
    assert status == v.OVERSIZED_CONTENT and "text bytes decoded" in detail
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_id = 'evil'").item() == 0


def test_honest_text_is_measured_and_kept(site):
    honest = hostile.seed_honest(site.open())
    plant(honest, "r0-repeated.parquet", hostile.repeated_text(20, 1000))
    reader = site.open(limits=RowLimits(max_text_bytes=2**20))
    assert reader.query("SELECT count(*) FROM rollouts WHERE node_id = 'evil'").item() == 20
    # What compaction sizes its merged files by: at least the decoded text.
    (state,) = [s for s in reader.catalog.files.values() if "repeated" in s.key]
    assert state.unpacked >= 20 * 1000


def test_a_footer_of_megabytes_is_refused_before_it_is_parsed(site):
    honest = hostile.seed_honest(site.open())
    data = hostile.many_row_groups(600, 40)
    footer = int.from_bytes(data[-8:-4], "little")
    assert footer > 3 * 2**20  # ~3.7 MB: 600 row groups x 59 columns
    key = plant(honest, "r0-rowgroups.parquet", data)
    reader = site.open()
    assert_serves_the_honest_data(reader)
    status, detail = bad_files(reader)[key]
    assert status == v.OVERSIZED_CONTENT and f"{footer} footer bytes" in detail


def test_honest_footers_are_far_below_the_bound(site):
    led = site.open()
    led.publish(hostile.to_table(hostile.round_rows("n1", 0, [[1, 0]] * 200)))
    reader = site.open()
    (state,) = reader.catalog.files.values() if reader.validate() else ()
    data = reader.store.read(state.key)
    assert int.from_bytes(data[-8:-4], "little") < RowLimits().max_footer_bytes // 100


@pytest.mark.s3
def test_an_object_the_reader_may_not_read_is_skipped_alone(s3_server, s3_site):
    """A peer's object that the store refuses to serve (403: a bucket policy, an object
    owned by another account) is one bad object; the rest of the ledger is read."""
    honest = hostile.seed_honest(s3_site.open())
    plant(honest, "r0-forbidden.parquet", hostile.parquet_bytes(hostile.attacker_table()))
    proxy = ForbiddingProxy(s3_server.endpoint_url, "forbidden")
    try:
        options = {**s3_site.storage_options, "endpoint_url": proxy.url}
        reader = LedgerSite(s3_site.url, options, "s3").open()
        assert_serves_the_honest_data(reader)  # was StoreUnusable on every read
        status, detail = bad_files(reader)[f"{hostile.PREFIX}/r0-forbidden.parquet"]
        assert status == v.CORRUPT and "refused" in detail
        assert proxy.refused >= 1
    finally:
        proxy.close()


@pytest.mark.s3
def test_markers_stamped_far_ahead_cost_a_poll_nothing(s3_site):
    """A flood of change-log markers dated next year (any peer may write markers): a poll
    stops listing at its horizon instead of paging through them at every refresh."""
    honest = hostile.seed_honest(s3_site.open())
    inner = honest.store.inner
    future_ms = int((time.time() + 365 * 86400) * 1000)
    root = f"{inner.bucket}/{inner.prefix}"
    inner.fs.pipe(
        {
            f"{root}/{marker_key(f'{hostile.PREFIX}/r{i}-x.parquet', True, future_ms + i)}": b""
            for i in range(2500)
        }
    )
    reader = s3_site.open()
    reader.refresh()  # the first refresh lists the store fully
    reader.store._listed_fully_at = time.time()  # as if it had just done so: the next polls
    for _ in range(3):
        honest.publish(round_rows("good1", 1, [[0, 1]]))
        reader.refresh()
        assert reader.store.feed.last["list"] == 1  # was 3 (1,000 markers a page)
    # The honest rows and good1's new round (published once: retries write nothing).
    assert reader.query("SELECT count(*) FROM rollouts").item() == 9 + 2
