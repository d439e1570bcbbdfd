"""A node's backlog: what it could not write to an unreachable ledger, kept on local disk.

SAPO nodes never wait for each other, and a node whose ledger is down should not wait for
the ledger either: it trains that round on its own groups (J = 0) and keeps what it would
have written (its round's rollouts, its training and evaluation logs) under
``<workdir>/nodes/<node>/backlog/``. The next time it writes to the ledger it first writes
the backlog, oldest first; every ledger write is write-once, so a backlog written twice (a
crash between the write and the deletion) adds nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from flows.node.files import write_atomically
from ledger import Ledger, StorageError, StoreUnusable
from ledger.records import to_table

log = logging.getLogger(__name__)

LOG_KINDS = ("training", "evaluation")


def is_outage(exc: BaseException) -> bool:
    """A ledger failure worth riding out: the store did not answer (not a refusal, such as
    a missing bucket or bad credentials, which waiting does not fix)."""
    return isinstance(exc, StorageError) and not isinstance(exc, StoreUnusable)


@dataclass
class Outage:
    """What ``riding_out`` caught: the ledger's failure, or None if it answered."""

    error: StorageError | None = None

    def __bool__(self) -> bool:
        return self.error is not None


@contextmanager
def riding_out() -> Iterator[Outage]:
    """Run the block; an outage of the ledger (``is_outage``) ends it quietly and is left in
    the yielded ``Outage`` for the caller's fallback; any other failure propagates.

        with riding_out() as down:
            keys = node.ledger.publish(rows)
        if down:
            node.backlog.add_rows(round_, rows)  # written when the ledger answers again
    """
    outage = Outage()
    try:
        yield outage
    except StorageError as exc:
        if not is_outage(exc):
            raise
        outage.error = exc


def log_writer(ledger: Ledger, kind: str) -> Any:
    """The ledger's writer of one node log kind (``LOG_KINDS``)."""
    if kind not in LOG_KINDS:
        raise ValueError(f"unknown node log {kind!r}")
    return ledger.write_training if kind == "training" else ledger.write_evaluation


class Backlog:
    def __init__(self, root: Path) -> None:
        self.root = root

    def files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.suffix in (".parquet", ".json"))

    def __len__(self) -> int:
        return len(self.files())

    def add_rows(self, node_round: int, rows: list[dict[str, Any]]) -> Path:
        """Keep a round's rollouts (as ``Ledger.publish`` takes them)."""
        path = self.root / f"r{node_round:08d}-rollouts.parquet"
        self._write(path, lambda tmp: pq.write_table(to_table(rows), tmp))
        log.warning("ledger unreachable: round %d's rollouts kept in %s", node_round, path)
        return path

    def add_log(
        self,
        kind: str,
        swarm_id: str,
        node_id: str,
        node_round: int,
        rows: Sequence[Mapping[str, Any]],
    ) -> Path:
        """Keep a node log write (``Ledger.write_training`` / ``write_evaluation``)."""
        if kind not in LOG_KINDS:
            raise ValueError(f"unknown node log {kind!r}")
        path = self.root / f"r{node_round:08d}-{kind}.json"
        record = {
            "swarm_id": swarm_id,
            "node_id": node_id,
            "node_round": node_round,
            "rows": [dict(row) for row in rows],
        }
        self._write(path, lambda tmp: Path(tmp).write_text(json.dumps(record, default=str)))
        log.warning("ledger unreachable: round %d's %s log kept in %s", node_round, kind, path)
        return path

    def flush(self, ledger: Ledger) -> int:
        """Write the backlog to ``ledger``, oldest first; returns the files written. Stops
        at (and raises) the first failure: what is left stays for the next try."""
        written = 0
        for path in self.files():
            if path.suffix == ".parquet":
                ledger.publish(pq.read_table(path))
            else:
                record = json.loads(path.read_text())
                kind = path.stem.rsplit("-", 1)[1]
                log_writer(ledger, kind)(
                    record["swarm_id"], record["node_id"], record["node_round"], record["rows"]
                )
            path.unlink()
            written += 1
        if written:
            log.info("wrote %d backlogged files to the ledger", written)
        return written

    def _write(self, path: Path, write: Any) -> None:
        write_atomically(path, write)
