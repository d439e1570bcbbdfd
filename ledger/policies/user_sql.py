"""A user's own sampling policy: their SQL file, with the guarantees of the shipped ones.

A swarm names it as its policy::

    sampling:
      kind: sql
      file: my_policy.sql          # beside the swarm file (or absolute)
      params: {min_mean: 0.25}     # bound to $min_mean in the file
      weighted: false              # true: `candidates` has a `weight` column (> 0)

The file is the first part of a query, as ``ledger/policies/paper.sql`` is: a ``WITH`` clause
whose last common table expression is ``candidates``, one row per group the user would draw
from ``drawable`` (the groups as this receiver would train on them: its own completions,
repeats and rows beyond its group size left out; columns in ledger/policies/drawable.sql)
with at least ``group_id``. It may read every parameter the sampler binds (``$node_id``,
``$swarm_id``, ``$tasks``, ``$now`` ...) and its own ``params``.

What the user's SQL cannot change, because the sampler adds it after ``candidates``
(`guarded_sql`): never the receiver's own groups nor those of peers it excluded, only tasks
its verifier judges, the swarm it is in; the draw order is ``drawable``'s ``u``, keyed by the
receiver's secret (or ``-ln(u) / weight`` when ``weighted``: a weighted draw without
replacement), never a column a publisher sets; and ``fair_draw.sql``'s caps on any one peer,
on peers not yet known and on copies. The text travels in the resolved swarm (``query``), so
a deployment's workers need no copy of the file. It is checked when the config loads: a file
that does not end in ``candidates``, a parameter the user named that the sampler binds, or
SQL that DuckDB refuses over an empty ledger (ledger/policy_check.py) is a one-line error.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import duckdb
from pydantic import Field, ValidationInfo, field_validator, model_validator

from ledger.policies.base import _Policy
from ledger.sqltext import named_parameters, sql_code

Param = str | int | float | bool | None | list[str] | list[int] | list[float]
"""A value a user's SQL parameter may take (JSON's scalars and lists of them)."""

SAMPLER_PARAMETERS = frozenset(
    {
        "node_id", "swarm_id", "draw_key", "rows_per_group", "remember", "n_groups", "excluded",
        "known", "node_round", "tasks", "standing", "standing_rows", "max_per_peer",
        "peer_share_cap", "unknown_cap", "pool", "cut", "now",
    }
)  # fmt: skip
"""The parameters the sampler binds (ledger/reads.py `_draw`): a user's SQL may read them,
its `params` may not set them."""

_ENDS_IN_CANDIDATES = re.compile(r"\bcandidates\s+AS\s*\((?s:.*)\)\s*$", re.IGNORECASE)
_LAST_CTE = re.compile(r"\b(\w+)\s+AS\s*\(", re.IGNORECASE)


class SqlPolicy(_Policy):
    """A user's SQL file as the sampling policy (see the module's docstring)."""

    kind: Literal["sql"] = "sql"
    file: str | None = Field(
        None, description="The SQL file: relative to the swarm file, or absolute."
    )
    query: str | None = Field(
        None,
        description="The SQL itself (read from `file` when the config loads; what the "
        "resolved swarm carries to other machines).",
    )
    params: dict[str, Param] = Field(
        default_factory=dict, description="Values of the file's own $parameters."
    )
    weighted: bool = Field(
        False, description="`candidates` has a `weight` column: draw with those weights."
    )

    @field_validator("file")
    @classmethod
    def _resolved(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        base = (info.context or {}).get("base")
        path = Path(value).expanduser()
        if not path.is_absolute() and base is not None:
            path = Path(base) / path
        return str(path.resolve())

    @model_validator(mode="after")
    def _fits(self) -> SqlPolicy:
        if self.query is None:
            if self.file is None:
                raise ValueError("give the policy's SQL as `file` (or `query`)")
            try:
                object.__setattr__(self, "query", Path(self.file).read_text())
            except OSError as exc:
                raise ValueError(f"cannot read {self.file}: {exc.strerror or exc}") from exc
        problem = sql_problem(self.own_sql, tuple(sorted(self.params)), self.weighted)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def own_sql(self) -> str:
        """The user's part: the ``WITH`` clause up to ``candidates``, no final semicolon."""
        return (self.query or "").strip().rstrip(";").rstrip()

    @property
    def sql(self) -> str:
        return guarded_sql(self.own_sql, self.weighted)

    def parameters(self, now: datetime) -> dict[str, Any]:
        return {**self.params, "now": now}


def recorded(settings: dict[str, Any]) -> dict[str, Any]:
    """A policy's settings as records keep them (a manifest, MLflow's params, a checkpoint's
    configuration): a user's SQL as the SHA-256 of its text, which fits their size limits
    and still changes with every edit; the text itself is in the resolved swarm."""
    query = settings.get("query")
    if not isinstance(query, str):
        return settings
    digest = hashlib.sha256(query.encode()).hexdigest()
    return {**{k: v for k, v in settings.items() if k != "query"}, "query_sha256": digest}


def guarded_sql(own: str, weighted: bool) -> str:
    """The user's ``candidates`` behind what the sampler guarantees, then the shared caps.
    The user's SQL runs as a subquery of its own: its names (a CTE called ``drawable``, say)
    cannot shadow the relations the guard and the caps read, and it can only be one query."""
    columns = "group_id, weight" if weighted else "group_id"
    order = "-ln(d.u) / c.weight" if weighted else "d.u"
    picked = (
        "SELECT group_id, max(weight) AS weight FROM chosen GROUP BY group_id"
        if weighted
        else "SELECT DISTINCT group_id FROM chosen"
    )
    positive = "\n      AND isfinite(c.weight) AND c.weight > 0" if weighted else ""
    fair = resources.files("ledger.policies").joinpath("fair_draw.sql").read_text()
    if fair.count("FROM candidates c") != 1:  # fair_draw.sql reads `candidates` once
        raise RuntimeError("fair_draw.sql no longer reads `candidates` where expected")
    return f"""WITH chosen AS (
    SELECT {columns} FROM (
{own}
SELECT * FROM candidates
    )
),
receivable AS (
    -- Added by the sampler (ledger/policies/user_sql.py): whatever the user's SQL chose,
    -- never the receiver's own or excluded peers' groups, only tasks it judges, and an
    -- order keyed by its secret, never by a column a publisher sets.
    SELECT d.group_id, d.node_id, d.content_digest, {order} AS draw
    FROM ({picked}) c JOIN drawable d USING (group_id)
    WHERE d.node_id <> $node_id
      AND NOT list_contains($excluded::VARCHAR[], d.node_id)
      AND ($swarm_id IS NULL OR d.swarm_id = $swarm_id)
      AND ($tasks IS NULL OR list_contains($tasks::VARCHAR[], d.task)){positive}
),
{fair.replace("FROM candidates c", "FROM receivable c")}"""


@cache
def sql_problem(own: str, params: tuple[str, ...], weighted: bool) -> str | None:
    """Why the user's SQL cannot be a policy, in one line, or None: its shape and its
    parameters (ledger/policy_check.py then runs it over an empty ledger)."""
    code = sql_code(own).strip()
    if not code.upper().startswith("WITH"):
        return "the policy's SQL must begin with WITH (a WITH clause that ends in `candidates`)"
    last = _LAST_CTE.findall(code)
    if not last or last[-1].lower() != "candidates" or not _ENDS_IN_CANDIDATES.search(code):
        return "the policy's SQL must end with the common table expression `candidates AS (...)`"
    try:
        statements = duckdb.extract_statements(guarded_sql(own, weighted))
    except duckdb.Error as exc:
        return f"the policy's SQL does not parse: {str(exc).strip().splitlines()[0]}"
    if len(statements) != 1:
        return "the policy's SQL must be one query: a WITH clause that ends in `candidates`"
    reserved = sorted(set(params) & SAMPLER_PARAMETERS)
    if reserved:
        return f"params {', '.join(reserved)}: the sampler binds these; name yours otherwise"
    unbound = sorted(named_parameters(code) - SAMPLER_PARAMETERS - set(params))
    if unbound:
        return f"the policy's SQL uses ${', $'.join(unbound)}: give them in params"
    return None
