"""A ledger's maintenance: what every object is found to be (``validate``), and compaction
of small files (ledger/compaction.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from ledger import compaction, identity, validation
from ledger.handle import LedgerHandle, serialized
from ledger.keys import node_prefix


@dataclass
class ValidationReport:
    files: int = 0
    ok_files: int = 0
    rows: int = 0
    valid_rows: int = 0
    groups: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    bad_files: list[tuple[str, str, str]] = field(default_factory=list)
    """(key, status, detail) of every file skipped whole."""

    @property
    def clean(self) -> bool:
        return not self.skipped


class LedgerMaintenance(LedgerHandle):
    @serialized
    def validate(self) -> ValidationReport:
        """Examine every object: what is readable, and what is skipped and why."""
        self.refresh()
        report = ValidationReport()
        for state in self.catalog.files.values():
            report.files += 1
            if state.status == "ok":
                report.ok_files += 1
                report.rows += state.rows
            else:
                report.bad_files.append((state.key, state.status, state.detail))
        report.skipped = self.catalog.rejection_counts()
        for key, detail in sorted(self.catalog.registry.changed.items()):
            report.bad_files.append((key, identity.REWRITTEN, detail))
            report.skipped[identity.REWRITTEN] += 1
        for key in sorted(self.store.unsafe_keys):
            report.bad_files.append((key, validation.UNSAFE_KEY, "key refused unread"))
            report.skipped[validation.UNSAFE_KEY] += 1
        for bad in self.catalog.manifests.skipped.values():
            report.bad_files.append((bad.key, bad.reason, bad.detail))
            report.skipped[bad.reason] += 1
        for key, problem in sorted(self.catalog.log_problems().items()):
            if problem.lines:
                report.skipped[problem.reason] += problem.lines
            else:
                report.bad_files.append((key, problem.reason, problem.detail))
                report.skipped[problem.reason] += 1
        row = self.con.execute("SELECT count(*), coalesce(sum(size), 0) FROM groups").fetchone()
        assert row is not None
        report.groups, report.valid_rows = int(row[0]), int(row[1])
        return report

    def compact_own(
        self, swarm_id: str, node_id: str, at_files: int
    ) -> compaction.CompactionReport:
        """Merge the node's partitions, today's included, if one holds ``at_files`` small
        files or more; what a node does after it publishes (``compact_at_files``)."""
        if at_files < 2:
            return compaction.CompactionReport()
        prefix = node_prefix(swarm_id, node_id) + "/"
        per_partition = Counter(
            o.key.rsplit("/", 1)[0]
            for o in self._store_call(f"listing {prefix}", self.store.list, prefix)
            if o.key.endswith(".parquet")
        )
        if not per_partition or max(per_partition.values()) < at_files:
            return compaction.CompactionReport()
        tomorrow = datetime.now(UTC).date() + timedelta(days=1)
        return self.compact([node_id], swarm_id=swarm_id, before=tomorrow, min_files=at_files)

    @serialized
    def compact(
        self,
        node_ids: list[str] | None = None,
        *,
        swarm_id: str | None = None,
        all_nodes: bool = False,
        before: date | None = None,
        min_files: int = 2,
        target_rows: int = 1_000_000,
    ) -> compaction.CompactionReport:
        """Merge small files of partitions older than ``before`` (default: today, UTC).

        Only ``node_ids``' partitions are rewritten unless ``all_nodes`` is set. A swarm that
        requires signatures is compacted only by its own nodes (this ledger's ``signer``):
        anyone else's merged file would be unsigned, and readers would drop it.
        """
        if not all_nodes and not node_ids:
            raise ValueError("name the nodes whose data to compact, or pass all_nodes=True")
        nodes = None
        if not all_nodes:
            self.refresh()
            swarms = (
                {swarm_id}
                if swarm_id
                else {
                    s.key.split("/", 1)[0].removeprefix("swarm_id=")
                    for s in self.catalog.files.values()
                }
            )
            nodes = {(s, n) for s in swarms for n in node_ids or []}
        return compaction.compact(
            self.catalog,
            nodes=nodes,
            before=before or datetime.now(UTC).date(),
            min_files=min_files,
            target_rows=target_rows,
            signer=self.signer,
        )
