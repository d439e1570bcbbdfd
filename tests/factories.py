"""Hand-made rollouts with known answers, for tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def open_ledger(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    signer: Any = None,
    index_path: Any = None,
    threads: int | None = None,
    **settings: Any,
) -> Any:
    """A Ledger at ``url`` with ``settings`` (any LedgerConfig field) over the defaults."""
    from ledger import Ledger, LedgerConfig

    config = LedgerConfig.model_validate(
        {"url": url, "storage_options": dict(storage_options or {}), **settings}
    )
    return Ledger(config, signer=signer, index_path=index_path, threads=threads)


def group_rows(
    node_id: str,
    node_round: int,
    slot: int,
    rewards: list[float | None],
    *,
    swarm_id: str = "sw",
    published_at: datetime | None = None,
    **overrides: Any,
) -> list[dict[str, Any]]:
    """One group: one row per reward, every public column filled."""
    gid = f"{swarm_id}.{node_id}.r{node_round}.g{slot}"
    rows = []
    for k, reward in enumerate(rewards):
        row = {
            "rollout_id": f"{gid}.c{k}",
            "group_id": gid,
            "swarm_id": swarm_id,
            "node_id": node_id,
            "model_id": "tiny",
            "node_round": node_round,
            "policy_version": node_round,
            "task": "basic_arithmetic",
            "task_config": '{"size": 100}',
            "task_seed": 1,
            "task_index": node_round * 100 + slot,  # each round draws new questions
            "question": f"q{slot} of {node_id}",
            "answer": "4",
            "metadata": "{}",
            "completion": f"<answer>{k}</answer>",
            "completion_tokens": 5,
            "reward": reward,
            "published_at": published_at or T0 + timedelta(minutes=node_round),
        }
        row.update(overrides)
        rows.append(row)
    return rows


def round_rows(node_id: str, node_round: int, groups: list[list[float | None]], **kw: Any):
    rows: list[dict[str, Any]] = []
    for slot, rewards in enumerate(groups):
        rows += group_rows(node_id, node_round, slot, rewards, **kw)
    return rows


def copied(rows: list[dict[str, Any]], node_id: str, node_round: int) -> list[dict[str, Any]]:
    """``rows`` republished by ``node_id`` as its round ``node_round``: the same questions
    and completions under its own ids, in reverse order, claiming other rewards, stamped
    an hour later."""
    out = []
    for row in reversed(rows):
        gid = f"{row['swarm_id']}.{node_id}.r{node_round}.{row['group_id'].rsplit('.', 1)[1]}"
        out.append(
            row
            | {
                "group_id": gid,
                "rollout_id": f"{gid}.{row['rollout_id'].rsplit('.', 1)[1]}",
                "node_id": node_id,
                "node_round": node_round,
                "policy_version": node_round,
                "reward": 1.0 - row["reward"] if row["reward"] is not None else None,
                "published_at": row["published_at"] + timedelta(hours=1),
            }
        )
    return out


def rollout_of(
    question: Any, completion: str, node: str = "peer", j: int = 0, claimed: float | None = 1.0
) -> Any:
    """One completion of ``question`` by ``node`` as a sapo_core Rollout, in group
    ``sw.<node>.r0.g<task_index>``, claiming reward ``claimed``."""
    from sapo_core.rollouts import Rollout

    group_id = f"sw.{node}.r0.g{question.task_index}"
    return Rollout(
        rollout_id=f"{group_id}.c{j}",
        group_id=group_id,
        node_id=node,
        model_id="m",
        node_round=0,
        policy_version=0,
        question=question,
        completion=completion,
        completion_tokens=3,
        reward=claimed,
    )


def signed_swarm(site: Any, nodes: tuple[str, ...] = ("a", "b")) -> dict[str, Any]:
    """Swarm "sw" at ``site``, requiring signatures, with a registered key per node; the
    keys by node."""
    from ledger import NodeKey

    keys = {node: NodeKey.generate("sw", node) for node in nodes}
    setup = site.open()
    setup.declare_swarm("sw", "required")
    for key in keys.values():
        setup.register_key(key)
    return keys
