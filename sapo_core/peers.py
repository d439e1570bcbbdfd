"""How a node judges the peers' groups it drew: cut to its own group size, verified by its
own verifier within its bounds, and what that showed about each peer.

Whatever a peer publishes, a drawn group weighs in the receiver's verification, evidence and
update what one of the receiver's own groups does: at most G rows, chosen by the receiver's
seed. With the per-peer caps of the draw (which count groups), that bounds each peer's rows,
tokens (a row longer than the node's ``max_new_tokens`` in its tokens is skipped) and share of
the loss.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sapo_core.config import NodeConfig
from sapo_core.reputation import PeerEvidence, evidence
from sapo_core.rewards import ConfigBounds, ScoredGroup, score_groups
from sapo_core.rollouts import Group


def within_group_size(group: Group, size: int, seed: str) -> Group:
    """A peer's group as at most ``size`` rows, chosen by the receiver's ``seed``.

    Rows are drawn from the group sorted by id, so the peer's order of its rows has no say
    in which are kept; a group within ``size`` is returned as it is. A node's draw from the
    ledger already comes cut to its size by a key only it holds (ledger/policies/
    drawable.sql), so this cut acts on groups a caller hands in without a ledger, whose
    seed is the node's public one.
    """
    if len(group.rollouts) <= size:
        return group
    rows = sorted(group.rollouts, key=lambda r: r.rollout_id)
    kept = sorted(random.Random(f"{seed}/{group.group_id}").sample(range(len(rows)), size))
    return Group(group.group_id, group.source, tuple(rows[i] for i in kept))


def peer_bounds(config: NodeConfig) -> ConfigBounds:
    """Which peers' task configs this node builds: of the tasks it trains or is evaluated on."""
    return ConfigBounds.for_node(
        config.tasks, config.evaluation.tasks, config.reward.max_config_number
    )


def judged_tasks(config: NodeConfig) -> list[str]:
    """The tasks whose peer groups this node's verifier judges; its draw asks for no others
    (a group it cannot judge would take a slot of J and teach nothing)."""
    return sorted(peer_bounds(config).own)


@dataclass(frozen=True)
class JudgedPeers:
    """The round's peer groups as this node's verifier saw them."""

    considered: tuple[Group, ...]
    """The first J groups drawn, each cut to the node's group size."""
    scored: tuple[ScoredGroup, ...]
    problems: tuple[str, ...]
    evidence: Mapping[str, PeerEvidence]


def judge_peers(groups: Sequence[Group], config: NodeConfig, round_: int) -> JudgedPeers:
    """Cut the first J of ``groups`` to G rows (the round's seed choosing), score them with
    this node's verifier within its bounds and its round's budget; per peer, the evidence."""
    # Whatever a caller labelled them, peers' groups are external here.
    size = config.generation.completions_per_question
    seed = f"{config.seed}/{round_}/external"
    considered = tuple(
        within_group_size(Group(g.group_id, "external", g.rollouts), size, seed)
        for g in groups[: config.external_groups]
    )
    scored, problems = score_groups(considered, config.reward, peer_bounds(config))
    return JudgedPeers(
        considered, tuple(scored), tuple(problems), evidence(considered, scored, problems)
    )
