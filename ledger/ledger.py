"""The rollout ledger: publish a round's rows, sample peers' groups, query with SQL."""

from __future__ import annotations

from typing import Any

from ledger.config import LedgerConfig
from ledger.maintenance import LedgerMaintenance, ValidationReport
from ledger.reads import LedgerReads
from ledger.writes import LedgerWrites


class Ledger(LedgerWrites, LedgerReads, LedgerMaintenance):
    """A ledger as its config describes it (``LedgerConfig``: a local path, ``file://`` or
    ``s3://bucket/prefix``, and how to read it), optionally publishing as a node
    (``signer``) and keeping a reader index between runs (``index_path``).

    Reads are served from an incremental index of the files seen so far (each immutable
    file is validated once); every read call first lists the store for changes.

    - write side (ledger/writes.py): ``publish``, ``register_key``, ``declare_swarm``,
      ``write_manifest``, ``write_sample``, ``write_evaluation``, ``write_training``,
      ``collect_markers``;
    - read side (ledger/reads.py): ``sample`` and ``sample_group_ids`` (keyword arguments),
      ``draw`` and ``draw_group_ids`` (the same, as one typed `DrawRequest`), ``query``,
      ``evaluated_nodes``, ``refresh``;
    - maintenance (ledger/maintenance.py): ``validate``, ``compact``, ``compact_own``.
    """

    @classmethod
    def open(cls, url: str, **storage_options: Any) -> Ledger:
        """A ledger at ``url`` with default settings, for analysis: ``Ledger.open("./ledger")``,
        ``Ledger.open("s3://bucket/ledger", endpoint_url=..., key=..., secret=...)``."""
        return cls(LedgerConfig.model_validate({"url": url, "storage_options": storage_options}))


__all__ = ["Ledger", "ValidationReport"]
