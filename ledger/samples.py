"""The sample log: which peer groups each node drew, per round.

Kept beside the rollouts as newline-delimited JSON under ``_samples/`` so that a plain
``read_parquet('<root>/**/*.parquet')`` over the ledger sees rollouts only. Written once per
(node, round), so a retried round logs nothing new. One of the node logs of
ledger/node_logs.py (``SAMPLES``), which reads and writes it; these names remain for callers.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

import duckdb

from ledger.node_logs import SAMPLES

PREFIX: Final = SAMPLES.prefix
TABLE_COLUMNS: Final = SAMPLES.table_columns


def sample_log_key(swarm_id: str, node_id: str, node_round: int, when: datetime) -> str:
    return SAMPLES.key(swarm_id, node_id, node_round, when)


def is_sample_log(key: str) -> bool:
    """Whether ``key`` is a sample log placed as ``sample_log_key`` places them."""
    return SAMPLES.is_key(key)


def sample_log_lines(
    picks: list[tuple[str, str]], *, node_round: int, policy: str, seed: int, when: datetime
) -> bytes:
    """One JSON line per drawn group: (group_id, publishing node)."""
    return SAMPLES.lines(
        (
            {
                "node_round": node_round,
                "group_id": group_id,
                "peer_node_id": peer,
                "policy": policy,
                "seed": seed,
            }
            for group_id, peer in picks
        ),
        when,
    )


def ingest_sql(paths: list[str]) -> str:
    return SAMPLES.ingest_sql(paths)


def ingest(con: duckdb.DuckDBPyConnection, paths: list[str]) -> list[tuple[str, str]]:
    """Add sample-log files to the ``samples`` table; return (path, error) for unreadable ones."""
    return [
        (path, problem.detail)
        for path, problem in SAMPLES.ingest(con, paths).items()
        if not problem.lines
    ]
