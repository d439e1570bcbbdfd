"""The write side of a ledger: a node's rollouts, its identity, its swarm's rules, and its
reports (manifest, sample, evaluation and training logs), each object written once under the
node's own prefix and signed when the ledger has a signer."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ledger import identity, manifests, node_logs, samples, validation
from ledger.changes import ChangeLogStore
from ledger.credentials import node_own_prefixes
from ledger.handle import LedgerHandle, serialized
from ledger.identity import NodeKey
from ledger.keys import round_key
from ledger.manifests import NodeManifest
from ledger.records import RecordError, to_table
from ledger.schema import check_id
from ledger.storage import StorageError

log = logging.getLogger(__name__)


class LedgerWrites(LedgerHandle):
    @serialized
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

    @serialized
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

    @serialized
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

    @serialized
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
        rows: Sequence[Mapping[str, Any]],
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
        rows: Sequence[Mapping[str, Any]],
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

    def write_sample(
        self,
        swarm_id: str,
        node_id: str,
        node_round: int,
        drawn: pl.DataFrame,
        *,
        policy: str,
        seed: int,
        now: datetime | None = None,
    ) -> str:
        """Write which peer groups a node drew in ``node_round`` (``drawn``: what ``sample``
        returned) with ``policy`` (its kind) and ``seed``; return its key. One line per
        group; checked, write-once and empty as ``write_evaluation``. Read back as the
        ``samples`` view."""
        picks = drawn.select("group_id", "node_id").unique(maintain_order=True).rows()
        if len(picks) > node_logs.MAX_RECORDED_GROUPS:
            raise ValueError(
                f"a sample log records at most {node_logs.MAX_RECORDED_GROUPS} groups, "
                f"not {len(picks)}"
            )
        contents, keys = self._contents(drawn)
        rows = samples.sample_rows(picks, contents, policy=policy, seed=seed, keys=keys)
        return self._write_node_log(node_logs.SAMPLES, swarm_id, node_id, node_round, rows, now)

    @serialized
    def _contents(self, drawn: pl.DataFrame) -> tuple[dict[str, str], dict[str, list[str]]]:
        """The content digest of each group in ``drawn`` (rows ``sample`` returned) and its
        rows' completion keys (hex), from the rows the node got: what it trains on,
        whichever copy the index serves later."""
        if drawn.is_empty():
            return {}, {}
        self.con.register("_drawn", drawn.to_arrow())
        try:
            found = self.con.execute(validation.content_digests_sql("_drawn")).fetchall()
            # One key per row got: a completion its publisher sampled twice is logged
            # twice, so that a retry reading the log back gets both rows again.
            rows = self.con.execute(
                "SELECT group_id, list("
                f"{validation.completion_key_text_sql('completion_key')}) "
                f"FROM ({validation.completion_keys_sql('_drawn')}) GROUP BY group_id"
            ).fetchall()
        finally:
            self.con.unregister("_drawn")
        keys = {group_id: list(k) for group_id, k in rows}
        too_many = [g for g, k in keys.items() if len(k) > node_logs.MAX_KEYS_PER_GROUP]
        if too_many:
            raise ValueError(
                f"a sample log records at most {node_logs.MAX_KEYS_PER_GROUP} completions of a "
                f"group; {too_many[0]} holds {len(keys[too_many[0]])} (draw with rows_per_group)"
            )
        return dict(found), keys

    @serialized
    def _write_node_log(
        self,
        node_log: node_logs.NodeLog,
        swarm_id: str,
        node_id: str,
        node_round: int,
        rows: Sequence[Mapping[str, Any]],
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
