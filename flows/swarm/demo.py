"""`sapo demo --synthetic`: a synthetic swarm exercises the ledger end to end, no model.

Each node publishes rounds of synthetic rollouts (a fixed per-node skill decides each
completion's reward), samples peers' groups with the paper's policy, and the dashboards'
SQL summarises the ledger. Everything lives under one working directory.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import dashboards
from ledger import Ledger
from ledger.synthetic import synthetic_round


def run_ledger_demo(
    workdir: Path,
    *,
    nodes: int = 4,
    rounds: int = 5,
    external: int = 4,
    groups_per_round: int = 4,
    group_size: int = 8,
    out: Callable[[str], None] = print,
) -> str:
    """Run the demo; return its swarm id (one new swarm per run)."""
    started = datetime.now(UTC)
    swarm_id = "demo-" + started.strftime("%Y%m%dT%H%M%S")
    root = (workdir / "synthetic-ledger").resolve()  # apart from the real demo's ledger
    root.mkdir(parents=True, exist_ok=True)
    node_ids = [f"node-{i}" for i in range(nodes)]
    skills = {n: 0.15 + 0.7 * i / max(1, nodes - 1) for i, n in enumerate(node_ids)}
    out(f"swarm {swarm_id}: {nodes} synthetic nodes x {rounds} rounds, ledger at {root}")
    with Ledger.open(str(root)) as ledger:
        for node_round in range(rounds):
            drawn = 0
            for node in node_ids:
                ledger.publish(
                    synthetic_round(
                        swarm_id,
                        node,
                        node_round,
                        n_groups=groups_per_round,
                        group_size=group_size,
                        skill=skills[node],
                        published_at=datetime.now(UTC),
                        seed=int(started.timestamp()),
                    )
                )
                sample = ledger.sample(node, external, "paper", seed=node_round, swarm_id=swarm_id)
                ledger.write_sample(
                    swarm_id, node, node_round, sample, policy="paper", seed=node_round
                )
                drawn += sample.get_column("group_id").n_unique()
            out(
                f"round {node_round}: {nodes * groups_per_round} groups published, "
                f"{drawn} peer groups sampled"
            )
        for name in ("swarm_totals", "reward_per_node_round", "most_sampled_peers"):
            frame = ledger.query(dashboards.query(name))
            frame = frame.filter(frame.get_column("swarm_id") == swarm_id)
            out(f"\n-- dashboards/sql/{name}.sql (this run)\n{frame}")
    glob = f"{root}/**/*.parquet"
    out(
        "\nOpen the ledger with plain DuckDB (no sapo code needed):\n"
        f'  python -c "import duckdb; duckdb.sql(\\"SELECT node_id, count(*) FROM read_parquet('
        f"'{glob}', hive_partitioning=true, union_by_name=true) GROUP BY ALL\\\").show()\"\n"
        f"or with sapo:  sapo ledger query {root} --dashboard swarm_totals"
    )
    return swarm_id
