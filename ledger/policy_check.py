"""A user's SQL policy run once over an empty ledger before a swarm uses it: DuckDB binds
every name, so a misspelt column or table is one line when the swarm loads, not a failed
draw in a node's first round (ledger/policies/user_sql.py checks its shape)."""

from __future__ import annotations

import tempfile
from functools import cache

import duckdb

from ledger.ledger import Ledger
from ledger.policies.user_sql import SqlPolicy


def run_problem(policy: SqlPolicy) -> str | None:
    """Why ``policy``'s SQL does not run, in one line, or None (once per text)."""
    return _run_problem(policy.own_sql, tuple(sorted(policy.params)), policy.weighted)


@cache
def _run_problem(own: str, params: tuple[str, ...], weighted: bool) -> str | None:
    values = dict.fromkeys(params, None)
    policy = SqlPolicy.model_construct(kind="sql", query=own, params=values, weighted=weighted)
    with (
        tempfile.TemporaryDirectory(prefix="sapo-policy-check-") as empty,
        Ledger.open(empty) as ledger,
    ):
        try:
            ledger.sample_group_ids("node-0", 1, policy=policy, seed=0)
        except duckdb.Error as exc:
            return f"the policy's SQL does not run: {str(exc).strip().splitlines()[0]}"
    return None
