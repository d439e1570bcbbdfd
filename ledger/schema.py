"""The rollout record: one row per completion, its public columns and their versions.

Users' SQL depends on these column names, so they only ever grow. A column added in a later
schema version says so in ``since``; a reader fills it with NULL for files written before it
existed, which is how a reader accepts older versions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

import pyarrow as pa

SCHEMA_VERSION: Final = 2
"""The version this code writes. 2 added the generator's claim: ``token_ids``,
``token_logprobs``, ``tokenizer`` (issue 58)."""

MIN_READABLE_VERSION: Final = 1
"""The oldest version this code reads."""


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    nullable: bool
    since: int
    doc: str


COLUMNS: Final[tuple[Column, ...]] = (
    Column("rollout_id", pa.string(), False, 1, "Unique id of this completion."),
    Column("group_id", pa.string(), False, 1, "Id shared by the completions of one question."),
    Column("swarm_id", pa.string(), False, 1, "The swarm (experiment) this row belongs to."),
    Column("node_id", pa.string(), False, 1, "The publishing node."),
    Column("model_id", pa.string(), False, 1, "The publisher's model (HF id or path)."),
    Column("node_round", pa.int64(), False, 1, "The publisher's round counter."),
    Column("policy_version", pa.int64(), False, 1, "Optimizer steps behind the behaviour policy."),
    Column("task", pa.string(), False, 1, "reasoning-gym dataset name."),
    Column("task_config", pa.string(), False, 1, "JSON config that rebuilds the dataset."),
    Column("task_seed", pa.int64(), False, 1, "Dataset seed."),
    Column("task_index", pa.int64(), False, 1, "Index of the question in the dataset."),
    Column("question", pa.string(), False, 1, "Question text as the publisher prompted it."),
    Column("answer", pa.string(), True, 1, "Ground truth; NULL where a task has none."),
    Column("metadata", pa.string(), False, 1, "JSON verifier metadata of the question."),
    Column("completion", pa.string(), False, 1, "Decoded completion text."),
    Column("completion_tokens", pa.int64(), False, 1, "Tokens in the completion (publisher's)."),
    Column("reward", pa.float64(), True, 1, "The publisher's claimed reward; never trusted."),
    Column("published_at", pa.timestamp("us", tz="UTC"), False, 1, "Publish time, UTC."),
    Column("schema_version", pa.int32(), False, 1, "Schema version of the writer."),
    Column(
        "token_ids",
        pa.list_(pa.int32()),
        True,
        2,
        "The completion as the generator's token ids (its tokenizer's; the stop token kept).",
    ),
    Column(
        "token_logprobs",
        pa.list_(pa.float32()),
        True,
        2,
        "Per token, its log-prob under the distribution the generator sampled it from "
        "(temperature and top-p applied). A claim, judged by each receiver.",
    ),
    Column(
        "tokenizer",
        pa.string(),
        True,
        2,
        "Fingerprint of the generator's tokenizer (16 hex digits): a receiver uses "
        "token_ids only where it is its own.",
    ),
)

CLAIM_COLUMNS: Final = ("token_ids", "token_logprobs", "tokenizer")
"""The generator's claim (schema 2): NULL together, or all set and consistent."""

COLUMN_NAMES: Final = tuple(c.name for c in COLUMNS)

# -- ranges: what a reader accepts of any number or time a peer wrote --------------------
# A value may be of the right type and still break whoever converts or adds it: a timestamp
# past year 9999 (or INT64_MAX, which DuckDB reads as infinity) has no Python datetime, and
# a round of 2^63 - 1 overflows the first sum a report takes. Every object kind a reader
# takes from peers (rollouts, node logs, manifests, markers) is held to these.

MAX_GROUPS_PER_ROUND: Final = 1024
"""Most own (I) or peers' (J) groups a node trains on in a round, as its manifest declares
it; sapo_core.config.node declares the same bound for a node's config (the two packages
never import each other: tests/unit/test_layering.py holds them equal)."""


def sharing_label(local_groups: int, external_groups: int) -> str:
    """A sharing configuration's name everywhere it is shown: `I/J`."""
    return f"{local_groups}/{external_groups}"


MAX_COUNTER: Final = 2**31 - 1
"""Largest round, policy version, question index or count a reader accepts: a million of
them add up inside int64 and float64 exactly."""
MAX_SEED: Final = 2**62
"""Largest magnitude of a seed a reader accepts (seeds are never added up)."""
EARLIEST_TIME: Final = datetime(2020, 1, 1, tzinfo=UTC)
LATEST_TIME: Final = datetime(2200, 1, 1, tzinfo=UTC)
"""Timestamps a reader accepts lie in [EARLIEST_TIME, LATEST_TIME): fixed, not relative to
the reader's clock, so a judgement made once stays true (recency windows deal with stamps
in the future)."""


def time_window_sql(column: str) -> str:
    """A predicate that holds when ``column`` (a TIMESTAMPTZ, not NULL) lies in the window;
    false for infinities."""
    return (
        f"({column} >= TIMESTAMPTZ '{EARLIEST_TIME.isoformat()}' "
        f"AND {column} < TIMESTAMPTZ '{LATEST_TIME.isoformat()}')"
    )


def in_time_window(when: datetime) -> bool:
    return EARLIEST_TIME <= when < LATEST_TIME


ID_PATTERN: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,127}$")
"""swarm and node ids become path segments and Hive values: they start with a letter so that
DuckDB's Hive type inference never reads them as numbers, and hold no path separators. They
hold no dots either: a publisher's group and rollout ids must start with
``<swarm>.<node>.``, and with dots allowed node ``a.r0`` would own ids of node ``a``."""


def arrow_schema(version: int = SCHEMA_VERSION, columns: tuple[Column, ...] = COLUMNS) -> pa.Schema:
    """The Arrow schema of files written at ``version``."""
    return pa.schema(
        [pa.field(c.name, c.type, nullable=c.nullable) for c in columns if c.since <= version]
    )


def required_columns(version: int, columns: tuple[Column, ...] = COLUMNS) -> list[Column]:
    """Columns a file of ``version`` must carry (those that existed when it was written)."""
    return [c for c in columns if c.since <= version]


def check_id(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid swarm/node id, else raise ValueError saying why."""
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise ValueError(
            f"invalid {kind} {value!r}: use 1-128 characters from [A-Za-z0-9_-] (no dots), "
            "starting with a letter"
        )
    return value
