"""The sample log: which peer groups each node drew, per round.

Kept beside the rollouts as newline-delimited JSON under ``_samples/`` so that a plain
``read_parquet('<root>/**/*.parquet')`` over the ledger sees rollouts only. Written once per
(node, round), so a retried round logs nothing new.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Final

import duckdb

from ledger.keys import digest, parse_key, partition_prefix
from ledger.sqltext import sql_list

PREFIX: Final = "_samples/"

COLUMNS_SQL: Final = (
    "{'node_round': 'BIGINT', 'group_id': 'VARCHAR', 'peer_node_id': 'VARCHAR', "
    "'policy': 'VARCHAR', 'seed': 'BIGINT', 'sampled_at': 'TIMESTAMPTZ'}"
)
TABLE_COLUMNS: Final = (
    "swarm_id VARCHAR, node_id VARCHAR, node_round BIGINT, group_id VARCHAR, "
    "peer_node_id VARCHAR, policy VARCHAR, seed BIGINT, sampled_at TIMESTAMPTZ, "
    "source_file VARCHAR"
)


def sample_log_key(swarm_id: str, node_id: str, node_round: int, when: datetime) -> str:
    name = f"s{node_round:08d}-{digest([swarm_id, node_id, str(node_round)], 12)}.jsonl"
    return f"{PREFIX}{partition_prefix(swarm_id, node_id, when.astimezone(UTC).date())}/{name}"


def is_sample_log(key: str) -> bool:
    """Whether ``key`` is a sample log placed as ``sample_log_key`` places them."""
    rel = key.removeprefix(PREFIX)
    return (
        key.startswith(PREFIX)
        and key.endswith(".jsonl")
        and parse_key(rel.removesuffix(".jsonl") + ".parquet") is not None
    )


def sample_log_lines(
    picks: list[tuple[str, str]], *, node_round: int, policy: str, seed: int, when: datetime
) -> bytes:
    """One JSON line per drawn group: (group_id, publishing node)."""
    stamp = when.astimezone(UTC).isoformat()
    lines = [
        json.dumps(
            {
                "node_round": node_round,
                "group_id": group_id,
                "peer_node_id": peer,
                "policy": policy,
                "seed": seed,
                "sampled_at": stamp,
            }
        )
        for group_id, peer in picks
    ]
    return ("\n".join(lines) + "\n").encode() if lines else b""


def ingest_sql(paths: list[str]) -> str:
    listed = sql_list(paths)
    return f"""INSERT INTO samples
        SELECT swarm_id, node_id, node_round, group_id, peer_node_id, policy, seed,
               sampled_at, filename
        FROM read_json({listed}, format = 'newline_delimited', columns = {COLUMNS_SQL},
                       hive_partitioning = true, filename = true, ignore_errors = true,
                       hive_types = {{'swarm_id': 'VARCHAR', 'node_id': 'VARCHAR',
                                      'day': 'DATE'}})
        WHERE group_id IS NOT NULL AND node_round IS NOT NULL"""


def ingest(con: duckdb.DuckDBPyConnection, paths: list[str]) -> list[tuple[str, str]]:
    """Add sample-log files to the ``samples`` table; return (path, error) for unreadable ones."""
    if not paths:
        return []
    try:
        con.execute(ingest_sql(paths))
        return []
    except duckdb.Error:
        pass  # one bad file spoils the batch: isolate it below
    bad: list[tuple[str, str]] = []
    for path in paths:
        try:
            con.execute(ingest_sql([path]))
        except duckdb.Error as exc:
            bad.append((path, str(exc).splitlines()[0][:300]))
    return bad
