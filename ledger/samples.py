"""The sample log: which peer groups each node drew, per round.

Kept beside the rollouts as newline-delimited JSON under ``_samples/`` so that a plain
``read_parquet('<root>/**/*.parquet')`` over the ledger sees rollouts only. Written once per
(node, round), through the one writer of node logs (``Ledger.write_sample``), so a retried
round logs nothing new, even on another day. One of the node logs of ledger/node_logs.py
(``SAMPLES``), which reads it; here is what a line of it holds.
"""

from __future__ import annotations

from typing import Any


def sample_rows(
    picks: list[tuple[str, str]],
    contents: dict[str, str],
    *,
    policy: str,
    seed: int,
    keys: dict[str, list[str]] | None = None,
) -> list[dict[str, Any]]:
    """One row per drawn group: (group_id, publishing node), what it said (``contents``: its
    content digest by group id, ledger/validation.py; ``keys``: its rows' completion keys as
    hex), the policy's kind and the seed. The digest and the keys are what `fresh`
    remembers, so that neither a copy under other ids nor a completion wrapped in another
    group is fresh; logs written before them had none."""
    return [
        {
            "group_id": group_id,
            "peer_node_id": peer,
            "content_digest": contents[group_id],
            "policy": policy,
            "seed": seed,
            "completion_keys": ",".join(sorted((keys or {}).get(group_id, []))) or None,
        }
        for group_id, peer in picks
    ]
