"""The rollout ledger: publish a round's rows, sample peers' groups, query with SQL."""

from __future__ import annotations

import functools
import io
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ledger import compaction, identity, manifests, node_logs, samples, validation
from ledger import reader_index as index_file
from ledger.catalog import Catalog, FileChanged, RefreshStats
from ledger.changes import ChangeLogStore, with_change_log
from ledger.config import ChangeLogConfig, LedgerConfig, RowLimits
from ledger.copies import LocalCopies
from ledger.credentials import node_own_prefixes
from ledger.duck import connect
from ledger.identity import NodeKey
from ledger.keys import node_prefix, object_place, round_key
from ledger.manifests import NodeManifest
from ledger.policies import AnyPolicy, parse_policy
from ledger.records import RecordError, to_table
from ledger.retrying import RetryPolicy, first_line, retrying
from ledger.schema import check_id
from ledger.sqltext import EMPTY_ROLLOUTS_SQL
from ledger.storage import StorageError, StoreUnusable, is_local, open_store

log = logging.getLogger(__name__)
T = TypeVar("T")
INDEX_SAVE_EVERY_S = 60.0
"""A reader index is saved at most this often while reads change it (and on close)."""
F = TypeVar("F", bound=Callable[..., Any])

MAX_GROUPS_PER_SAMPLE = 100_000
DRAW_POOL_PER_GROUP = 16
"""A draw looks first among the lowest 16 draws per group asked for (see ``_draw``)."""
_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


READ_ERRORS: tuple[type[BaseException], ...] = (
    duckdb.IOException,  # a file vanished between listing and reading, a bad read
    duckdb.HTTPException,
    StorageError,  # the store cannot be reached, or an indexed file changed (FileChanged)
    ConnectionError,
    TimeoutError,
)
"""What a read retries (listing again first); anything else is a bug or bad SQL."""
WRITE_ERRORS: tuple[type[BaseException], ...] = (StorageError, ConnectionError, TimeoutError)


def _serialized(method: F) -> F:
    """Run ``method`` holding the ledger's lock: one DuckDB connection serves one call at a
    time (concurrent calls on it from several threads deadlock), so a Ledger shared by
    threads serves them in turn."""

    @functools.wraps(method)
    def locked(self: Ledger, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


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


class Ledger:
    """A ledger at ``url`` (local path, ``file://`` or ``s3://bucket/prefix``).

    Reads are served from an incremental index of the files seen so far (each immutable
    file is validated once); every read call first lists the store for changes.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        limits: RowLimits | None = None,
        retry: RetryPolicy | None = None,
        max_staleness_s: float | None = None,
        signatures: str | None = None,
        signer: NodeKey | None = None,
        threads: int | None = None,
        change_log: ChangeLogConfig | None = None,
        reader_index: str | Path | None = None,
        local_copies: str | None = None,
    ) -> None:
        # What is not given takes LedgerConfig's default: one default per setting.
        given: dict[str, Any] = {
            "limits": limits,
            "retry": retry,
            "max_staleness_s": max_staleness_s,
            "signatures": signatures,
            "change_log": change_log,
            "local_copies": local_copies,
        }
        self.config = LedgerConfig.model_validate(
            {
                "url": url,
                "storage_options": dict(storage_options or {}),
                **{name: value for name, value in given.items() if value is not None},
            }
        )
        self._lock = threading.RLock()
        self.store = with_change_log(open_store(url, storage_options), self.config.change_log)
        self.con = connect(threads, memory_limit_mb=self.config.memory_limit_mb)
        self.store.configure_duckdb(self.con)
        self.reader_index = Path(reader_index) if reader_index else None
        """Where this reader's index is kept between runs (None: nowhere)."""
        self.catalog = Catalog(
            self.store,
            self.con,
            self.config.limits,
            signatures=self.config.signatures,
            copies=self._local_copies(),
        )
        if self.catalog.copies is not None:
            # Copies are written once and never change under their name: each footer is
            # parsed once, not at every sample that reads the file.
            self.con.execute("SET parquet_metadata_cache = true")
        self.signer = signer
        """The node this ledger publishes as: its files are signed, and it publishes and
        compacts for that node only. None: an unsigned writer (open swarms, analysis)."""
        self._listed_at = -float("inf")
        self._markers_collected_at = -float("inf")
        self._markers_collected_before_ms = 0
        """Markers stamped before this were collected: a node lists only later ones."""
        self._last_refresh = RefreshStats()
        self._index_saved_at = time.monotonic()
        if self.reader_index is not None and index_file.load(self.catalog, self.reader_index):
            log.info("resuming from the reader index %s", self.reader_index)
        elif self.catalog.copies is not None:
            self.catalog.copies.clear()  # copies of an index that was not loaded

    @classmethod
    def from_config(
        cls,
        config: LedgerConfig,
        signer: NodeKey | None = None,
        reader_index: str | Path | None = None,
    ) -> Ledger:
        return cls(
            config.url,
            config.storage_options,
            limits=config.limits,
            retry=config.retry,
            max_staleness_s=config.max_staleness_s,
            signatures=config.signatures,
            signer=signer,
            change_log=config.change_log,
            reader_index=reader_index,
            local_copies=config.local_copies,
        )

    def _local_copies(self) -> LocalCopies | None:
        """The folder of verified copies (ledger/copies.py) if this reader keeps them: next
        to its reader index (they outlive a restart with it), else a temporary one."""
        wanted = self.config.local_copies
        if wanted == "off" or (wanted == "auto" and is_local(self.store)):
            return None
        if self.reader_index is None:
            return LocalCopies()
        return LocalCopies(self.reader_index.with_suffix(".copies"))

    @property
    def url(self) -> str:
        return self.store.url

    @_serialized
    def close(self) -> None:
        try:
            self.save_index()
        finally:
            self.con.close()
            if self.catalog.copies is not None:
                self.catalog.copies.close()

    @_serialized
    def save_index(self) -> None:
        """Write the reader index now (also done on close and, after changes, every
        ``INDEX_SAVE_EVERY_S``); a failure is logged, never raised: it is a cache."""
        if self.reader_index is None:
            return
        try:
            index_file.save(self.catalog, self.reader_index)
        except (OSError, duckdb.Error) as exc:
            log.warning("could not save the reader index %s: %s", self.reader_index, exc)
        self._index_saved_at = time.monotonic()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- write -------------------------------------------------------------------------

    @_serialized
    def publish(self, rows: Any, *, now: datetime | None = None) -> list[str]:
        """Write one publisher's rows; return the keys that hold them.

        Rows are checked as strictly as a reader would check them (RecordError otherwise),
        so a node never publishes what its peers would skip. A retry of the same rows maps
        to the same keys and writes nothing.
        """
        table = to_table(rows, now)
        swarm_id, node_id = self._publisher(table)
        signer = self.signer
        if signer is not None and (swarm_id, node_id) != (signer.swarm_id, signer.node_id):
            raise RecordError(
                f"this ledger publishes as {signer.swarm_id}/{signer.node_id}, "
                f"not {swarm_id}/{node_id}"
            )
        self._check_own_rows(table)
        days = pc.strftime(table.column("published_at"), format="%Y-%m-%d", locale="C")
        keys = []
        for day in sorted(set(days.to_pylist())):
            part = table.filter(pc.equal(days, day))
            part = part.sort_by([("group_id", "ascending"), ("rollout_id", "ascending")])
            key = round_key(
                swarm_id,
                node_id,
                date.fromisoformat(day),
                int(pc.min(part.column("node_round")).as_py()),
                part.column("rollout_id").to_pylist(),
            )
            buffer = io.BytesIO()
            pq.write_table(part, buffer, compression="zstd")
            data = buffer.getvalue()
            if self._put_signed(key, data):
                log.debug("published %d rows to %s", part.num_rows, key)
            else:
                log.info("%s already holds these rows: nothing written", key)
            keys.append(key)
        self._collect_markers_now_and_then()
        return keys

    def collect_markers(self, now: float | None = None) -> int:
        """Delete change-log markers old enough that no reader needs them (twice
        ``full_listing_every_s``: a reader that has not polled since lists fully); only
        this ledger's node's own with a signer (what its credentials may delete), every
        one without (an operator). How many; 0 without a change log."""
        store = self.store
        if not isinstance(store, ChangeLogStore):
            return 0
        config = self.config.change_log
        keep_ms = int((2 * config.full_listing_every_s + config.grace_s) * 1000)
        before_ms = int((now if now is not None else store.clock()) * 1000) - keep_ms
        signer = self.signer
        own = None if signer is None else node_own_prefixes(signer.swarm_id, signer.node_id)
        since = self._markers_collected_before_ms if own is not None else 0
        collected = self._store_call("collecting markers", store.collect, before_ms, own, since)
        self._markers_collected_before_ms = max(since, before_ms)
        return collected

    def _collect_markers_now_and_then(self) -> None:
        """A node collects its own old markers once per ``full_listing_every_s``; a failure
        costs a warning, never the publish."""
        every = self.config.change_log.full_listing_every_s
        if self.signer is None or time.monotonic() - self._markers_collected_at < every:
            return
        self._markers_collected_at = time.monotonic()
        try:
            collected = self.collect_markers()
        except StorageError as exc:
            log.warning("old change-log markers not collected: %s", exc)
            return
        if collected:
            log.info("collected %d old change-log markers", collected)

    @_serialized
    def register_key(self, key: NodeKey) -> None:
        """Register ``key`` as its node's: the first key written for a (swarm, node) is the
        one readers use. IdentityError if another key holds the id already."""
        where = identity.key_object_key(key.swarm_id, key.node_id)
        if self._put_new(where, key.key_object()):
            log.info("registered the key of %s/%s", key.swarm_id, key.node_id)
            return
        data = self._store_call(
            f"reading {where}", self.store.read, where, identity.MAX_OBJECT_BYTES
        )
        try:
            registered = identity.parse_public_key(data, key.swarm_id, key.node_id)
        except identity.IdentityError as exc:
            raise identity.IdentityError(f"{where} is unusable: {exc}") from exc
        mine = key.private.public_key()
        if registered.public_bytes_raw() != mine.public_bytes_raw():
            if self._pinned_as_mine(where, key):
                # This reader read the object as this node's key before (its index): the
                # object was rewritten since, by a writer with the same credentials.
                log.error(
                    "%s was rewritten with another key after %s/%s registered: readers that "
                    "read it before keep this node's key, fresh readers take the forgery",
                    where, key.swarm_id, key.node_id,
                )  # fmt: skip
                self.catalog.registry.pin_key(key.swarm_id, key.node_id, mine)
                return
            raise identity.IdentityError(
                f"{key.swarm_id}/{key.node_id} is registered with another key ({where}): "
                "readers would drop everything this node publishes; pick another node id "
                "or use the key it was registered with"
            )

    def _pinned_as_mine(self, where: str, key: NodeKey) -> bool:
        first = self.catalog.identities.objects.get(where)
        if first is None:
            return False
        try:
            pinned = identity.parse_public_key(first, key.swarm_id, key.node_id)
        except identity.IdentityError:
            return False
        return pinned.public_bytes_raw() == key.private.public_key().public_bytes_raw()

    @_serialized
    def declare_swarm(
        self,
        swarm_id: str,
        signatures: identity.SignatureMode,
        members: Iterable[str] | None = None,
    ) -> str:
        """Write ``swarm_id``'s rules unless written already; return the signature rule in
        force (the first written). ``members``: the only nodes of a closed swarm (None: open
        to anyone). A ledger that declares ``required``, or members, holds to them from then
        on, whatever the rules object says or comes to say: a node trusts its own
        configuration over an object in the bucket."""
        if signatures == "required":
            self.catalog.registry.pin_required(swarm_id)
        if members is not None:
            members = sorted(set(members))
        # Open or closed as this node's configuration says, whatever the object says: a
        # peer that declared the swarm first cannot close it to its own nodes.
        self.catalog.registry.pin_members(swarm_id, members)
        where = identity.swarm_rules_key(swarm_id)
        if self._put_new(where, identity.rules_object(signatures, members=members)):
            return signatures
        data = self._store_call(
            f"reading {where}", self.store.read, where, identity.MAX_RULES_BYTES
        )
        try:
            rules = identity.parse_rules(data)
        except identity.IdentityError as exc:
            raise identity.IdentityError(f"{where} is unusable: {exc}") from exc
        if rules.signatures != signatures:
            log.warning(
                "swarm %s was declared with signatures %s, not %s",
                swarm_id, rules.signatures, signatures,
            )  # fmt: skip
        declared = None if rules.members is None else sorted(rules.members)
        if declared != members:
            log.warning(
                "swarm %s was declared with members %s, not %s: this node holds to its own",
                swarm_id, declared or "anyone", members or "anyone",
            )  # fmt: skip
        return rules.signatures

    @_serialized
    def write_manifest(self, manifest: NodeManifest) -> str:
        """Write a starting node's manifest under its own prefix; return its key.

        Write-once: the same manifest again (a resumed node, a retry) maps to the same key
        and writes nothing. A different one for the same node (resumed with another
        configuration) is written beside it; readers keep the earliest (ledger/manifests.py).
        """
        key = manifests.manifest_key(manifest)
        prefix = manifests.node_manifest_prefix(manifest.swarm_id, manifest.node_id)
        try:  # only for a warning: a store that will not list costs the warning, not the start
            listed = self._store_call(f"listing {prefix}", self.store.list, prefix)
        except StorageError as exc:
            log.warning("%s", exc)
            listed = []
        others = [o.key for o in listed if o.key != key]
        if self._put_signed(key, manifests.encode(manifest)):
            log.debug("wrote manifest %s", key)
        else:
            log.info("%s already holds this manifest: nothing written", key)
        if others:
            log.warning(
                "%s/%s already wrote a different manifest (%s): readers keep the earliest",
                manifest.swarm_id,
                manifest.node_id,
                ", ".join(sorted(others)),
            )
        return key

    def write_evaluation(
        self,
        swarm_id: str,
        node_id: str,
        node_round: int,
        rows: list[dict[str, Any]],
        *,
        now: datetime | None = None,
    ) -> str:
        """Write a node's held-out evaluation at ``node_round``; return its key.

        One row per task: ``task``, ``questions``, ``completions``, ``correct`` (sum of
        rewards), ``accuracy`` (correct / completions, in [0, 1]), ``policy_version`` and
        ``eval_seed`` (``node_round`` may be given, and must then match); ``evaluated_at`` is
        stamped here. The policy evaluated is the one at the start of ``node_round``.
        Rows a reader would skip raise ValueError before anything is written. Write-once
        per (swarm, node, round): a retried round writes nothing and returns the first key.
        No rows: nothing written, "" returned. Read back as the ``evaluations`` view.
        """
        return self._write_node_log(node_logs.EVALUATIONS, swarm_id, node_id, node_round, rows, now)

    def write_training(
        self,
        swarm_id: str,
        node_id: str,
        node_round: int,
        rows: list[dict[str, Any]],
        *,
        now: datetime | None = None,
    ) -> str:
        """Write what a node trained on in ``node_round``; return its key.

        One row per group considered for the training set: ``group_id``, ``origin``
        ('local' or 'external'), ``peer_node_id`` (the publisher; the node itself for local
        groups), ``task``, ``completions``, ``reward_mean`` (under this node's verifier, in
        [0, 1]), ``informative`` (rewards not all equal) and ``trained`` (false when dropped
        as zero-variance); ``recorded_at`` is stamped here. Checked, write-once and empty
        as ``write_evaluation``. Read back as the ``trainings`` view.
        """
        return self._write_node_log(node_logs.TRAININGS, swarm_id, node_id, node_round, rows, now)

    def evaluated_nodes(self, swarm_id: str, node_round: int) -> set[str]:
        """The nodes of ``swarm_id`` whose held-out evaluation at ``node_round`` is recorded."""
        found = self.query(
            "SELECT DISTINCT node_id FROM evaluations WHERE swarm_id = $s AND node_round = $r",
            {"s": swarm_id, "r": node_round},
        )
        return set(found["node_id"].to_list())

    @_serialized
    def _write_node_log(
        self,
        node_log: node_logs.NodeLog,
        swarm_id: str,
        node_id: str,
        node_round: int,
        rows: list[dict[str, Any]],
        now: datetime | None,
    ) -> str:
        prefix = node_log.node_prefix(swarm_id, node_id)  # checks both ids
        checked = node_log.validate(list(rows), node_round)
        if not checked:
            return ""
        when = now or datetime.now(UTC)
        key = node_log.key(swarm_id, node_id, node_round, when)
        # A round retried on a later day has the same file name under another day.
        name = key.rsplit("/", 1)[1]
        try:  # only to find such a retry: a store that will not list costs the check
            listed = self._store_call(f"listing {prefix}", self.store.list, prefix)
        except StorageError as exc:
            log.warning("%s", exc)
            listed = []
        earlier = sorted(o.key for o in listed if o.key.rsplit("/", 1)[1] == name)
        if earlier:
            log.info("%s already holds this round: nothing written", earlier[0])
            return earlier[0]
        if self._put_signed(key, node_log.lines(checked, when)):
            log.debug("wrote %d %s rows to %s", len(checked), node_log.name, key)
        else:
            log.info("%s already holds this round: nothing written", key)
        return key

    @staticmethod
    def _publisher(table: pa.Table) -> tuple[str, str]:
        ids = []
        for name in ("swarm_id", "node_id"):
            values = pc.unique(table.column(name)).to_pylist()
            if len(values) != 1:
                raise RecordError(f"one publish holds one {name}, got {values[:5]}")
            ids.append(check_id(name, values[0]))
        return ids[0], ids[1]

    def _check_own_rows(self, table: pa.Table) -> None:
        limits = self.config.limits
        con = self.con
        con.register("_publish", table)
        try:
            bad = con.execute(
                f"""SELECT reason, count(*) FROM (
                    SELECT {validation.reject_reason_sql(limits)} AS reason FROM _publish)
                WHERE reason IS NOT NULL GROUP BY 1
                UNION ALL
                SELECT '{validation.DUPLICATE_ID}', count(*) - count(DISTINCT rollout_id)
                FROM _publish HAVING count(*) > count(DISTINCT rollout_id)
                UNION ALL
                SELECT problem, sum(n) FROM (
                    SELECT {validation.group_problem_sql(limits)} AS problem, count(*) AS n
                    FROM (SELECT {validation.JUDGED_COLUMNS} FROM _publish) GROUP BY group_id)
                WHERE problem IS NOT NULL GROUP BY 1"""
            ).fetchall()
        finally:
            con.unregister("_publish")
        if bad:
            detail = ", ".join(f"{n} {reason}" for reason, n in bad)
            raise RecordError(f"refusing to publish rows that readers would skip: {detail}")

    # -- read --------------------------------------------------------------------------

    @_serialized
    def refresh(self) -> RefreshStats:
        """Pick up files published (or removed) since the last call."""
        return self._with_refresh(lambda: self._last_refresh, fresh=True)

    @_serialized
    def sample(
        self,
        node_id: str,
        n_groups: int,
        policy: str | dict[str, Any] | AnyPolicy = "paper",
        seed: int = 0,
        *,
        swarm_id: str | None = None,
        now: datetime | None = None,
        record_round: int | None = None,
        exclude_nodes: Sequence[str] = (),
        known_nodes: Sequence[str] | None = None,
    ) -> pl.DataFrame:
        """All completions of up to ``n_groups`` peer groups chosen for ``node_id``.

        Never the node's own groups. The same seed over the same ledger gives the same
        sample. Fewer groups come back when fewer qualify. With ``record_round`` (and
        ``swarm_id``) the draw is written to the sample log, once per node and round.
        ``exclude_nodes``: peers the receiver no longer samples (its reputation of them);
        ``known_nodes``: peers it has verified enough of: groups of all other peers together
        come after the known ones' beyond the policy's ``max_unknown_share`` (None: every
        peer counts as known).
        """
        if record_round is not None and swarm_id is None:
            raise ValueError("recording a sample needs the swarm_id it was drawn for")
        if record_round is not None and n_groups > node_logs.MAX_RECORDED_GROUPS:
            raise ValueError(
                f"a recorded sample draws at most {node_logs.MAX_RECORDED_GROUPS} groups, "
                f"not {n_groups}"
            )
        when = now or datetime.now(UTC)
        chosen, draw = self._draw(
            node_id, n_groups, policy, seed, swarm_id, when, exclude_nodes, known_nodes
        )

        def attempt() -> pl.DataFrame:
            frame = self.catalog.fetch_groups(draw())
            return frame if frame is not None else self._empty()

        frame: pl.DataFrame = self._with_refresh(attempt)
        if record_round is not None and swarm_id is not None and frame.height:
            picks = frame.select("group_id", "node_id").unique(maintain_order=True).rows()
            lines = samples.sample_log_lines(
                picks, node_round=record_round, policy=chosen.kind, seed=int(seed), when=when
            )
            self._put_signed(samples.sample_log_key(swarm_id, node_id, record_round, when), lines)
        return frame

    @_serialized
    def sample_group_ids(
        self,
        node_id: str,
        n_groups: int,
        policy: Any = "paper",
        seed: int = 0,
        *,
        swarm_id: str | None = None,
        now: datetime | None = None,
        exclude_nodes: Sequence[str] = (),
        known_nodes: Sequence[str] | None = None,
    ) -> list[str]:
        """The group ids ``sample`` would return, in draw order, without reading their rows."""
        when = now or datetime.now(UTC)
        _, draw = self._draw(
            node_id, n_groups, policy, seed, swarm_id, when, exclude_nodes, known_nodes
        )
        ids: list[str] = self._with_refresh(draw)
        return ids

    def _draw(
        self,
        node_id: str,
        n_groups: int,
        policy: Any,
        seed: int,
        swarm_id: str | None,
        when: datetime,
        exclude_nodes: Sequence[str] = (),
        known_nodes: Sequence[str] | None = None,
    ) -> tuple[AnyPolicy, Callable[[], list[str]]]:
        """The policy, and a call that runs its SQL: the drawn group ids in draw order."""
        chosen = parse_policy(policy)
        if not 0 <= n_groups <= MAX_GROUPS_PER_SAMPLE:
            raise ValueError(f"n_groups must be in [0, {MAX_GROUPS_PER_SAMPLE}], got {n_groups}")
        params = {
            "node_id": node_id,
            "swarm_id": swarm_id,
            "seed": int(seed),
            "n_groups": int(n_groups),
            "excluded": [check_id("node_id", n) for n in exclude_nodes],
            "known": None if known_nodes is None else [check_id("node_id", n) for n in known_nodes],
            **chosen.caps(int(n_groups)),
            **chosen.parameters(when),
        }
        sql = chosen.sql
        used = set(_PARAM.findall(sql)) - {"pool"}
        params = {k: val for k, val in params.items() if k in used}

        def draw() -> list[str]:
            if n_groups == 0:
                return []
            # First among the lowest draws only. That answer is the answer over all
            # candidates when it is full and no cap put any of it late, and none of it is
            # an unknown peer's (the unknown cap counts across all candidates; a peer's
            # rank among its own draws is the same in the pool as overall).
            pooled = {**params, "pool": DRAW_POOL_PER_GROUP * int(n_groups)}
            rows = self.con.execute(sql, pooled).fetchall()
            if len(rows) < n_groups or any(late or unknown for _, late, unknown in rows):
                rows = self.con.execute(sql, {**params, "pool": None}).fetchall()
            return [r[0] for r in rows]

        return chosen, draw

    @_serialized
    def query(self, sql: str, params: dict[str, Any] | list[Any] | None = None) -> pl.DataFrame:
        """Run SQL over the views ``rollouts``, ``groups``, ``samples``, ``evaluations``,
        ``trainings``, ``manifests`` and ``ledger_files``.

        ``samples``, ``evaluations`` and ``trainings`` are the nodes' self-reports
        (ledger/node_logs.py): each row carries ``swarm_id``, ``node_id`` (from the file's
        place) and ``source_file``."""

        def attempt() -> pl.DataFrame:
            try:
                self.catalog.ensure_views()  # binding the views reads every file's footer
                return self.con.execute(sql, params).pl()
            except duckdb.Error as exc:
                # A file changed under the views is forgotten and the query retried;
                # anything else (the caller's SQL) is the caller's error.
                if self.catalog.recover_from(exc):
                    raise FileChanged(f"files changed under the query: {first_line(exc)}") from exc
                raise

        return self._with_refresh(attempt)

    def _with_refresh(self, read: Callable[[], T], *, fresh: bool = False) -> T:
        """``read()`` after listing the store (unless the last listing is recent enough, see
        ``max_staleness_s``, and not ``fresh``).

        The one retry layer of a read (see ledger/retrying.py): when a file vanished between
        listing and reading (compaction), or the store or a file cannot be read, list again
        and read again, ``config.retry.attempts`` times in all; then a one-line StorageError.
        """
        policy = self.config.retry
        try:
            for attempt in retrying(
                policy, READ_ERRORS, f"reading {self.url}", log, never=(StoreUnusable,)
            ):
                with attempt:
                    stale = time.monotonic() - self._listed_at >= self.config.max_staleness_s
                    if fresh or stale or attempt.retry_state.attempt_number > 1:
                        self._list()
                    return read()
        except StoreUnusable:
            raise
        except READ_ERRORS as exc:
            raise StorageError(
                f"reading {self.url} failed after {policy.attempts} attempts: {first_line(exc)}"
            ) from exc
        raise AssertionError("unreachable")

    def _list(self) -> None:
        """List the store and index what changed. A listing that went stale while it was
        read (files vanished: a compactor's merged file may not be in it yet) is listed
        once more; files vanished again are left out of this read, never an error: a peer
        that keeps deleting its own files must not fail everyone's reads."""
        self._last_refresh = stats = self.catalog.refresh()
        if stats.vanished:
            again = self.catalog.refresh()
            stats.added += again.added
            stats.removed += again.removed
            stats.vanished = again.vanished
            stats.seconds += again.seconds
            stats.list_seconds += again.list_seconds
            stats.read_seconds += again.read_seconds
        self._listed_at = time.monotonic()
        changed = stats.added or stats.removed
        if changed and self._listed_at - self._index_saved_at >= INDEX_SAVE_EVERY_S:
            self.save_index()

    def _put_new(self, key: str, data: bytes) -> bool:
        """``store.put_new`` under the retry policy: write-once, so a retry is a no-op."""
        return self._store_call(f"writing {key}", self.store.put_new, key, data)

    def _put_signed(self, key: str, data: bytes) -> bool:
        """``_put_new`` of an object under this ledger's node's prefix, its signature first
        (a reader never sees it missing); unsigned without a signer."""
        signer = self.signer
        if signer is not None:
            if object_place(key) != (signer.swarm_id, signer.node_id):
                raise RecordError(
                    f"this ledger writes as {signer.swarm_id}/{signer.node_id}, not at {key}"
                )
            sha = identity.sha256_of(data)
            self._put_new(identity.signature_key(key, sha), signer.signature_object(key, data))
        return self._put_new(key, data)

    def _store_call(self, what: str, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)``, a single store request, under the retry policy; then a one-line
        StorageError."""
        policy = self.config.retry
        try:
            result: T = retrying(policy, WRITE_ERRORS, what, log, never=(StoreUnusable,))(
                call, *args
            )
        except StoreUnusable:
            raise
        except WRITE_ERRORS as exc:
            raise StorageError(
                f"{what} ({self.url}) failed after {policy.attempts} attempts: {first_line(exc)}"
            ) from exc
        return result

    def _empty(self) -> pl.DataFrame:
        return self.con.execute(EMPTY_ROLLOUTS_SQL).pl()

    # -- maintenance -------------------------------------------------------------------

    @_serialized
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

    @_serialized
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
