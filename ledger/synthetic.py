"""Synthetic rollouts with the shape of a real swarm's, for demos, tests and benchmarks.

No model is involved: each node has a skill p, each completion is correct with probability
p, so groups come out all-wrong, all-right or mixed in realistic proportions.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from ledger.schema import COLUMN_NAMES, SCHEMA_VERSION, arrow_schema

# The paper's nine tasks, as sapo_core.config.PAPER_SPECIALTIES (the ledger may not import
# sapo_core: a person analysing rollouts needs no training stack).
SPECIALTIES = (
    "base_conversion",
    "basic_arithmetic",
    "arc_1d",
    "bf",
    "propositional_logic",
    "fraction_simplification",
    "decimal_arithmetic",
    "calendar_arithmetic",
    "binary_matrix",
)


def group_id_for(swarm_id: str, node_id: str, node_round: int, slot: int) -> str:
    return f"{swarm_id}.{node_id}.r{node_round}.g{slot}"


_NO_CLAIM = {"token_ids": None, "token_logprobs": None, "tokenizer": None}


def _claim(rng: random.Random, tokens: int) -> dict[str, object]:
    return {
        "token_ids": [rng.randrange(150_000) for _ in range(tokens)],
        "token_logprobs": [-rng.expovariate(2.0) for _ in range(tokens)],
        "tokenizer": "0123456789abcdef",
    }


def synthetic_round(
    swarm_id: str,
    node_id: str,
    node_round: int,
    *,
    n_groups: int = 8,
    group_size: int = 8,
    skill: float = 0.3,
    completion_chars: int = 200,
    published_at: datetime | None = None,
    seed: int = 0,
    claims: bool = True,
) -> pa.Table:
    """One node's published round: ``n_groups`` questions x ``group_size`` completions;
    with ``claims``, each row carries a generator's claim of its ``completion_tokens``
    tokens (random ids and log-probs: the bytes of a real one)."""
    rng = random.Random(f"{seed}/{swarm_id}/{node_id}/{node_round}")
    stamp = published_at or datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=node_round)
    cols: dict[str, list] = {name: [] for name in COLUMN_NAMES}
    for slot in range(n_groups):
        task = rng.choice(SPECIALTIES)
        index = rng.randrange(1_000_000)
        a, b = rng.randrange(100), rng.randrange(100)
        gid = group_id_for(swarm_id, node_id, node_round, slot)
        for k in range(group_size):
            right = rng.random() < skill
            guess = a + b if right else a + b + rng.choice((-2, -1, 1, 2))
            text = f"Let me add {a} and {b} step by step. " * (completion_chars // 36 + 1)
            values = {
                "rollout_id": f"{gid}.c{k}",
                "group_id": gid,
                "swarm_id": swarm_id,
                "node_id": node_id,
                "model_id": "synthetic/skill-" + format(skill, ".2f"),
                "node_round": node_round,
                "policy_version": node_round,
                "task": task,
                "task_config": json.dumps({"size": 1000, "seed": 7}),
                "task_seed": 7,
                "task_index": index,
                "question": f"[{task}] What is {a} + {b}?",
                "answer": str(a + b),
                "metadata": json.dumps({"a": a, "b": b}),
                "completion": text[:completion_chars] + f"<answer>{guess}</answer>",
                "completion_tokens": completion_chars // 4,
                "reward": 1.0 if right else 0.0,
                "published_at": stamp,
                "schema_version": SCHEMA_VERSION,
                **(_claim(rng, completion_chars // 4) if claims else _NO_CLAIM),
            }
            for name in COLUMN_NAMES:
                cols[name].append(values[name])
    return pa.table(cols, schema=arrow_schema())
