"""The read side of a ledger: peers' groups drawn by a sampling policy's SQL, and SQL over
the views (``rollouts``, ``groups``, the node logs, ``manifests``, ``ledger_files``). Reads
only read: what a node drew is written by the write side (``LedgerWrites.write_sample``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import duckdb
import polars as pl

from ledger import validation
from ledger.catalog import FileChanged
from ledger.draw_request import DrawRequest
from ledger.draws import check_draw_key, public_draw_key
from ledger.handle import LedgerHandle, serialized
from ledger.policies import AnyPolicy, build_drawable, parse_policy
from ledger.retrying import first_line
from ledger.schema import check_id
from ledger.sqltext import parameters_for

MAX_GROUPS_PER_SAMPLE = 100_000
DRAW_POOL_PER_GROUP = 16
"""A draw looks first among the lowest 16 draws per group asked for (see ``_draw``)."""
MAX_CUT_PASSES = 16
"""At most this many draws again without copies a hard cap cut (fair_draw.sql ``cut``):
each pass drops at least one, and a chain longer than this needs as many peers, each
full, copying one content."""
MAX_OVERLAP_PASSES = 16
"""At most this many draws again without a group whose completions an earlier group of the
same draw holds (``_draw``); what is left overlapping after them is left out of the sample."""
Drawn = list[tuple[str, list[UUID], bool]]
"""A draw's groups in draw order, each with the completion keys the receiver keeps of it and
whether that is not every row (the group was recut)."""
_INT64 = (-(2**63), 2**63 - 1)


def whole_decimals_as_integers(frame: pl.DataFrame) -> pl.DataFrame:
    """DuckDB sums a BIGINT column (tokens, counts) to a 128-bit HUGEINT, which reaches
    polars as ``decimal[38,0]``: a count a person reads as a decimal. Such columns whose
    values fit 64 bits become Int64; a larger sum stays as it is, and so does a decimal
    the SQL asked for (``::DECIMAL(18, 0)``)."""

    def fits(column: pl.Series) -> bool:
        low, high = column.min(), column.max()
        return low is None or bool(_INT64[0] <= low and high <= _INT64[1])  # type: ignore[operator]

    whole = [
        name
        for name, dtype in frame.schema.items()
        if isinstance(dtype, pl.Decimal)
        and (dtype.precision, dtype.scale) == (38, 0)
        and fits(frame[name])
    ]
    return frame.with_columns(pl.col(whole).cast(pl.Int64)) if whole else frame


def _overlapping(drawn: Drawn) -> list[str]:
    """The groups of a draw, in draw order, holding a completion an earlier one holds."""
    seen: set[UUID] = set()
    later = []
    for group_id, keys, _ in drawn:
        if seen.isdisjoint(keys):
            seen.update(keys)
        else:
            later.append(group_id)
    return later


class LedgerReads(LedgerHandle):
    @serialized
    def sample(
        self,
        node_id: str,
        n_groups: int,
        policy: str | dict[str, Any] | AnyPolicy = "paper",
        seed: int = 0,
        *,
        swarm_id: str | None = None,
        now: datetime | None = None,
        exclude_nodes: Sequence[str] = (),
        known_nodes: Sequence[str] | None = None,
        for_round: int | None = None,
        tasks: Sequence[str] | None = None,
        draw_key: str | None = None,
        rows_per_group: int | None = None,
        standing: Mapping[str, int] | None = None,
    ) -> pl.DataFrame:
        """The completions ``node_id`` would train on of up to ``n_groups`` peer groups.

        Never the node's own groups, nor a completion it published itself (however a peer
        wraps it), nor two groups that share a completion. The same key (or seed) over the
        same ledger gives the same sample. Fewer groups come back when fewer qualify.
        Nothing is written: a node records what it drew with ``write_sample``.
        ``exclude_nodes``: peers the receiver no longer samples (its reputation of them);
        ``known_nodes``: peers it has verified enough of: groups of all other peers together
        come after the known ones' beyond the policy's ``max_unknown_share`` (None: every
        peer counts as known); ``for_round``: the receiver's round this draw is for (policies
        that remember earlier draws, `fresh`, count only those of earlier rounds, so a
        retried round draws again what it drew the first time); ``tasks``: the tasks the
        receiver can judge (None: any), so that groups it could not verify take no slot;
        ``draw_key``: the receiver's secret key for this draw (ledger/draws.py; None: a
        public key from ``seed``, which anyone can compute); ``rows_per_group``: the
        receiver's group size G: of each group at most G rows, chosen by the key;
        ``standing``: peers not known yet but judged well so far, with the rows judged of
        each: within the unknown-peer budget, more rows first.
        """
        request = DrawRequest(
            node_id=node_id,
            n_groups=n_groups,
            policy=policy,
            seed=seed,
            swarm_id=swarm_id,
            exclude_nodes=exclude_nodes,
            known_nodes=known_nodes,
            standing=standing or {},
            for_round=for_round,
            tasks=tasks,
            draw_key=draw_key,
            rows_per_group=rows_per_group,
        )
        return self.draw(request, now)

    @serialized
    def draw(self, request: DrawRequest, now: datetime | None = None) -> pl.DataFrame:
        """What ``request`` draws, as ``sample`` returns it (``sample``'s arguments, typed:
        the form a node's round uses)."""
        draw = self._draw(request, now or datetime.now(UTC))

        def attempt() -> pl.DataFrame:
            drawn = draw()
            frame = self.catalog.fetch_groups([g for g, _, _ in drawn])
            if frame is None:
                return self._empty()
            return self._kept_rows(frame, [(g, keys if cut else None) for g, keys, cut in drawn])

        frame: pl.DataFrame = self._with_refresh(attempt)
        return frame

    @serialized
    def sample_group_ids(
        self,
        node_id: str,
        n_groups: int,
        policy: Any = "paper",
        seed: int = 0,
        *,
        now: datetime | None = None,
        **options: Any,
    ) -> list[str]:
        """The group ids ``sample`` would return, in draw order, without reading their rows
        (``options``: ``sample``'s keyword arguments, the fields of `DrawRequest`)."""
        request = DrawRequest(
            node_id=node_id, n_groups=n_groups, policy=policy, seed=seed, **options
        )
        return self.draw_group_ids(request, now)

    @serialized
    def draw_group_ids(self, request: DrawRequest, now: datetime | None = None) -> list[str]:
        """The group ids ``draw`` would return, in draw order, without reading their rows."""
        draw = self._draw(request, now or datetime.now(UTC))
        drawn: Drawn = self._with_refresh(draw)
        return [g for g, _, _ in drawn]

    @serialized
    def logged_draw(self, swarm_id: str, node_id: str, node_round: int) -> pl.DataFrame | None:
        """What ``node_id`` drew for ``node_round``, as its sample log says (the groups and,
        where logged, the completions it got), read again; None when it logged no draw for
        that round. A round retried after its draw was logged trains on this, not on a new
        draw: the log stays the record of what the round trained on."""

        def attempt() -> pl.DataFrame | None:
            logged = self.con.execute(
                "SELECT group_id, any_value(completion_keys) FROM samples WHERE swarm_id = $s "
                "AND node_id = $n AND node_round = $r GROUP BY group_id ORDER BY min(rowid)",
                {"s": swarm_id, "n": check_id("node_id", node_id), "r": int(node_round)},
            ).fetchall()
            if not logged:
                return None
            frame = self.catalog.fetch_groups([g for g, _ in logged])
            if frame is None:
                return self._empty()
            # A log written before keys were keeps the group whole.
            keys = [(g, [UUID(k) for k in ks.split(",")] if ks else None) for g, ks in logged]
            return self._kept_rows(frame, keys)

        found: pl.DataFrame | None = self._with_refresh(attempt)
        return found

    def _draw(self, request: DrawRequest, when: datetime) -> Callable[[], Drawn]:
        """A call that builds ``drawable`` (the groups as the receiver would train on them,
        keyed by its draw key) and runs the policy's SQL over it: the drawn groups in draw
        order, with the completions kept of each."""
        n_groups, rows_per_group = request.n_groups, request.rows_per_group
        chosen = parse_policy(request.policy)
        if not 0 <= n_groups <= MAX_GROUPS_PER_SAMPLE:
            raise ValueError(f"n_groups must be in [0, {MAX_GROUPS_PER_SAMPLE}], got {n_groups}")
        if rows_per_group is not None and rows_per_group < 2:
            raise ValueError(f"rows_per_group must be at least 2, got {rows_per_group}")
        node_id = check_id("node_id", request.node_id)
        key = (
            check_draw_key(request.draw_key)
            if request.draw_key is not None
            else public_draw_key(node_id, request.seed)
        )
        known = request.known_nodes
        # One set of parameters: building `drawable` and the policy's query each take the
        # ones they name.
        params = {
            "node_id": node_id,
            "swarm_id": request.swarm_id,
            "draw_key": key,
            "rows_per_group": None if rows_per_group is None else int(rows_per_group),
            "remember": chosen.remembers,
            "n_groups": int(n_groups),
            "excluded": [check_id("node_id", n) for n in request.exclude_nodes],
            "known": None if known is None else [check_id("node_id", n) for n in known],
            "node_round": None if request.for_round is None else int(request.for_round),
            "tasks": None if request.tasks is None else [str(t) for t in request.tasks],
            # a request holds a dict here, possibly empty (DrawRequest.__post_init__)
            "standing": [check_id("node_id", n) for n in request.standing] or None,
            "standing_rows": [int(v) for v in request.standing.values()] or None,
            **chosen.caps(int(n_groups)),
            **chosen.parameters(when),
        }
        sql = chosen.sql
        policy_params = parameters_for(sql, params)  # $pool and $cut: each pass's own

        def draw() -> Drawn:
            if n_groups == 0:
                return []
            build_drawable(self.con, params)
            for _ in range(MAX_OVERLAP_PASSES):
                drawn = self._kept(self._settled(sql, policy_params, n_groups))
                overlapping = _overlapping(drawn)
                if not overlapping:
                    return drawn
                # A group holding a completion an earlier group of this draw holds would
                # train the receiver on it twice: every such group leaves the draw at once
                # (however many a peer made), which is taken again.
                accepted = [g for g, _, _ in drawn if g not in set(overlapping)]
                self.con.execute(
                    "DELETE FROM drawable WHERE group_id IN (SELECT d.group_id FROM drawable d "
                    "JOIN groups g USING (group_id) WHERE NOT list_contains($accepted, d.group_id) "
                    "AND list_has_any(coalesce(d.kept_keys, g.completion_keys), $keys::UUID[]))",
                    {"accepted": accepted,
                     "keys": sorted({k for g, keys, _ in drawn if g in accepted for k in keys})},
                )  # fmt: skip
            return [g for g in drawn if g[0] not in set(overlapping)]

        return draw

    def _settled(self, sql: str, params: dict[str, Any], n_groups: int) -> list[str]:
        """The policy's draw over ``drawable``: its group ids, in draw order."""
        # First among the lowest draws only. That answer is the answer over all
        # candidates when it is full and no cap put any of it late, and none of it is
        # an unknown peer's (the unknown cap counts across all candidates; a peer's
        # rank among its own draws is the same in the pool as overall). A copy cut in
        # the pool is cut overall: the pool holds the lowest draws of its peer.
        cut: list[str] = []
        rows = self._without_cut_copies(sql, params, DRAW_POOL_PER_GROUP * int(n_groups), cut)
        if len(rows) < n_groups or any(late or unknown for _, late, unknown, _ in rows):
            rows = self._without_cut_copies(sql, params, None, cut)
        return [r[0] for r in rows]

    def _kept(self, group_ids: list[str]) -> Drawn:
        """Each drawn group with the completion keys the receiver keeps of it, in order."""
        if not group_ids:
            return []
        found = {
            g: (list(keys or []), cut)
            for g, keys, cut in self.con.execute(
                "SELECT d.group_id, coalesce(d.kept_keys, g.completion_keys), "
                "d.kept_keys IS NOT NULL FROM drawable d "
                "JOIN groups g USING (group_id) WHERE list_contains($ids, d.group_id)",
                {"ids": group_ids},
            ).fetchall()
        }
        return [(g, *found.get(g, ([], False))) for g in group_ids]

    def _kept_rows(
        self, frame: pl.DataFrame, drawn: Sequence[tuple[str, list[UUID] | None]]
    ) -> pl.DataFrame:
        """``frame`` (the drawn groups' rows) cut to the completions kept of each group (a
        completion kept twice, as two of its rows: the first by rollout id; None: all)."""
        if frame.is_empty() or all(keys is None for _, keys in drawn):
            return frame  # no group recut: every row is kept
        kept = {g: Counter(keys) for g, keys in drawn if keys is not None}
        whole = {g for g, keys in drawn if keys is None}
        self.con.register("_drawn_rows", frame.to_arrow())
        try:
            keys = self.con.execute(validation.completion_keys_sql("_drawn_rows")).fetchall()
        finally:
            self.con.unregister("_drawn_rows")
        keep: dict[str, list[str]] = {}
        for group_id, rollout_id, key in sorted(keys, key=lambda r: (r[0], r[1])):
            left = kept.get(group_id)
            if group_id in whole:
                keep.setdefault(group_id, []).append(rollout_id)
            elif left is not None and left[key] > 0:
                left[key] -= 1
                keep.setdefault(group_id, []).append(rollout_id)
        # A group whose rows no longer match its keys (a file changed under the read) and
        # that is left with fewer than two is no group to train on.
        rows = sorted(r for ids in keep.values() if len(ids) >= 2 for r in ids)
        return frame.filter(pl.col("rollout_id").is_in(rows))

    def _without_cut_copies(
        self, sql: str, params: dict[str, Any], pool: int | None, cut: list[str]
    ) -> list[tuple[Any, ...]]:
        """The draw's rows once no copy is cut by a hard cap (fair_draw.sql ``cut``);
        ``cut`` gathers the copies dropped."""
        rows: list[tuple[Any, ...]] = []
        for _ in range(MAX_CUT_PASSES):
            rows = self.con.execute(sql, {**params, "pool": pool, "cut": cut or None}).fetchall()
            more = rows[0][3] if rows else None
            if not more:
                break
            cut.extend(more)
        return rows

    def _run_statements(
        self, sql: str, params: dict[str, Any] | list[Any] | None
    ) -> duckdb.DuckDBPyConnection:
        """``sql`` on this connection; of several statements (a policy's ``--show-sql``:
        ``drawable`` built, then the draw), each with the named parameters it uses, since
        DuckDB binds parameters to one statement only. The last one's result."""
        if not isinstance(params, dict) or not params:
            return self.con.execute(sql, params)
        statements = duckdb.extract_statements(sql)
        if len(statements) < 2:
            return self.con.execute(sql, params)
        for statement in statements:  # a name not given is DuckDB's error, in one line
            mine = {k: v for k, v in params.items() if k in statement.named_parameters}
            found = self.con.execute(statement, mine)
        return found

    @serialized
    def query(self, sql: str, params: dict[str, Any] | list[Any] | None = None) -> pl.DataFrame:
        """Run SQL over the views ``rollouts``, ``groups``, ``samples``, ``evaluations``,
        ``trainings``, ``manifests`` and ``ledger_files``.

        ``samples``, ``evaluations`` and ``trainings`` are the nodes' self-reports
        (ledger/node_logs.py): each row carries ``swarm_id``, ``node_id`` (from the file's
        place) and ``source_file``."""

        def attempt() -> pl.DataFrame:
            try:
                self.catalog.ensure_views()  # binding the views reads every file's footer
                return whole_decimals_as_integers(self._run_statements(sql, params).pl())
            except duckdb.Error as exc:
                # A file changed under the views is forgotten and the query retried;
                # anything else (the caller's SQL) is the caller's error.
                if self.catalog.recover_from(exc):
                    raise FileChanged(f"files changed under the query: {first_line(exc)}") from exc
                raise

        return self._with_refresh(attempt)

    def evaluated_nodes(self, swarm_id: str, node_round: int) -> set[str]:
        """The nodes of ``swarm_id`` whose held-out evaluation at ``node_round`` is recorded."""
        found = self.query(
            "SELECT DISTINCT node_id FROM evaluations WHERE swarm_id = $s AND node_round = $r",
            {"s": swarm_id, "r": node_round},
        )
        return set(found["node_id"].to_list())
