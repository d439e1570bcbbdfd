"""What a receiver asks of the ledger when it draws peers' groups: one typed request that
its warm-up wait (`Ledger.draw_group_ids`) and its draw (`Ledger.draw`) both take, so the
two can never ask different things."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledger.policies import AnyPolicy


@dataclass(frozen=True, kw_only=True)
class DrawRequest:
    """A draw of up to ``n_groups`` peer groups for ``node_id`` (see `Ledger.sample`, whose
    keyword arguments these are)."""

    node_id: str
    n_groups: int
    policy: str | dict[str, Any] | AnyPolicy = "paper"
    seed: int = 0
    """Replays a draw without a ``draw_key`` (and is logged with the draw)."""
    swarm_id: str | None = None
    exclude_nodes: Sequence[str] = ()
    """Peers the receiver no longer samples (its reputation of them)."""
    known_nodes: Sequence[str] | None = None
    """Peers it has verified enough of (None: every peer counts as known)."""
    standing: Mapping[str, int] = field(default_factory=dict)
    """Peers not known yet but judged well so far, with the rows judged of each."""
    for_round: int | None = None
    """The receiver's round this draw is for (`fresh` remembers earlier rounds' draws)."""
    tasks: Sequence[str] | None = None
    """The tasks the receiver can judge (None: any)."""
    draw_key: str | None = None
    """The receiver's secret key for this draw (ledger/draws.py; None: public, from seed)."""
    rows_per_group: int | None = None
    """The receiver's group size G: of each group at most G rows, chosen by the key."""

    def __post_init__(self) -> None:
        # Whatever sequences a caller has: held as tuples and a dict, so a request cannot
        # change after it is made (nor a list the caller keeps change it).
        def fixed(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        fixed("exclude_nodes", tuple(self.exclude_nodes))
        if self.known_nodes is not None:
            fixed("known_nodes", tuple(self.known_nodes))
        if self.tasks is not None:
            fixed("tasks", tuple(self.tasks))
        fixed("standing", dict(self.standing or {}))
