"""Node manifests: what each node declares about itself when it starts, as data.

A swarm's sharing configuration (I local and J external groups per round, the sampling
policy and the experiment it belongs to) used to live only in its id and was parsed back
with a regular expression. Instead each node writes one small, write-once JSON object
under its own prefix when it starts::

    <root>/_manifests/swarm_id=<S>/node_id=<N>/manifest-<digest>.jsonl

one JSON object on one line (JSON lines, so that the store lists it like the sample log and
a plain ``read_parquet('<root>/**/*.parquet')`` over the ledger still sees rollouts only).
Reports join rollouts with the ``manifests`` view on ``(swarm_id, node_id)``.

**Write once, resume safely.** ``<digest>`` is a digest of every field except
``written_at``, so a node that starts again with the same configuration lands on the same key
and writes nothing (the stored manifest keeps the time of the first start). A node resumed
with a *different* configuration writes a second manifest beside the first; readers keep the
**earliest** (by ``written_at``, then key) per node: the configuration the node started its
rounds with, which no later write can rewrite. The ``revisions`` column of ``manifests``
counts them, so a changed resume stays visible, and the writer logs a warning.

**Hostile input.** Readers read a manifest only if it sits where ``manifest_key`` puts it and
is at most ``MAX_MANIFEST_BYTES``; it must be one UTF-8 JSON object that validates strictly
against ``NodeManifest`` (unknown keys, wrong types and out-of-bounds values fail), name the
swarm and node of its path, carry the digest of its name and a schema version this code
reads. Anything else is skipped with a logged reason and listed by ``Ledger.validate``;
nothing a peer writes here can crash a reader.

In plain DuckDB (no sapo), with the column types spelled out (a column that is NULL in
every file would otherwise be typed JSON)::

    CREATE VIEW manifests AS
    SELECT *, count(*) OVER (PARTITION BY swarm_id, node_id) AS revisions
    FROM read_json('<root>/_manifests/*/*/*.jsonl', format = 'newline_delimited',
        columns = {swarm_id: 'VARCHAR', node_id: 'VARCHAR', experiment: 'VARCHAR',
                   local_groups: 'INTEGER', external_groups: 'INTEGER', policy: 'VARCHAR',
                   policy_params: 'VARCHAR', model_id: 'VARCHAR', prompt_format: 'VARCHAR',
                   adapter: 'VARCHAR', seed: 'BIGINT',
                   written_at: 'TIMESTAMPTZ', schema_version: 'INTEGER'})
    QUALIFY row_number() OVER (PARTITION BY swarm_id, node_id ORDER BY written_at) = 1;

That view trusts every file; the ``manifests`` view of ``Ledger.query`` holds only the
manifests that passed the checks above. Policy parameters are JSON
text: ``json_extract(policy_params, '$.max_per_peer')``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import duckdb
import pyarrow as pa
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from ledger.keys import digest, node_prefix
from ledger.schema import (
    EARLIEST_TIME,
    LATEST_TIME,
    MAX_GROUPS_PER_ROUND,
    MAX_SEED,
    check_id,
    in_time_window,
)
from ledger.storage import ObjectInfo, OversizedObject, StorageError, Store, in_threads

log = logging.getLogger(__name__)

MANIFEST_VERSION: Final = 1
"""The manifest schema version this code writes (and the newest it reads)."""
PREFIX: Final = "_manifests/"
MAX_MANIFEST_BYTES: Final = 16_384
"""Largest manifest a reader reads; a real one is a few hundred bytes."""
MAX_POLICY_PARAMS_CHARS: Final = 4_096

_KEY = re.compile(
    r"^_manifests/swarm_id=(?P<swarm_id>[^/=]+)/node_id=(?P<node_id>[^/=]+)/"
    r"manifest-(?P<digest>[0-9a-f]{20})\.jsonl$"
)
_POLICY_KIND = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

# Why a manifest was skipped (ledger_files-style statuses).
MISPLACED: Final = "misplaced_manifest"
OVERSIZED: Final = "oversized_manifest"
UNREADABLE: Final = "unreadable_manifest"
INVALID: Final = "invalid_manifest"
FOREIGN: Final = "foreign_manifest"
DIGEST_MISMATCH: Final = "manifest_digest_mismatch"
NEWER_VERSION: Final = "newer_manifest_version"


class ManifestError(ValueError):
    """A manifest a reader skips; ``reason`` is one of the statuses above."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class NodeManifest(BaseModel):
    """What a node declares when it starts: its swarm, experiment and sharing configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    swarm_id: str = Field(description="The swarm the node runs in.")
    node_id: str = Field(description="The node (its prefix in the ledger).")
    experiment: str | None = Field(
        None, description="The sweep (`sapo experiment`) the swarm belongs to; None: none."
    )
    local_groups: int = Field(
        ge=0, le=MAX_GROUPS_PER_ROUND, description="I: own groups trained on per round."
    )
    external_groups: int = Field(
        ge=0, le=MAX_GROUPS_PER_ROUND, description="J: peers' groups trained on per round."
    )
    policy: str = Field(description="Sampling policy kind (ledger/policies), e.g. `paper`.")
    policy_params: str = Field(
        "{}",
        max_length=MAX_POLICY_PARAMS_CHARS,
        description="The policy's parameters as a JSON object (text), kind excluded.",
    )
    model_id: str = Field(min_length=1, max_length=1024, description="Model id or path.")
    prompt_format: Literal["chat", "plain"] | None = Field(
        None,
        description="How the node prompted its model: its tokenizer's chat template, or plain "
        "text for a base model (sapo_core/prompts.py); None in manifests written before it.",
    )
    adapter: str | None = Field(
        None,
        max_length=32,
        pattern=r"^[a-z]+-r[0-9]{1,4}$",
        description="What the node trained on its model: an adapter (`lora-r16`: LoRA of "
        "rank 16, sapo_core/policy/adapter.py); None: every weight.",
    )
    seed: int = Field(ge=-MAX_SEED, le=MAX_SEED, description="The node's seed.")
    written_at: datetime = Field(description="When the node first wrote this manifest (UTC).")
    schema_version: int = Field(
        default=MANIFEST_VERSION, ge=1, description="Writer's manifest version."
    )

    @field_validator("swarm_id", "node_id", "experiment")
    @classmethod
    def _ids(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else check_id(str(info.field_name), value)

    @field_validator("policy")
    @classmethod
    def _kind(cls, value: str) -> str:
        if not _POLICY_KIND.match(value):
            raise ValueError(f"invalid policy kind {value!r}")
        return value

    @field_validator("policy_params")
    @classmethod
    def _params(cls, value: str) -> str:
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"policy_params is not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError("policy_params must be a JSON object")
        return value

    @field_validator("written_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("written_at needs a time zone")
        if not in_time_window(value):
            raise ValueError(
                f"written_at {value.isoformat()} outside {EARLIEST_TIME.year}-{LATEST_TIME.year}"
            )
        return value.astimezone(UTC)

    @classmethod
    def for_node(
        cls,
        *,
        swarm_id: str,
        node_id: str,
        experiment: str | None,
        local_groups: int,
        external_groups: int,
        policy: BaseModel,
        model_id: str,
        seed: int,
        prompt_format: Literal["chat", "plain"] | None = None,
        adapter: str | None = None,
        written_at: datetime | None = None,
    ) -> NodeManifest:
        """The manifest of a starting node; ``policy`` is a sampling policy model (the
        result of ``ledger.parse_policy``): its ``kind`` and its other fields are recorded."""
        from ledger.policies.user_sql import recorded

        params = recorded(policy.model_dump(mode="json", exclude={"kind"}))
        return cls(
            swarm_id=swarm_id,
            node_id=node_id,
            experiment=experiment,
            local_groups=local_groups,
            external_groups=external_groups,
            policy=str(getattr(policy, "kind")),  # noqa: B009 - every policy declares it
            policy_params=json.dumps(params, sort_keys=True),
            model_id=model_id,
            prompt_format=prompt_format,
            adapter=adapter,
            seed=seed,
            written_at=written_at or datetime.now(UTC),
        )

    def identity(self) -> str:
        """Digest of every field but ``written_at``: equal configurations, equal keys. An
        unset ``prompt_format`` or ``adapter`` is left out, so manifests written before
        them keep their keys."""
        unset = {name for name in ("prompt_format", "adapter") if getattr(self, name) is None}
        left_out = {"written_at"} | unset
        fields = self.model_dump(mode="json", exclude=left_out)
        return digest([json.dumps(fields, sort_keys=True)])


def manifest_key(manifest: NodeManifest) -> str:
    """Where ``manifest`` lives: under its node's own prefix, named by its identity."""
    prefix = node_prefix(manifest.swarm_id, manifest.node_id)
    return f"{PREFIX}{prefix}/manifest-{manifest.identity()}.jsonl"


def node_manifest_prefix(swarm_id: str, node_id: str) -> str:
    return f"{PREFIX}{node_prefix(swarm_id, node_id)}/"


def encode(manifest: NodeManifest) -> bytes:
    """One JSON line."""
    return (manifest.model_dump_json() + "\n").encode()


def is_manifest_key(key: str) -> bool:
    return _KEY.match(key) is not None


def parse(key: str, data: bytes) -> NodeManifest:
    """The manifest stored at ``key``, or ManifestError saying why a reader skips it."""
    try:
        return _parse(key, data)
    except RecursionError:  # JSON nested thousands deep: refused, never a crashed reader
        raise ManifestError(UNREADABLE, "JSON nested too deeply") from None


def _parse(key: str, data: bytes) -> NodeManifest:
    match = _KEY.match(key)
    if match is None:
        raise ManifestError(MISPLACED, "not at _manifests/swarm_id=/node_id=/manifest-<digest>")
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(OVERSIZED, f"{len(data)} bytes > {MAX_MANIFEST_BYTES}")
    try:
        lines = data.decode("utf-8").strip().splitlines()
    except UnicodeDecodeError as exc:
        raise ManifestError(UNREADABLE, f"not UTF-8: {exc.reason}") from None
    if len(lines) != 1:
        raise ManifestError(UNREADABLE, f"expected one JSON line, found {len(lines)}")
    try:
        version = json.loads(lines[0]).get("schema_version")
    except (json.JSONDecodeError, AttributeError):
        raise ManifestError(UNREADABLE, "not a JSON object") from None
    if isinstance(version, int) and version > MANIFEST_VERSION:
        raise ManifestError(NEWER_VERSION, f"schema_version {version} > {MANIFEST_VERSION}")
    try:
        manifest = NodeManifest.model_validate_json(lines[0], strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "manifest"
        raise ManifestError(INVALID, f"{where}: {first['msg']}"[:300]) from None
    # The path names the writer (only it writes under its prefix): the body must agree.
    claimed = (manifest.swarm_id, manifest.node_id)
    if claimed != (match["swarm_id"], match["node_id"]):
        raise ManifestError(
            FOREIGN, f"names {claimed} under {match['swarm_id']}/{match['node_id']}"
        )
    if manifest.identity() != match["digest"]:
        raise ManifestError(DIGEST_MISMATCH, "the name is not the digest of the content")
    return manifest


# -- the reader's index -----------------------------------------------------------------------

TABLE_COLUMNS: Final = (
    ("swarm_id", pa.string(), "VARCHAR"),
    ("node_id", pa.string(), "VARCHAR"),
    ("experiment", pa.string(), "VARCHAR"),
    ("local_groups", pa.int32(), "INTEGER"),
    ("external_groups", pa.int32(), "INTEGER"),
    ("policy", pa.string(), "VARCHAR"),
    ("policy_params", pa.string(), "VARCHAR"),
    ("model_id", pa.string(), "VARCHAR"),
    ("prompt_format", pa.string(), "VARCHAR"),
    ("adapter", pa.string(), "VARCHAR"),
    ("seed", pa.int64(), "BIGINT"),
    ("written_at", pa.timestamp("us", tz="UTC"), "TIMESTAMPTZ"),
    ("schema_version", pa.int32(), "INTEGER"),
    ("key", pa.string(), "VARCHAR"),
)
REVISIONS_VIEW_SQL: Final = """CREATE OR REPLACE VIEW manifest_revisions AS
    SELECT m.* EXCLUDE (key),
        row_number() OVER (PARTITION BY swarm_id, node_id ORDER BY written_at, key) AS revision,
        (SELECT min(r.node_round) FROM rollouts r
         WHERE r.swarm_id = m.swarm_id AND r.node_id = m.node_id
           AND r.published_at >= m.written_at) AS from_round
    FROM node_manifests m"""
"""Every configuration a node declared, in order (``revision`` 1 is what ``manifests``
shows), with the first round it published under it (``from_round``; NULL: none yet): a node
resumed with another configuration (``--force``) is read round by round. Both stamps are the
node's own; defined once ``rollouts`` is (the catalog's ``ensure_views``)."""
VIEW_SQL: Final = """CREATE OR REPLACE VIEW manifests AS
    SELECT * EXCLUDE (key), count(*) OVER (PARTITION BY swarm_id, node_id) AS revisions
    FROM node_manifests
    QUALIFY row_number() OVER (PARTITION BY swarm_id, node_id ORDER BY written_at, key) = 1"""


@dataclass(frozen=True)
class Skipped:
    key: str
    reason: str
    detail: str


class ManifestIndex:
    """The valid manifests of a store, in the DuckDB relations ``node_manifests`` (every
    valid manifest) and ``manifests`` (one row per swarm and node: the earliest).

    Manifests are immutable: each key is read and judged once per reader.
    """

    name = "manifests"

    def __init__(
        self,
        store: Store,
        con: duckdb.DuckDBPyConnection,
        vouch: Callable[[str, bytes], tuple[str, str] | None] | None = None,
    ) -> None:
        self.store = store
        self.con = con
        self.vouch = vouch
        """Why a manifest's bytes are not its node's (unsigned, badly signed), or None:
        the catalog's signature check (ledger/identity.py); None: none."""
        self.valid: dict[str, NodeManifest] = {}
        self.skipped: dict[str, Skipped] = {}
        columns = ", ".join(f"{name} {sql}" for name, _, sql in TABLE_COLUMNS)
        con.execute(f"CREATE TABLE node_manifests ({columns})")
        con.execute(VIEW_SQL)

    def refresh(
        self, listed: list[ObjectInfo], gone_keys: Iterable[str], again: Iterable[str] = ()
    ) -> None:
        """Judge manifests among ``listed`` (objects new to the listing) not judged yet, and
        those among ``again`` afresh (their node's signing rule changed); forget those among
        ``gone_keys`` (keys no longer listed)."""
        again = set(again)
        known = (self.valid.keys() | self.skipped.keys()) - again
        new = [o for o in listed if o.key.startswith(PREFIX) and o.key not in known]
        gone = [k for k in set(gone_keys) | again if k in self.valid or k in self.skipped]
        for key in gone:
            self.valid.pop(key, None)
            self.skipped.pop(key, None)
        judged = self._judge_all(new)
        for key, outcome in judged:
            if isinstance(outcome, NodeManifest):
                self.valid[key] = outcome
            else:
                self.skipped[key] = outcome
                log.warning("skipping manifest %s: %s (%s)", key, outcome.reason, outcome.detail)
        if gone or any(isinstance(o, NodeManifest) for _, o in judged):
            self.rebuild()

    def known_keys(self) -> set[str]:
        return set(self.valid) | set(self.skipped)

    def state(self) -> dict[str, Any]:
        return {
            "valid": {k: m.model_dump(mode="json") for k, m in self.valid.items()},
            "skipped": {k: vars(s) for k, s in self.skipped.items()},
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.valid.update({k: NodeManifest.model_validate(m) for k, m in state["valid"].items()})
        self.skipped.update({k: Skipped(**s) for k, s in state["skipped"].items()})
        self.rebuild()

    def _judge_all(self, objects: list[ObjectInfo]) -> list[tuple[str, NodeManifest | Skipped]]:
        return [r for r in in_threads(self._judge, objects) if r is not None]

    def _judge(self, obj: ObjectInfo) -> tuple[str, NodeManifest | Skipped] | None:
        """The manifest at ``obj``, why it is skipped, or None if it vanished (not remembered:
        looked at again on the next refresh). A store that fails to serve it raises
        StorageError, which the ledger's retry policy handles."""
        key = obj.key
        if not is_manifest_key(key):
            return key, Skipped(key, MISPLACED, "not at swarm_id=/node_id=/manifest-<digest>")
        try:
            size = obj.size if obj.size is not None else self.store.size(key)
            if size > MAX_MANIFEST_BYTES:  # never read an oversized object
                return key, Skipped(key, OVERSIZED, f"{size} bytes > {MAX_MANIFEST_BYTES}")
            data = self.store.read(key, MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            return None
        except OversizedObject:  # grew since it was listed
            return key, Skipped(key, OVERSIZED, f"more than {MAX_MANIFEST_BYTES} bytes")
        except PermissionError as exc:  # one object a reader may not read: skipped alone
            return key, Skipped(key, UNREADABLE, f"not readable: {exc}"[:300])
        except OSError as exc:  # the ledger's retry policy owns storage failures
            raise StorageError(f"reading manifest {key} failed: {exc}") from exc
        try:
            manifest = parse(key, data)
            problem = self.vouch(key, data) if self.vouch is not None else None
            return key, manifest if problem is None else Skipped(key, *problem)
        except ManifestError as exc:
            return key, Skipped(key, exc.reason, exc.detail)
        except Exception as exc:  # whatever else a peer's bytes provoke: skip, never crash
            return key, Skipped(key, INVALID, f"{type(exc).__name__}: {exc}"[:300])

    def rebuild(self) -> None:
        rows = sorted(self.valid.items())
        values: dict[str, list[Any]] = {name: [] for name, _, _ in TABLE_COLUMNS}
        for key, manifest in rows:
            record = manifest.model_dump()
            record["key"] = key
            for name in values:
                values[name].append(record[name])
        table = pa.table(
            values, schema=pa.schema([pa.field(name, kind) for name, kind, _ in TABLE_COLUMNS])
        )
        self.con.register("_manifests_arrow", table)
        try:
            self.con.execute("DELETE FROM node_manifests")
            self.con.execute("INSERT INTO node_manifests SELECT * FROM _manifests_arrow")
        finally:
            self.con.unregister("_manifests_arrow")
