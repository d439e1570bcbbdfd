"""What every sampling policy shares: ``drawable`` (the groups a receiver could train on,
in an order keyed by its secret, drawable.sql), the caps of ``fair_draw.sql``, and the
config a policy is (`_Policy`). The policies themselves: ledger/policies/__init__.py, and a
user's own SQL: ledger/policies/user_sql.py."""

from __future__ import annotations

import math
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Annotated, Any, ClassVar

import duckdb
from pydantic import BaseModel, ConfigDict, Field

from ledger.draws import keyed_uniform_sql
from ledger.sqltext import parameters_for, sql_code

MaxAge = Annotated[
    float | None,
    Field(
        gt=0,
        description="Only groups published this many seconds before now (by the earlier of "
        "the publisher's stamp and the reader's first sight of the group).",
    ),
]
"""A policy's recency window (NULL in SQL: no window)."""


@cache
def drawable_sql() -> str:
    """The SQL that builds ``drawable`` (drawable.sql), the one relation every policy draws
    from: its keyed numbers filled in (ledger/draws.py), the only randomness a draw has.
    Its statements: the table; the completions the receiver must not get, whether any group
    holds one (or more than G rows), the recut of those groups and the removal of those
    left too small."""
    text = resources.files(__package__).joinpath("drawable.sql").read_text()
    return text.format(
        row_u=keyed_uniform_sql("$draw_key", "concat('row/', content_digest, '/', k, '/', copy)"),
        group_u=keyed_uniform_sql("$draw_key", "concat('group/', g.content_digest)"),
        peer_u=keyed_uniform_sql("$draw_key", "concat('peer/', node_id)"),
    )


def drawable_statements() -> list[str]:
    """``drawable_sql``'s statements, one by one."""
    return [part.strip() for part in drawable_sql().split(";\n\n") if part.strip()]


def build_drawable(con: duckdb.DuckDBPyConnection, params: dict[str, Any]) -> None:
    """Build ``drawable`` on ``con`` for one draw (drawable.sql's parameters in ``params``,
    others ignored): the recut only where its check says it can change anything (most draws
    of honest swarms: nothing to recut; a third of a small draw's time)."""

    for statement in drawable_statements():
        found = con.execute(statement, parameters_for(statement, params))
        if sql_code(statement).lstrip().upper().startswith("SELECT"):  # the recut's check
            answer = found.fetchone()
            if not (answer and answer[0]):
                return


class _Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    remembers: ClassVar[bool] = False
    """Whether the policy takes a completion at most once: ``drawable`` then leaves out
    every completion the receiver's sample log says it drew in an earlier round."""

    max_per_peer: int | None = Field(
        None, ge=1, description="Most groups from any one peer, always (a hard cap)."
    )
    max_peer_share: float | None = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Share of the groups asked for (rounded up, at least one) that one peer "
        "supplies while other peers still have candidates; only when they run out does it "
        "supply more. On by default: peers are untrusted, and without it one peer that "
        "publishes many small groups takes most of every receiver's J. 1.0 (or null) turns "
        "it off: the paper's plain uniform draw.",
    )

    max_unknown_share: float | None = Field(
        0.25,
        gt=0.0,
        le=1.0,
        description="Share of the groups asked for (rounded up, at least one) that peers the "
        "receiver does not know yet supply, all of them together, while known peers still "
        "have candidates (known: verified enough of, see Ledger.sample's known_nodes). "
        "Bounds a flood of new ids (Sybils); 1.0 (or null) turns it off.",
    )

    def caps(self, n_groups: int) -> dict[str, int]:
        """The SQL caps when ``n_groups`` are asked for: ``max_per_peer`` (hard, per peer),
        ``peer_share_cap`` (soft, per peer) and ``unknown_cap`` (soft, all unknown peers)."""

        def share(value: float | None, most: int) -> int:
            return most if value is None else min(most, max(1, math.ceil(value * n_groups)))

        hard = n_groups if self.max_per_peer is None else min(self.max_per_peer, n_groups)
        return {
            "max_per_peer": hard,
            "peer_share_cap": share(self.max_peer_share, hard),
            "unknown_cap": share(self.max_unknown_share, n_groups),
        }

    @property
    def sql(self) -> str:
        """The SQL text of this policy: its file under ``ledger/policies`` (the candidates
        and their draw order), then ``fair_draw.sql`` (the caps every policy shares)."""
        kind: str = getattr(self, "kind")  # noqa: B009 - every subclass declares it
        files = resources.files(__package__)
        own = files.joinpath(f"{kind}.sql").read_text().rstrip()
        return f"{own},\n{files.joinpath('fair_draw.sql').read_text()}"

    @property
    def full_sql(self) -> str:
        """What a draw runs, as a person can paste it into DuckDB over a ledger's views:
        ``drawable`` built, then the policy's query."""
        return f"{drawable_sql().rstrip()};\n\n{self.sql}"

    def parameters(self, now: datetime) -> dict[str, Any]:
        """Policy-specific SQL parameters (the common ones are added by the sampler)."""
        return {}
