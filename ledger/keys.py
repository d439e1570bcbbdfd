"""Where objects live: the Hive layout ``swarm_id=S/node_id=N/day=D/NAME.parquet``.

Publisher and day come first because sampling and analysis filter on them most (DuckDB
prunes whole directories by them). Each node writes only under its own
``swarm_id=S/node_id=N/`` prefix. File names are digests of their content's identity, so a
retried publish lands on the same key and becomes a no-op.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date

from ledger.schema import check_id

_KEY = re.compile(
    r"^swarm_id=(?P<swarm_id>[^/=]+)/node_id=(?P<node_id>[^/=]+)/"
    r"day=(?P<day>\d{4}-\d{2}-\d{2})/(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,199}\.parquet)$"
)
"""File names are as strict as ids: a name a peer chose is pasted into DuckDB's file lists
and handed to the store, where ``*``, ``?``, ``[`` glob and NUL or quotes break the SQL."""
_SAFE_KEY = re.compile(
    r"^[A-Za-z0-9_][A-Za-z0-9._=-]{0,254}(/[A-Za-z0-9_][A-Za-z0-9._=-]{0,254}){0,15}$"
)


@dataclass(frozen=True)
class KeyParts:
    swarm_id: str
    node_id: str
    day: date
    name: str

    @property
    def partition(self) -> str:
        return partition_prefix(self.swarm_id, self.node_id, self.day)


def node_prefix(swarm_id: str, node_id: str) -> str:
    return f"swarm_id={check_id('swarm_id', swarm_id)}/node_id={check_id('node_id', node_id)}"


def partition_prefix(swarm_id: str, node_id: str, day: date) -> str:
    return f"{node_prefix(swarm_id, node_id)}/day={day.isoformat()}"


def digest(items: Iterable[str], length: int = 20) -> str:
    h = hashlib.sha256()
    for item in sorted(items):
        h.update(item.encode())
        h.update(b"\0")
    return h.hexdigest()[:length]


def round_key(
    swarm_id: str, node_id: str, day: date, first_round: int, rollout_ids: Iterable[str]
) -> str:
    """Key of a published batch: its round, then a digest of the rollout ids it holds."""
    name = f"r{first_round:08d}-{digest(rollout_ids)}.parquet"
    return f"{partition_prefix(swarm_id, node_id, day)}/{name}"


def compacted_key(partition: str, input_keys: Iterable[str]) -> str:
    """Key of a compaction output: a digest of the inputs, so a rerun after a crash reuses it."""
    return f"{partition}/c-{digest(input_keys)}.parquet"


def is_safe_key(key: str) -> bool:
    """Whether ``key`` may be handed to a store or to DuckDB at all.

    Every segment starts with a letter, digit or underscore (so no ``.`` / ``..`` segment and
    no hidden file) and holds only ``[A-Za-z0-9._=-]``: no glob characters, quotes, control
    characters or empty segments. Readers skip any other key without touching it.
    """
    return _SAFE_KEY.match(key) is not None


def parse_key(key: str) -> KeyParts | None:
    """The parts of a well-placed key, or None for an object outside the layout."""
    match = _KEY.match(key)
    if match is None:
        return None
    try:
        return KeyParts(
            swarm_id=check_id("swarm_id", match["swarm_id"]),
            node_id=check_id("node_id", match["node_id"]),
            day=date.fromisoformat(match["day"]),
            name=match["name"],
        )
    except ValueError:
        return None


def object_place(key: str) -> tuple[str, str] | None:
    """(swarm, node) of an object a node writes under its own prefix: a rollout file
    (``swarm_id=S/node_id=N/...``) or an object under a top-level prefix of node objects
    (``_manifests/swarm_id=S/node_id=N/...``, node logs); None for any other key."""
    parts = key.split("/")
    if parts and parts[0].startswith("_"):
        parts = parts[1:]
    if (
        len(parts) < 3
        or not parts[0].startswith("swarm_id=")
        or not parts[1].startswith("node_id=")
    ):
        return None
    try:
        swarm = check_id("swarm_id", parts[0].removeprefix("swarm_id="))
        node = check_id("node_id", parts[1].removeprefix("node_id="))
    except ValueError:
        return None
    return swarm, node
