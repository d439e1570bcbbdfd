"""Node self-reports: small logs a node writes about its own rounds, beside the rollouts.

Each log is newline-delimited JSON under its own top-level prefix, one file per (swarm, node,
round), in the rollouts' Hive layout::

    <root>/_samples/swarm_id=<S>/node_id=<N>/day=<D>/s<round>-<digest>.jsonl      drawn groups
    <root>/_evaluations/swarm_id=<S>/node_id=<N>/day=<D>/e<round>-<digest>.jsonl  held-out scores
    <root>/_trainings/swarm_id=<S>/node_id=<N>/day=<D>/t<round>-<digest>.jsonl    trained groups

JSON lines rather than Parquet, and a leading underscore, so that a plain
``read_parquet('<root>/**/*.parquet')`` over the ledger sees rollouts only. The digest is of
(swarm, node, round) alone, so a retried round lands on the same name and writes nothing.

**Readers.** ``Catalog`` keeps one DuckDB table per log (named as the log) in sync with the
store: new files are ingested once, the rows of vanished files deleted. ``swarm_id`` and
``node_id`` come from the path (a node may write only under its own prefix), never from a
line, and ``source_file`` names the file a row came from.

**Hostile input.** Every byte is a peer's. A file over ``max_bytes`` is not read. Each line
is parsed with every field kept as JSON, then checked field by field: a field must be
absent, ``null``, or of its column's JSON type (an integer for BIGINT, a number for DOUBLE,
a string for VARCHAR at most ``node_log_columns.MAX_TEXT_CHARS`` long, ``true``/``false``
for BOOLEAN, a timestamp string for TIMESTAMPTZ), finite, and within the column's bounds.
A line that is not a JSON object, breaks any of those rules, or lacks a required column is
skipped whole and counted; a file DuckDB cannot read at all is skipped and reported.
Nesting depth and value sizes cannot crash or hang this reader: it names every column (so
DuckDB infers no schema), DuckDB's JSON parser is iterative, and the file size bounds the
work.

In plain DuckDB (no sapo), trusting every value but not the shape, name the columns too:
left to infer a schema, ``read_json`` recurses into whatever a line nests, and a line
nested 100,000 deep in a field no one asked for crashes the process::

    SELECT * FROM read_json('<root>/_evaluations/*/*/*/*.jsonl', format = 'newline_delimited',
                            hive_partitioning = true, ignore_errors = true,
                            columns = {node_round: 'BIGINT', task: 'VARCHAR',
                                       accuracy: 'DOUBLE'})
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import duckdb

from ledger.keys import digest, parse_key, partition_prefix
from ledger.node_log_columns import LogColumn, bounds_sql, checked_value, typed_sql
from ledger.retrying import first_line
from ledger.schema import MAX_COUNTER, MAX_GROUPS_PER_ROUND, check_id
from ledger.sqltext import sql_list, sql_str

MAX_KEYS_PER_GROUP: Final = 256  # most completion keys a sample log's line holds
COMPLETION_KEYS_PATTERN: Final = "[0-9a-f]{32}(,[0-9a-f]{32})*"

# Why a reader skipped part of a log (ValidationReport reasons).
UNREADABLE: Final = "unreadable_node_log"
OVERSIZED: Final = "oversized_node_log"
INVALID_LINE: Final = "invalid_node_log_line"

_HIVE_TYPES = "{'swarm_id': 'VARCHAR', 'node_id': 'VARCHAR', 'day': 'DATE'}"


@dataclass(frozen=True)
class Problem:
    """What a reader skipped of one log file."""

    reason: str
    detail: str
    lines: int = 0
    """Lines skipped (INVALID_LINE); 0 when the whole file was skipped."""


@dataclass(frozen=True)
class NodeLog:
    """A per-(swarm, node, round) JSON-lines log kept beside the rollouts.

    ``name`` is also the reader's table; ``letter`` starts file names; ``stamp`` is the
    timestamp column a writer fills; ``check`` is an extra SQL predicate over the typed
    columns (NULL counts as true) that a kept line must satisfy.
    """

    name: str
    prefix: str
    letter: str
    columns: tuple[LogColumn, ...]
    stamp: str
    max_bytes: int
    unique: tuple[str, ...] = ()
    """Columns whose values a writer may not repeat within one file."""
    check: str = ""

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if not self.prefix.startswith("_") or not self.prefix.endswith("/"):
            raise ValueError(f"a node log prefix starts with '_' and ends with '/': {self.prefix}")
        if self.stamp not in names or len(set(names)) != len(names):
            raise ValueError(f"{self.name}: bad columns {names} (stamp {self.stamp})")

    # -- layout ------------------------------------------------------------------------

    def file_name(self, swarm_id: str, node_id: str, node_round: int) -> str:
        """The name (without day) of the one file of (swarm, node, round)."""
        name_digest = digest([swarm_id, node_id, str(node_round)], 12)
        return f"{self.letter}{node_round:08d}-{name_digest}.jsonl"

    def key(self, swarm_id: str, node_id: str, node_round: int, when: datetime) -> str:
        day = when.astimezone(UTC).date()
        name = self.file_name(swarm_id, node_id, node_round)
        return f"{self.prefix}{partition_prefix(swarm_id, node_id, day)}/{name}"

    def node_prefix(self, swarm_id: str, node_id: str) -> str:
        """Where all of one node's files of this log lie (every day)."""
        return (
            f"{self.prefix}swarm_id={check_id('swarm_id', swarm_id)}/"
            f"node_id={check_id('node_id', node_id)}/"
        )

    def is_key(self, key: str) -> bool:
        """Whether ``key`` is a file of this log placed as ``key`` places them."""
        rel = key.removeprefix(self.prefix)
        return (
            key.startswith(self.prefix)
            and key.endswith(".jsonl")
            and parse_key(rel.removesuffix(".jsonl") + ".parquet") is not None
        )

    # -- write -------------------------------------------------------------------------

    def lines(self, rows: Iterable[Mapping[str, Any]], when: datetime | None = None) -> bytes:
        """One JSON line per row, fields in column order; ``when`` fills the stamp column."""
        stamp = when.astimezone(UTC).isoformat() if when is not None else None
        out = []
        for row in rows:
            line: dict[str, Any] = {}
            for col in self.columns:
                value = stamp if col.name == self.stamp and stamp is not None else row.get(col.name)
                if isinstance(value, datetime):
                    value = value.astimezone(UTC).isoformat()
                line[col.name] = value
            out.append(json.dumps(line, allow_nan=False))
        return ("\n".join(out) + "\n").encode() if out else b""

    def validate(self, rows: Sequence[Mapping[str, Any]], node_round: int) -> list[dict[str, Any]]:
        """``rows`` checked as strictly as a reader checks them (ValueError saying which and
        why otherwise), ``node_round`` filled in where a row omits it."""
        if isinstance(node_round, bool) or not isinstance(node_round, int) or node_round < 0:
            raise ValueError(f"{self.name}: node_round must be an int >= 0, got {node_round!r}")
        known = {c.name for c in self.columns}
        checked = []
        for i, given in enumerate(rows):
            if not isinstance(given, Mapping):
                raise ValueError(f"{self.name} row {i}: not a dict: {type(given).__name__}")
            row = dict(given)
            row.setdefault("node_round", node_round)
            unknown = sorted(set(row) - known)
            if unknown:
                raise ValueError(f"{self.name} row {i}: unknown fields {unknown}")
            if row.get(self.stamp) is not None:
                raise ValueError(f"{self.name} row {i}: {self.stamp} is stamped by the writer")
            for col in self.columns:
                if col.name != self.stamp:
                    row[col.name] = checked_value(self.name, i, col, row.get(col.name))
            if row["node_round"] != node_round:
                raise ValueError(
                    f"{self.name} row {i}: node_round {row['node_round']} is not {node_round}"
                )
            checked.append(row)
        for name in self.unique:
            counts = Counter(row[name] for row in checked)
            repeated = sorted(v for v, n in counts.items() if n > 1)
            if repeated:
                raise ValueError(f"{self.name}: {name} repeated within one round: {repeated[:5]}")
        return checked

    # -- read --------------------------------------------------------------------------

    @property
    def table_columns(self) -> str:
        """The reader table's columns, as SQL."""
        cols = ", ".join(f"{c.name} {c.type}" for c in self.columns)
        return f"swarm_id VARCHAR, node_id VARCHAR, {cols}, source_file VARCHAR"

    def judged_sql(self, paths: list[str]) -> str:
        """Every line of ``paths``: its typed columns and ``_keep``, whether it is sound."""
        raw_columns = "{" + ", ".join(f"{sql_str(c.name)}: 'JSON'" for c in self.columns) + "}"
        typed = []
        for i, col in enumerate(self.columns):
            ok, value = typed_sql(col)
            absent = f"({col.name} IS NULL OR json_type({col.name}) = 'NULL')"
            typed.append(f"({absent} OR coalesce({ok}, false)) AS _ok{i}")
            typed.append(f"CASE WHEN NOT {absent} AND {ok} THEN {value} END AS {col.name}")
        keep = [f"_ok{i}" for i in range(len(self.columns))]
        keep += [f"{c.name} IS NOT NULL" for c in self.columns if c.required]
        keep += [bounds_sql(c) for c in self.columns if bounds_sql(c)]
        if self.check:
            keep.append(f"coalesce({self.check}, true)")
        return f"""WITH raw AS (
            SELECT * FROM read_json({sql_list(paths)}, format = 'newline_delimited',
                columns = {raw_columns}, hive_partitioning = true, filename = true,
                ignore_errors = true, hive_types = {_HIVE_TYPES})),
        typed AS (SELECT swarm_id, node_id, filename, {", ".join(typed)} FROM raw)
        SELECT swarm_id, node_id, {", ".join(c.name for c in self.columns)},
            filename AS source_file, ({" AND ".join(keep)}) AS _keep
        FROM typed"""

    def ingest(self, con: duckdb.DuckDBPyConnection, paths: list[str]) -> dict[str, Problem]:
        """Add the files ``paths`` to the log's table; return what was skipped, by path.

        One query for the batch; file by file when one file spoils it, so that a file DuckDB
        cannot read at all is skipped alone (UNREADABLE).
        """
        if not paths:
            return {}
        try:
            return self._ingest_batch(con, paths)
        except duckdb.Error:
            pass  # one bad file spoils the batch: isolate it below
        problems: dict[str, Problem] = {}
        for path in paths:
            try:
                problems.update(self._ingest_batch(con, [path]))
            except duckdb.Error as exc:
                problems[path] = Problem(UNREADABLE, first_line(exc))
        return problems

    def _ingest_batch(self, con: duckdb.DuckDBPyConnection, paths: list[str]) -> dict[str, Problem]:
        try:
            con.execute(f"CREATE OR REPLACE TEMP TABLE _node_log AS {self.judged_sql(paths)}")
            con.execute(
                f"INSERT INTO {self.name} SELECT * EXCLUDE (_keep) FROM _node_log WHERE _keep"
            )
            skipped = con.execute(
                "SELECT source_file, count(*) FROM _node_log WHERE NOT _keep GROUP BY 1"
            ).fetchall()
        finally:
            con.execute("DROP TABLE IF EXISTS _node_log")
        return {
            str(path): Problem(INVALID_LINE, f"{int(n)} malformed lines skipped", int(n))
            for path, n in skipped
        }


# -- the logs ----------------------------------------------------------------------------

SAMPLES: Final = NodeLog(
    name="samples",
    prefix="_samples/",
    letter="s",
    columns=(
        LogColumn("node_round", "BIGINT", required=True, low=0, high=MAX_COUNTER),
        LogColumn("group_id", "VARCHAR", required=True),
        LogColumn("peer_node_id", "VARCHAR"),
        LogColumn("content_digest", "VARCHAR"),
        LogColumn("policy", "VARCHAR"),
        LogColumn("seed", "BIGINT"),
        LogColumn("sampled_at", "TIMESTAMPTZ"),
        LogColumn(
            "completion_keys",
            "VARCHAR",
            optional=True,
            max_chars=MAX_KEYS_PER_GROUP * 33,
            pattern=COMPLETION_KEYS_PATTERN,
        ),
    ),
    stamp="sampled_at",
    # Up to MAX_RECORDED_GROUPS lines of ~5 KB at most: a bigger file is skipped unread.
    max_bytes=8 * 2**20,
)
"""Which peer groups a node drew, one line per group (ledger/samples.py); ``completion_keys``:
of the rows it got (validation.COMPLETION_KEY_SQL), 32 hex digits each, comma separated."""
MAX_RECORDED_GROUPS: Final = MAX_GROUPS_PER_ROUND
"""Most groups one sample log records (a node's J is at most 1024)."""

EVALUATIONS: Final = NodeLog(
    name="evaluations",
    prefix="_evaluations/",
    letter="e",
    columns=(
        LogColumn("node_round", "BIGINT", required=True, low=0, high=MAX_COUNTER),
        LogColumn("task", "VARCHAR", required=True),
        LogColumn("questions", "BIGINT", low=0, high=MAX_COUNTER),
        LogColumn("completions", "BIGINT", low=0, high=MAX_COUNTER),
        LogColumn("correct", "DOUBLE", low=0, high=MAX_COUNTER),
        LogColumn("accuracy", "DOUBLE", low=0, high=1),
        LogColumn("policy_version", "BIGINT", low=0, high=MAX_COUNTER),
        LogColumn("eval_seed", "BIGINT"),
        LogColumn("evaluated_at", "TIMESTAMPTZ"),
    ),
    stamp="evaluated_at",
    max_bytes=4 * 2**20,
    unique=("task",),
)
"""A node's held-out evaluation, one line per task per evaluation. ``node_round``: the policy
evaluated is the one at the start of that round (after ``node_round`` updates); ``correct``
is the sum of rewards, ``accuracy`` = correct / completions."""

DRIFT_LOG_LIMIT: Final = 20.0
"""sapo_core/grpo/offpolicy.py clamps log-ratios to +-20 (the two packages never import each
other; tests/unit/test_layering.py holds them equal)."""
DRIFT_WEIGHT_LIMIT: Final = 5e8
"""e^20 rounded up: the largest token ratio after that clamp."""

TRAININGS: Final = NodeLog(
    name="trainings",
    prefix="_trainings/",
    letter="t",
    columns=(
        LogColumn("node_round", "BIGINT", required=True, low=0, high=MAX_COUNTER),
        LogColumn("group_id", "VARCHAR", required=True),
        LogColumn("origin", "VARCHAR", choices=("local", "external")),
        LogColumn("peer_node_id", "VARCHAR", node_id=True),
        LogColumn("task", "VARCHAR"),
        LogColumn("completions", "BIGINT", low=0, high=MAX_COUNTER),
        LogColumn("reward_mean", "DOUBLE", low=0, high=1),
        LogColumn("informative", "BOOLEAN"),
        LogColumn("trained", "BOOLEAN"),
        LogColumn("loss_share", "DOUBLE", low=0, high=1, optional=True),
        LogColumn("drift_tokens", "BIGINT", low=0, high=MAX_COUNTER, optional=True),
        LogColumn("drift_kl", "DOUBLE", low=-DRIFT_LOG_LIMIT, high=DRIFT_LOG_LIMIT, optional=True),
        LogColumn("drift_weight_mean", "DOUBLE", low=0, high=DRIFT_WEIGHT_LIMIT, optional=True),
        LogColumn(
            "drift_weight_sq_mean", "DOUBLE", low=0, high=DRIFT_WEIGHT_LIMIT**2, optional=True
        ),
        LogColumn("drift_capped", "DOUBLE", low=0, high=1, optional=True),
        LogColumn("recorded_at", "TIMESTAMPTZ"),
    ),
    stamp="recorded_at",
    max_bytes=64 * 2**20,
    unique=("group_id",),
)
"""What a node trained on in a round, one line per group considered for its training set:
``origin`` 'local' or 'external', ``peer_node_id`` the publisher (the node itself for local
groups), ``reward_mean`` under this node's verifier, ``informative`` whether its rewards
differ, ``trained`` false when it was dropped as zero-variance, ``loss_share`` its share of
the update's loss weight (0 when not trained; absent from logs written before it).
``drift_*``: how far the group's generator was from this node's policy before the step,
over its ``drift_tokens`` tokens whose generator's log-probs were known
(sapo_core/grpo/offpolicy.py): the mean (generator - self) log-prob (a KL estimate), the
mean and mean square of the token ratios (self / generator: a peer's effective sample size
is (sum n*mean)^2 / (sum n * sum n*sq_mean)), and the fraction of tokens the correction cut
(or would have, at its cap, under none). NULL where no row carried a usable claim."""

ALL: Final = (SAMPLES, EVALUATIONS, TRAININGS)
PREFIXES: Final = tuple(log.prefix for log in ALL)
