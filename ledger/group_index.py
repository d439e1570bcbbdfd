"""The group index: one summary row per valid group, and the rows behind it, in DuckDB.

A file admitted (ledger/admission.py) has its rows judged once, in SQL (ledger/
validation.py), as it is indexed: the rows a peer got wrong are counted by reason, and each
valid group leaves one row in ``group_index`` (every indexed copy of it) and, unless another
copy is served already, in ``groups`` (what sampling policies query); the accepted rows'
places in their file go to ``valid_rows``. Judged rows keep ids, numbers and digests, never
the completions: memory stays small however much text a ledger holds. ``rollouts`` is a
view over the served files that reads the accepted rows only.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import pyarrow as pa

from ledger import validation as v
from ledger.admission import FileState
from ledger.config import RowLimits
from ledger.sqltext import PUBLIC_COLUMNS_SQL, TYPED_EMPTY_NUMBERED, scan_sql, sql_in, sql_list

TABLES = ("group_index", "groups", "valid_rows")
"""The index's own tables (a reader index copies them as they are)."""
INGEST_BATCH_FILES = 2000
"""Files read per ingest query: bounds memory when a reader first meets a large ledger."""
Failure = Callable[[str, duckdb.Error], tuple[str, str]]
"""Why reading a file (by key) failed: its (status, detail)."""

GROUP_COLUMNS = """
    group_id VARCHAR, swarm_id VARCHAR, node_id VARCHAR, model_id VARCHAR, task VARCHAR,
    node_round BIGINT, policy_version BIGINT, size INTEGER, reward_mean DOUBLE,
    reward_std DOUBLE, reward_min DOUBLE, reward_max DOUBLE, published_at TIMESTAMPTZ,
    day DATE, source_file VARCHAR, content_digest VARCHAR, first_seen TIMESTAMPTZ,
    completion_keys UUID[], claims DOUBLE[]
"""
"""``content_digest``: what the group says (validation.GROUP_CONTENT_SQL), the same for
every copy of it under any ids. ``first_seen``: when this reader first indexed the group, by
its own clock. Recency windows use ``least(published_at, first_seen)``: a publisher's clock
may make its group look older, never newer than the reader saw it. ``completion_keys`` and
``claims``: each row's completion key (validation.COMPLETION_KEY_SQL) and claimed reward, in
one order (by rollout id): a draw judges copies, and cuts a group to the receiver's size, on
these (ledger/policies/drawable.sql)."""


class GroupIndex:
    def __init__(self, con: duckdb.DuckDBPyConnection, limits: RowLimits) -> None:
        self.con = con
        self.reason_sql = v.reject_reason_sql(limits)
        """Why a row is rejected (NULL: accepted), as a SQL expression over its columns."""
        self._group_problem_sql = v.group_problem_sql(limits)
        con.execute(f"CREATE TABLE group_index ({GROUP_COLUMNS})")
        con.execute(f"CREATE TABLE groups ({GROUP_COLUMNS})")
        # Sampling looks up a handful of drawn groups among up to millions, and a refresh
        # serves a new group unless its id is served already: both through the key's index.
        con.execute("ALTER TABLE groups ADD PRIMARY KEY (group_id)")
        # Every accepted row by its place in its file: what ``rollouts`` serves, found by a
        # join instead of judging (and de-duplicating) the rows again on every query. One
        # row per file: a sample finds its few files' rows without a pass over every row.
        con.execute("CREATE TABLE valid_rows (filename VARCHAR, file_row_numbers BIGINT[])")
        con.execute(
            "CREATE TABLE ledger_files (key VARCHAR, size BIGINT, status VARCHAR, "
            "detail VARCHAR, rows BIGINT, rejected_rows BIGINT)"
        )

    def ingest(self, batch: list[FileState], failure: Failure) -> None:
        """Judge the rows of ``batch`` and add one summary row per valid group; a file that
        cannot be read gets ``failure``'s verdict."""
        try:
            self._ingest_query(batch)
        except duckdb.Error as exc:
            if len(batch) == 1:
                batch[0].status, batch[0].detail = failure(batch[0].key, exc)
                return
            # One bad file spoils a multi-file scan: retry one by one to isolate it.
            for state in batch:
                self.ingest([state], failure)

    def _ingest_query(self, batch: list[FileState]) -> None:
        con = self.con
        # Judged rows keep ids, numbers and digests of the texts (v.JUDGED_COLUMNS), never
        # the completions: memory stays small however much text a batch holds.
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE _judged AS
            WITH raw AS ({scan_sql(sql_list([s.path for s in batch]), row_numbers=True)}),
            reasoned AS (
                SELECT {v.JUDGED_COLUMNS}, day, filename, file_row_number,
                    {self.reason_sql} AS reason
                FROM raw)
            SELECT * EXCLUDE (reason),
                CASE WHEN reason IS NULL AND row_number() OVER (
                    PARTITION BY filename, rollout_id, reason IS NULL
                    ORDER BY completion_digest) > 1
                THEN '{v.DUPLICATE_ID}' ELSE reason END AS reason
            FROM reasoned"""
        )
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE _groups AS
            SELECT group_id, any_value(swarm_id) AS swarm_id, any_value(node_id) AS node_id,
                any_value(model_id) AS model_id, any_value(task) AS task,
                any_value(node_round) AS node_round, max(policy_version) AS policy_version,
                count(*)::INTEGER AS size, avg(reward) AS reward_mean,
                stddev_pop(reward) AS reward_std, min(reward) AS reward_min,
                max(reward) AS reward_max, max(published_at) AS published_at,
                any_value(day) AS day, filename AS source_file,
                {v.GROUP_CONTENT_SQL} AS content_digest, current_timestamp AS first_seen,
                list({v.COMPLETION_KEY_SQL} ORDER BY rollout_id) AS completion_keys,
                list(reward ORDER BY rollout_id) AS claims,
                {self._group_problem_sql} AS problem
            FROM _judged WHERE reason IS NULL
            GROUP BY filename, group_id"""
        )
        # A group seen before (in a file compaction since merged) keeps its first sight,
        # which every indexed copy of it carries, the served one too.
        con.execute(
            """CREATE OR REPLACE TEMP TABLE _accepted AS
            SELECT g.* EXCLUDE (problem) REPLACE (
                coalesce(seen.first_seen, g.first_seen) AS first_seen)
            FROM _groups g LEFT JOIN (
                SELECT group_id, first_seen FROM groups SEMI JOIN _groups USING (group_id)
            ) seen USING (group_id)
            WHERE g.problem IS NULL"""
        )
        con.execute("INSERT INTO group_index SELECT * FROM _accepted")
        # Served unless its id is served already (another copy, or another file of a
        # peer that reuses ids): through the key's index, not a pass over all groups.
        # In file order, the first copy of a group the batch holds twice wins (DuckDB
        # inserts in the order given): what a window over the batch chose, for less.
        con.execute(
            "INSERT INTO groups SELECT * FROM _accepted ORDER BY source_file ON CONFLICT DO NOTHING"
        )
        con.execute(
            """INSERT INTO valid_rows
            SELECT j.filename, list(j.file_row_number ORDER BY j.file_row_number) FROM _judged j
            SEMI JOIN _groups g ON j.filename = g.source_file AND j.group_id = g.group_id
                AND g.problem IS NULL
            WHERE j.reason IS NULL
            GROUP BY j.filename"""
        )
        by_path = {s.path: s for s in batch}
        counts = con.execute(
            """SELECT filename, reason, count(*) FROM _judged GROUP BY ALL
            UNION ALL
            SELECT source_file, problem, sum(size) FROM _groups
            WHERE problem IS NOT NULL GROUP BY ALL"""
        ).fetchall()
        for path, reason, n in counts:
            state = by_path[path]
            state.rows += int(n)
            if reason is not None:
                state.rejected[reason] += int(n)
        con.execute("DROP TABLE _judged; DROP TABLE _groups; DROP TABLE _accepted")

    def drop(self, paths: list[str]) -> None:
        """Stop serving the files at ``paths``: their index rows go, and each group one of
        them served is served from another indexed copy, if there is one."""
        if not paths:
            return
        con = self.con
        # Paths go in as a small table joined by hash: a list literal tested row by row
        # costs (rows x paths), and compaction removes many files at once.
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _removed AS "
            f"SELECT unnest({sql_list(paths)}::VARCHAR[]) AS path"
        )
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _orphaned AS SELECT group_id FROM groups "
            "WHERE source_file IN (SELECT path FROM _removed)"
        )
        for table, column in (
            ("valid_rows", "filename"),
            ("group_index", "source_file"),
            ("groups", "source_file"),
        ):
            con.execute(f"DELETE FROM {table} WHERE {column} IN (SELECT path FROM _removed)")
        # Each orphan from its first other copy by file name (DuckDB inserts in the order
        # given), as a new group is served.
        con.execute(
            """INSERT INTO groups
            SELECT gi.* FROM group_index gi SEMI JOIN _orphaned USING (group_id)
            ORDER BY gi.source_file ON CONFLICT DO NOTHING"""
        )
        con.execute("DROP TABLE _orphaned; DROP TABLE _removed")

    def define_views(self, states: list[FileState], ok_paths: list[str]) -> None:
        """(Re)define ``ledger_files`` (``states``) and ``rollouts`` (the accepted rows of
        the files at ``ok_paths``)."""
        con = self.con
        con.execute("DELETE FROM ledger_files")
        if states:
            con.register(
                "_files_arrow",
                pa.table(
                    {
                        "key": [s.key for s in states],
                        "size": [s.size for s in states],
                        "status": [s.status for s in states],
                        "detail": [s.detail for s in states],
                        "rows": [s.rows for s in states],
                        "rejected_rows": [sum(s.rejected.values()) for s in states],
                    }
                ),
            )
            con.execute("INSERT INTO ledger_files SELECT * FROM _files_arrow ORDER BY key")
            con.unregister("_files_arrow")
        if ok_paths:
            con.execute(f"SET VARIABLE sapo_ledger_files = {sql_list(ok_paths)}")
        # Streams: no window or sort over the rows, whose texts may be large.
        source = (
            scan_sql("getvariable('sapo_ledger_files')", row_numbers=True)
            if ok_paths
            else TYPED_EMPTY_NUMBERED
        )
        con.execute(
            f"""CREATE OR REPLACE VIEW rollouts AS
            WITH raw AS ({source})
            SELECT {PUBLIC_COLUMNS_SQL} FROM raw
            SEMI JOIN (SELECT filename, unnest(file_row_numbers) AS file_row_number
                FROM valid_rows) v
                ON raw.filename = v.filename AND raw.file_row_number = v.file_row_number
            SEMI JOIN groups g ON raw.group_id = g.group_id AND raw.filename = g.source_file"""
        )

    def locate(self, group_ids: list[str]) -> tuple[list[tuple[str, str, int]], dict[str, str]]:
        """(group id, the file it is served from, its size) of each of ``group_ids`` that is
        served, and the query parameters that name the ids."""
        # Ids go to DuckDB as parameters, never as SQL text: a peer chose them.
        params = {f"g{i}": g for i, g in enumerate(group_ids)}
        wanted = ", ".join(f"${name}" for name in params)
        located = self.con.execute(
            f"SELECT group_id, source_file, size FROM groups WHERE group_id IN ({wanted})", params
        ).fetchall()
        return located, params

    def read_rows(self, files: list[str], params: dict[str, str]) -> pa.Table:
        """The accepted rows of the groups named by ``params`` (``locate``'s) in ``files``,
        with the file each came from."""
        wanted = ", ".join(f"${name}" for name in params)
        # Always by name: a peer's file may store a column in a narrower type, which a scan
        # typed by the first file would force onto the others. Only rows the index accepted
        # (valid_rows) are read out, so a file that repeats one id a million times yields
        # the group's rows, not the million.
        scan = scan_sql(sql_list(files), where=f"group_id IN ({wanted})", row_numbers=True)
        return self.con.execute(
            f"SELECT {PUBLIC_COLUMNS_SQL}, filename FROM ({scan}) raw "
            "SEMI JOIN (SELECT filename, unnest(file_row_numbers) AS file_row_number "
            f"FROM valid_rows WHERE filename IN {sql_in(files)}) v "
            "ON raw.filename = v.filename AND raw.file_row_number = v.file_row_number "
            f"WHERE ({self.reason_sql}) IS NULL",
            params,
        ).arrow()

    def duplicate_rows(self) -> int:
        """Rows of indexed groups not served (another copy of the group is)."""
        found = self.con.execute(
            "SELECT coalesce(sum(size), 0) FROM group_index gi "
            "ANTI JOIN groups g USING (group_id, source_file)"
        ).fetchone()
        return int(found[0]) if found else 0
