"""Which failures are a stop signal in disguise (flows/stops.stop_signal): a Ctrl-C that
lands in a DuckDB query comes out as DuckDB's RuntimeError, and must still read as a stop
(`sapo experiment`, `sapo node`, `sapo ledger query`: exit 130, where to resume), not as an
error."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from prefect.exceptions import TerminationSignal

from flows.stops import stop_signal

LONG_QUERY = """
import duckdb
from flows.stops import stop_signal
print("querying", flush=True)
try:
    duckdb.sql("SELECT count(*) FROM range(100000000000) t(i) WHERE i % 7 = 3").fetchall()
except BaseException as exc:
    print(type(exc).__name__, stop_signal(exc), flush=True)
"""


def test_a_ctrl_c_in_a_duckdb_query_reads_as_a_stop() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", LONG_QUERY], stdout=subprocess.PIPE, text=True, cwd="."
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "querying"
    time.sleep(1.0)  # inside the query (it would run for minutes)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    # DuckDB 1.5 raises RuntimeError('Query interrupted') from the KeyboardInterrupt.
    assert out.split() in (["RuntimeError", "SIGINT"], ["KeyboardInterrupt", "SIGINT"]), out


def test_what_a_stop_raised_directly_or_through_a_chain_is() -> None:
    interrupt = KeyboardInterrupt()
    assert stop_signal(interrupt) == "SIGINT"
    term = TerminationSignal(signal=signal.SIGTERM)
    try:
        try:
            raise term
        except TerminationSignal:
            raise OSError("a write cut short") from None  # context kept, cause suppressed
    except OSError as exc:
        assert stop_signal(exc) == "SIGTERM"  # found through the context: OSError is none


def test_an_ordinary_failure_is_no_stop_even_in_a_cycle() -> None:
    assert stop_signal(RuntimeError("Query interrupted")) is None  # the words alone say nothing
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    assert stop_signal(first) is None
