"""Compaction: merge the many small files of older partitions into few large ones.

Safe beside running readers: the merged object is written (atomically, write-once) before
any input is deleted, readers deduplicate groups and rollout ids across files, and a reader
whose file vanished between listing and reading re-lists and retries. A crash between the
two steps leaves both copies, which the next run merges again. Only the named nodes'
partitions are touched unless the operator asks for all. The JSON-lines logs beside the
rollouts (``_samples/``, ``_evaluations/``, ``_trainings/``, ``_manifests/``) are never
compacted: only the catalog's rollout files are planned.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import duckdb

from ledger import identity
from ledger.catalog import Catalog
from ledger.keys import compacted_key, parse_key
from ledger.sqltext import PUBLIC_COLUMNS_SQL, scan_sql, sql_list
from ledger.storage import OversizedObject, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileRef:
    key: str
    rows: int
    unpacked: int = 0
    """Bytes its public columns decompress to (from its footer)."""


@dataclass(frozen=True)
class CompactionJob:
    partition: str
    inputs: tuple[str, ...]

    @property
    def output(self) -> str:
        return compacted_key(self.partition, self.inputs)


@dataclass
class CompactionReport:
    jobs: int = 0
    files_in: int = 0
    files_out: int = 0
    rows: int = 0
    skipped_partitions: list[str] = field(default_factory=list)
    """Partitions left as they were because they changed (or failed a check) meanwhile."""
    unsigned_partitions: list[str] = field(default_factory=list)
    """Partitions of a swarm that requires signatures, left because only their node (with
    its key) can sign the merged file."""


def plan_compaction(
    files: Iterable[FileRef],
    *,
    nodes: set[tuple[str, str]] | None,
    before: date | None,
    min_files: int = 2,
    target_rows: int = 1_000_000,
    target_bytes: int | None = None,
) -> list[CompactionJob]:
    """Which files to merge: per partition (swarm, node, day) older than ``before``.

    ``nodes`` limits the work to those (swarm_id, node_id) prefixes; None means every node.
    Inputs are cut into chunks of at most ``target_rows`` rows and ``target_bytes``
    uncompressed, so that readers, who refuse larger files, can read every output.
    """
    by_partition: dict[str, list[FileRef]] = {}
    for ref in files:
        parts = parse_key(ref.key)
        if parts is None:
            continue
        if nodes is not None and (parts.swarm_id, parts.node_id) not in nodes:
            continue
        if before is not None and parts.day >= before:
            continue
        by_partition.setdefault(parts.partition, []).append(ref)

    jobs = []
    for partition, refs in sorted(by_partition.items()):
        # Files already at the target size stay as they are.
        small = sorted((r for r in refs if r.rows < target_rows), key=lambda r: r.key)
        if len(small) < min_files:
            continue
        chunk: list[str] = []
        rows = unpacked = 0
        for ref in small:
            too_big = rows + ref.rows > target_rows or (
                target_bytes is not None and unpacked + ref.unpacked > target_bytes
            )
            if chunk and too_big:
                if len(chunk) >= 2:
                    jobs.append(CompactionJob(partition, tuple(chunk)))
                chunk, rows, unpacked = [], 0, 0
            chunk.append(ref.key)
            rows += ref.rows
            unpacked += ref.unpacked
        if len(chunk) >= 2:  # a lone leftover file has nothing to merge with
            jobs.append(CompactionJob(partition, tuple(chunk)))
    return jobs


class UnverifiedInput(ValueError):
    """An input of a signing compaction that its node's key did not sign (or that changed
    since it was indexed): the job is skipped rather than vouch for bytes no one checked."""


def _local_copy(folder: Path, job: CompactionJob, i: int) -> Path:
    """Where input ``i`` is copied: under its partition's path, which readers take the
    swarm, node and day from."""
    path = folder / job.partition / f"in-{i}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _fetch_inputs(
    catalog: Catalog, job: CompactionJob, folder: Path, signer: identity.NodeKey | None
) -> dict[str, str]:
    """Copy ``job``'s inputs into ``folder``, each checked against what was indexed (size,
    and with a ``signer`` its own signature over the bytes); key -> SHA-256.

    The merge reads these copies, never the store: what is merged (and signed) is exactly
    what was checked, however the objects change meanwhile.
    """
    digests = {}
    public = signer.private.public_key() if signer is not None else None
    for i, key in enumerate(job.inputs):
        state = catalog.files.get(key)
        if state is None:
            raise UnverifiedInput(f"{key} changed since it was indexed")
        found = catalog.admission.read_checked(state, public)
        if isinstance(found, tuple):
            raise UnverifiedInput(f"{key}: {found[0]} ({found[1]})")
        _local_copy(folder, job, i).write_bytes(found)
        digests[key] = identity.sha256_of(found)
    return digests


def run_job(catalog: Catalog, job: CompactionJob, signer: identity.NodeKey | None = None) -> int:
    """Merge ``job.inputs`` into ``job.output`` (signed by ``signer`` if given), then delete
    the inputs and their signatures. Returns rows written.

    UnverifiedInput if an input vanished (another compactor got there first), is not what
    was indexed, or is not signed by ``signer``.
    """
    store, con = catalog.store, catalog.con
    with tempfile.TemporaryDirectory(prefix="sapo-compact-") as tmp:
        folder = Path(tmp)
        digests = _fetch_inputs(catalog, job, folder, signer)
        paths = [str(_local_copy(folder, job, i)) for i in range(len(job.inputs))]
        merged = f"""SELECT {PUBLIC_COLUMNS_SQL} FROM ({scan_sql(sql_list(paths))})
            QUALIFY rollout_id IS NULL
                 OR row_number() OVER (PARTITION BY rollout_id ORDER BY filename, completion) = 1
            ORDER BY group_id, rollout_id"""
        out = folder / "merged.parquet"
        con.execute(
            f"COPY ({merged}) TO '{out}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 8192)"
        )
        written = con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()
        expected = con.execute(f"SELECT count(*) FROM ({merged})").fetchone()
        if written is None or expected is None or written[0] != expected[0]:
            raise RuntimeError(
                f"compaction of {job.partition} wrote {written} rows, not {expected}"
            )
        data = out.read_bytes()
        if signer is not None:
            store.put_new(
                identity.signature_key(job.output, identity.sha256_of(data)),
                signer.signature_object(job.output, data),
            )
        # A write-once put that finds the key taken was either an identical earlier run
        # (the same bytes: fine) or a peer squatting the name, and then deleting the inputs
        # would lose their rows: the output is read back before anything goes.
        store.put_new(job.output, data)
        _confirm_output(store, job, data)
    # Inputs go only after the merged object is durable, visible and the bytes written.
    inputs = [k for k in job.inputs if k != job.output]
    store.delete(inputs)
    store.delete([identity.signature_key(k, digests[k]) for k in inputs])
    log.info("compacted %d files of %s into %s", len(job.inputs), job.partition, job.output)
    return int(written[0])


def _confirm_output(store: Store, job: CompactionJob, data: bytes) -> None:
    """UnverifiedInput unless ``job.output`` in the store is exactly ``data``."""
    try:
        stored = store.read(job.output, len(data))
    except (FileNotFoundError, OversizedObject, OSError) as exc:
        raise UnverifiedInput(f"{job.output} is not what compaction wrote: {exc}") from exc
    if stored != data:
        raise UnverifiedInput(
            f"{job.output} holds other bytes than compaction wrote (a squatted name?): "
            f"its {len(job.inputs)} inputs are kept"
        )


def compact(
    catalog: Catalog,
    *,
    nodes: set[tuple[str, str]] | None,
    before: date | None,
    min_files: int = 2,
    target_rows: int = 1_000_000,
    signer: identity.NodeKey | None = None,
) -> CompactionReport:
    catalog.refresh()
    refs = [FileRef(s.key, s.rows, s.unpacked) for s in catalog.files.values() if s.status == "ok"]
    limits = catalog.limits
    jobs = plan_compaction(
        refs,
        nodes=nodes,
        before=before,
        min_files=min_files,
        target_rows=min(target_rows, limits.max_file_rows),
        target_bytes=limits.max_uncompressed_bytes // 2,
    )
    report = CompactionReport()
    for job in jobs:
        parts = parse_key(job.inputs[0])
        assert parts is not None
        own = signer is not None and (signer.swarm_id, signer.node_id) == (
            parts.swarm_id,
            parts.node_id,
        )
        if (
            catalog.registry.must_sign(parts.swarm_id, parts.node_id, catalog.check_signatures)
            and not own
        ):
            # Reported (CompactionReport.unsigned_partitions), not warned: the caller says
            # it once, with what to do.
            log.info(
                "skipping %s: its node's files must be signed (its swarm's rules, or its "
                "registered key), and only that node can sign the merged file",
                job.partition,
            )
            report.unsigned_partitions.append(job.partition)
            continue
        try:
            report.rows += run_job(catalog, job, signer if own else None)
        except (duckdb.Error, UnverifiedInput) as exc:
            # An input vanished (another compactor got there first), or is not what was
            # checked when it was indexed: leave the partition as it is.
            log.warning("skipping %s: %s", job.partition, exc)
            report.skipped_partitions.append(job.partition)
            continue
        report.jobs += 1
        report.files_in += len(job.inputs)
        report.files_out += 1
    catalog.refresh()
    return report
