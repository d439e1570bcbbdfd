"""The sample log: which peer groups each node drew, per round.

Kept beside the rollouts as newline-delimited JSON under ``_samples/`` so that a plain
``read_parquet('<root>/**/*.parquet')`` over the ledger sees rollouts only. Written once per
(node, round), so a retried round logs nothing new. One of the node logs of
ledger/node_logs.py (``SAMPLES``), which reads it; here is what a line of it holds.
"""

from __future__ import annotations

from datetime import datetime

from ledger.node_logs import SAMPLES


def sample_log_key(swarm_id: str, node_id: str, node_round: int, when: datetime) -> str:
    return SAMPLES.key(swarm_id, node_id, node_round, when)


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
