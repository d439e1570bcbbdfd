"""What a reader accepts from peers, as pure functions and SQL fragments.

Nothing a peer writes may crash a reader. Whole files are judged by their Parquet footer
(corrupt, wrong schema, too large, outside the layout); rows by one SQL ``CASE`` expression
that names the first rule a row breaks; groups by size and consistency. Everything skipped is
counted by reason and logged; the rest stays readable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pyarrow as pa

from ledger.config import RowLimits
from ledger.schema import (
    COLUMNS,
    MAX_COUNTER,
    MAX_SEED,
    MIN_READABLE_VERSION,
    Column,
    required_columns,
    time_window_sql,
)

# File-level reasons.
CORRUPT: Final = "corrupt"
SCHEMA_MISMATCH: Final = "schema_mismatch"
OVERSIZED_FILE: Final = "oversized_file"
MISPLACED: Final = "misplaced"
NOT_REGULAR: Final = "not_regular_file"
CHANGED: Final = "changed_after_indexing"
UNSAFE_KEY: Final = "unsafe_key"
OVERSIZED_CONTENT: Final = "oversized_content"
"""More rows, row groups or uncompressed bytes than a reader takes, by the file's footer."""
# Row-level reasons.
UNSUPPORTED_VERSION: Final = "unsupported_version"
MISSING_FIELD: Final = "missing_field"
INVALID_ID: Final = "invalid_id"
FOREIGN_ID: Final = "foreign_id"
"""A group or rollout id outside its publisher's namespace ``<swarm_id>.<node_id>.``."""
OVERSIZED_TEXT: Final = "oversized_text"
INVALID_VALUE: Final = "invalid_value"
INVALID_REWARD: Final = "invalid_reward"
INVALID_CLAIM: Final = "invalid_claim"
"""A generator's claim (token_ids, token_logprobs, tokenizer) no honest writer makes: one
part without the others, lengths unlike completion_tokens, a negative id or NULL inside, a
log-prob that is not finite and <= 0, a fingerprint not 16 hex digits. (Claims that are
well formed but false are for the receiver to judge: sapo_core/claims.py.)"""
INVALID_TIME: Final = "invalid_time"
"""A timestamp outside ``schema.EARLIEST_TIME`` .. ``LATEST_TIME`` (infinities included)."""
DUPLICATE_ID: Final = "duplicate_id"
# Group-level reasons (counted per row of the group).
OVERSIZED_GROUP: Final = "oversized_group"
INCONSISTENT_GROUP: Final = "inconsistent_group"
DUPLICATE_GROUP: Final = "duplicate_group"

MAX_SHORT_TEXT: Final = 1024
"""Longest model_id or task name."""
MAX_SCHEMA_ELEMENTS: Final = 256
"""Most Parquet schema elements (columns and nested fields) in a file a reader opens."""
RESERVED_COLUMNS: Final = frozenset({"day", "filename"})
"""Names the reader's scan adds (Hive day, file name): a file may not carry them."""
ID_CHARS: Final = "^[A-Za-z0-9._:-]+$"
"""Characters of a rollout or group id (a regular expression, for DuckDB and Python)."""


def _kind_of_arrow(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list<{_kind_of_arrow(t.value_type)}>"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return "other"


# A column of kind (key) may be stored as any of (value): DuckDB widens these losslessly.
_ACCEPTED: Final = {
    "string": {"string"},
    "integer": {"integer"},
    "float": {"float", "integer"},
    "timestamp": {"timestamp"},
    "list<integer>": {"list<integer>"},
    "list<float>": {"list<float>"},
}


def parquet_kind(physical: str | None, converted: str | None, logical: str | None) -> str:
    """Classify one Parquet leaf column (as DuckDB's ``parquet_schema`` reports it)."""
    converted = (converted or "").upper()
    logical = logical or ""
    if physical == "BYTE_ARRAY":
        if converted in ("UTF8", "JSON", "ENUM") or logical.startswith(("String", "Json", "Enum")):
            return "string"
        return "other"
    if physical == "INT96":
        return "timestamp"
    if physical in ("INT32", "INT64"):
        if converted.startswith("TIMESTAMP") or logical.startswith("Timestamp"):
            return "timestamp"
        if converted in ("", "INT_8", "INT_16", "INT_32", "INT_64") and (
            not logical or logical.startswith("Int")
        ):
            return "integer"
        if converted.startswith("UINT") or logical.startswith("Int"):
            return "integer"
        return "other"
    if physical in ("FLOAT", "DOUBLE"):
        return "float"
    return "other"


SchemaRow = tuple[str, str | None, str | None, str | None, int | None]
"""(name, physical type, converted type, logical type, number of children)."""


def top_level_kinds(rows: Sequence[SchemaRow]) -> dict[str, str]:
    """Top-level field kinds from a file's flattened Parquet schema (root first, depth-first).

    Nested fields are walked with an explicit count of pending children, never recursion: a
    peer's schema may nest a thousand levels deep. A top-level field with children is of
    kind ``"nested"``.
    """
    if not rows:
        return {}
    kinds: dict[str, str] = {}
    index = 1
    for _ in range(rows[0][4] or 0):
        if index >= len(rows):
            break
        name, physical, converted, logical, children = rows[index]
        kinds[name] = _list_kind(rows, index) or (
            "nested" if children else parquet_kind(physical, converted, logical)
        )
        index += 1
        pending = children or 0  # descendants of this field still to skip
        while pending and index < len(rows):
            pending += (rows[index][4] or 0) - 1
            index += 1
    return kinds


def _list_kind(rows: Sequence[SchemaRow], index: int) -> str | None:
    """``list<kind>`` when the field at ``index`` is a standard three-level Parquet list of
    one flat leaf (LIST, a repeated group of one child, the element), else None."""
    _, _, converted, logical, children = rows[index]
    if children != 1 or not (
        (converted or "").upper() == "LIST" or (logical or "").startswith("List")
    ):
        return None
    if index + 2 >= len(rows) or rows[index + 1][4] != 1 or rows[index + 2][4]:
        return None
    leaf = rows[index + 2]
    return f"list<{parquet_kind(leaf[1], leaf[2], leaf[3])}>"


def footer_problem(rows: Sequence[SchemaRow]) -> str | None:
    """Why a file's schema alone makes it unreadable (before any column is judged)."""
    if len(rows) > MAX_SCHEMA_ELEMENTS:
        return f"{len(rows)} schema elements > {MAX_SCHEMA_ELEMENTS}"
    return None


def schema_problem(kinds: dict[str, str], columns: tuple[Column, ...] = COLUMNS) -> str | None:
    """Why a file with these top-level column kinds cannot be read, or None if it can.

    Columns added after ``MIN_READABLE_VERSION`` may be absent (older writers); extra flat
    columns from newer writers are ignored (readers select the public columns by name).
    Extra nested columns and the names the reader's scan adds are refused: no reader
    state may depend on what a file carries beyond the public columns.
    """
    reserved = sorted(RESERVED_COLUMNS & set(kinds))
    if reserved:
        return f"reserved column names {reserved}"
    public = {c.name for c in columns}
    nested = sorted(
        n for n, k in kinds.items() if (k == "nested" or k.startswith("list")) and n not in public
    )
    if nested:
        return f"nested extra columns {nested[:5]}"
    missing = [
        c.name for c in required_columns(MIN_READABLE_VERSION, columns) if c.name not in kinds
    ]
    if missing:
        return f"missing columns {missing}"
    wrong = [
        f"{c.name}: {kinds[c.name]} (want {_kind_of_arrow(c.type)})"
        for c in columns
        if c.name in kinds and kinds[c.name] not in _ACCEPTED[_kind_of_arrow(c.type)]
    ]
    if wrong:
        return "wrong column types " + "; ".join(wrong)
    return None


def reject_reason_sql(limits: RowLimits, columns: tuple[Column, ...] = COLUMNS) -> str:
    """A SQL expression over the public columns: the first rule a row breaks, or NULL.

    The limits are validated integers, so inlining them is safe.
    """
    present = [
        f"{c.name} IS NULL"
        if c.since <= MIN_READABLE_VERSION
        # A column newer than the row's writer is allowed to be missing.
        else f"(schema_version >= {c.since} AND {c.name} IS NULL)"
        for c in columns
        if not c.nullable
    ]
    long_text = {
        "question": limits.max_question_chars,
        "answer": limits.max_answer_chars,
        "completion": limits.max_completion_chars,
        "metadata": limits.max_metadata_chars,
        "task_config": limits.max_task_config_chars,
        "model_id": MAX_SHORT_TEXT,
        "task": MAX_SHORT_TEXT,
    }
    oversized = " OR ".join(f"coalesce(strlen({name}), 0) > {n}" for name, n in long_text.items())
    return f"""CASE
        WHEN schema_version IS NULL OR schema_version < {MIN_READABLE_VERSION}
            THEN '{UNSUPPORTED_VERSION}'
        WHEN {" OR ".join(present)} THEN '{MISSING_FIELD}'
        WHEN strlen(rollout_id) > {limits.max_id_chars} OR strlen(group_id) > {limits.max_id_chars}
            OR NOT regexp_matches(rollout_id, '{ID_CHARS}')
            OR NOT regexp_matches(group_id, '{ID_CHARS}') THEN '{INVALID_ID}'
        WHEN NOT starts_with(group_id, swarm_id || '.' || node_id || '.')
            OR NOT starts_with(rollout_id, swarm_id || '.' || node_id || '.')
            THEN '{FOREIGN_ID}'
        WHEN {oversized} THEN '{OVERSIZED_TEXT}'
        WHEN node_round < 0 OR policy_version < 0 OR task_index < 0 OR completion_tokens < 0
            OR completion_tokens > {limits.max_completion_tokens}
            OR greatest(node_round, policy_version, task_index) > {MAX_COUNTER}
            OR abs(task_seed::HUGEINT) > {MAX_SEED} THEN '{INVALID_VALUE}'
        WHEN NOT {time_window_sql("published_at")} THEN '{INVALID_TIME}'
        WHEN {CLAIM_PROBLEM_SQL} THEN '{INVALID_CLAIM}'
        WHEN reward IS NOT NULL AND (isnan(reward) OR reward < 0 OR reward > 1)
            THEN '{INVALID_REWARD}'
        ELSE NULL
    END"""


CLAIM_PROBLEM_SQL: Final = """(token_ids IS NULL) <> (token_logprobs IS NULL)
            OR (token_ids IS NULL) <> (tokenizer IS NULL)
            OR coalesce(
                len(token_ids) <> completion_tokens
                OR len(token_logprobs) <> completion_tokens
                OR list_count(token_ids) <> len(token_ids)
                OR list_count(token_logprobs) <> len(token_logprobs)
                OR list_min(token_ids) < 0
                OR list_max(token_logprobs) > 0
                OR NOT isfinite(list_min(token_logprobs))
                OR NOT regexp_full_match(tokenizer, '[0-9a-f]{16}'),
                false)"""
"""A predicate over a row: its claim is malformed (false when all parts are NULL: no claim).
``list_max`` of the log-probs is above 0 for NaN as for +inf (DuckDB orders NaN last);
``list_min`` catches -inf; ``list_count`` counts the non-NULL elements. The lists' lengths
equal ``completion_tokens``, which ``reject_reason_sql`` bounds by ``max_completion_tokens``
before this rule."""


JUDGED_COLUMNS: Final = """rollout_id, group_id, swarm_id, node_id, model_id, task,
    node_round, policy_version, reward, published_at, task_seed, task_index,
    md5_number(task_config) AS task_config_digest, md5_number(question) AS question_digest,
    md5_number(coalesce(answer, chr(0))) AS answer_digest,
    md5_number(completion) AS completion_digest"""
"""What judging a row keeps of it: the long texts as digests, so that judging a file holds
its ids and numbers in memory, not its completions."""


GROUP_CONTENT_SQL: Final = """md5(concat_ws('|', coalesce(min(task_seed)::VARCHAR, ''),
    coalesce(min(task_index)::VARCHAR, ''), to_hex(min(question_digest)),
    to_hex(min(answer_digest)),
    array_to_string(list_sort(list(DISTINCT to_hex(completion_digest))), ',')))"""
"""An aggregate over one valid group's ``JUDGED_COLUMNS``: a digest of what a receiver trains
on from it, its question (seed, index and text), its answer and the set of its completions
(hex), whoever published it under whatever ids. Two groups with one digest are copies (a peer
may republish another's group, or the receiver's own, as its own): a draw takes each content
once (ledger/policies/fair_draw.sql). The task's configuration is left out (a receiver
accepts it in any JSON spelling), and so are rewards, models and counts, which it derives
itself; the seed and index are numbers, and a copy that changes them fails the receiver's
check of the question it rebuilds from them. Completions as a set, so reordering or
repeating rows makes no new content (the receiver keeps G rows of a group). Each field in
its place, and md5 over them, so a peer cannot choose texts of its own that collide with
another's group. Hex, not md5_number: DuckDB turns a 128-bit number into text at ~0.2 ms
each, and polars reads it as a decimal that wraps past 2^127."""


COMPLETION_KEY_SQL: Final = """md5(concat_ws('|',
    coalesce(task_seed::VARCHAR, ''), coalesce(task_index::VARCHAR, ''),
    to_hex(question_digest), to_hex(answer_digest), to_hex(completion_digest)))::UUID"""
"""Over one row's ``JUDGED_COLUMNS``: the *completion key*, an md5 (as a 128-bit UUID) of
what a receiver trains on from the row, its question (seed, index, text), answer and
completion, whoever published it in whatever group. Copies are judged on these (issue 57):
a draw never hands a receiver a completion it published itself, nor two groups sharing one,
nor under `fresh` one it drew before, however many other rows the group around it holds.
md5 and each field in its place, so that a peer cannot choose a completion whose key is
another's; 128 bits, since every completion is public and a second preimage of one of a
million 64-bit keys would cost ~2^44 hashes."""


def completion_key_text_sql(key: str) -> str:
    """SQL: a completion key as the sample log writes it, 32 lowercase hex digits."""
    return f"replace(({key})::VARCHAR, '-', '')"


def content_digests_sql(source: str) -> str:
    """SQL: (group_id, content_digest) of each group in ``source`` (a relation of public
    columns, e.g. what ``Ledger.sample`` returned)."""
    return (
        f"SELECT group_id, {GROUP_CONTENT_SQL} AS content_digest "
        f"FROM (SELECT {JUDGED_COLUMNS} FROM {source}) GROUP BY group_id"
    )


def completion_keys_sql(source: str) -> str:
    """SQL: (group_id, rollout_id, completion_key) of each row in ``source`` (a relation of
    public columns)."""
    return (
        f"SELECT group_id, rollout_id, {COMPLETION_KEY_SQL} AS completion_key "
        f"FROM (SELECT {JUDGED_COLUMNS} FROM {source})"
    )


def group_problem_sql(limits: RowLimits) -> str:
    """An aggregate SQL expression over one group's rows: why the group is rejected, or NULL.

    The completions of one group answer one question: a group whose rows disagree on it was
    not written by an honest publisher and is not trained on. Runs over ``JUDGED_COLUMNS``.
    """
    # min <> max is count(DISTINCT) > 1 (both skip NULLs) without a hash table per group
    # and column: what made this the costliest step of indexing a few new files.
    same = " OR ".join(
        f"min({name}) <> max({name})"
        for name in (
            "task",
            "task_config_digest",
            "task_seed",
            "task_index",
            "question_digest",
            "answer_digest",
            "node_round",
            "swarm_id",
            "node_id",
        )
    )
    return f"""CASE
        WHEN count(*) > {limits.max_group_size} THEN '{OVERSIZED_GROUP}'
        WHEN {same} THEN '{INCONSISTENT_GROUP}'
        ELSE NULL
    END"""
