"""Where a node's round goes: generation, update, and everything else.

One node with the bundled model runs rounds through the real Prefect flow (ephemeral
server), with the ledger on local disk and MLflow in SQLite, in a temporary working
directory. Prints seconds per step and the share of the round that is neither generation
nor update (target: <= 5%).

    python benchmarks/round_overhead.py --rounds 8 --checkpoint-every 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.env import apply_offline_defaults

# seconds_orchestration is the round's wall time minus its steps, up to building the
# metrics (Prefect's bookkeeping); logging them to MLflow, after, is not in any round.
# checkpoint_wait: the update waiting for the previous round's checkpoint, which is written
# in the background while the round generates (a run's last checkpoint is written at once).
STEPS = (
    "generate", "update", "publish", "sample", "reward", "checkpoint", "checkpoint_wait",
    "orchestration",
)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--checkpoint-every", type=int, default=1)
    p.add_argument("--external", type=int, default=2, help="J (peers are absent: a silo)")
    args = p.parse_args()
    apply_offline_defaults()
    import os

    from flows.config import default_swarm_text

    work = Path(tempfile.mkdtemp(prefix="sapo-overhead-"))
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect"))
    (work / "prefect").mkdir()
    data = yaml.safe_load(default_swarm_text())
    data.update(
        workdir=str(work), rounds=args.rounds, checkpoint_every=args.checkpoint_every,
        nodes=[{"node_id": "node-0", "seed": 0}],
    )  # fmt: skip
    data["defaults"]["external_groups"] = args.external
    path = work / "swarm.yaml"
    path.write_text(yaml.safe_dump(data))

    from flows.node.round import node_flow

    result = node_flow("node-0", swarm_file=str(path))
    rows = result["metrics"]
    print(f"\n{len(rows)} rounds, workdir {work}")
    print("round " + " ".join(f"{s[:13]:>13}" for s in STEPS) + "   total  other%")
    shares = []
    for r, m in zip(result["rounds"], rows, strict=True):
        secs = [m.get(f"seconds_{s}", 0.0) for s in STEPS]
        total = sum(secs)
        other = total - secs[0] - secs[1]
        shares.append(other / total)
        cells = " ".join(f"{x:13.3f}" for x in secs)
        print(f"{r:5d} {cells} {total:7.2f} {100 * other / total:6.2f}")
    means = {s: statistics.fmean(m.get(f"seconds_{s}", 0.0) for m in rows) for s in STEPS}
    total = sum(means.values())
    print("\nmean seconds per round and share of the round:")
    for s in STEPS:
        print(f"  {s:13s} {means[s]:8.3f} s  {100 * means[s] / total:6.2f}%")
    print(f"  all but generation and update: {100 * statistics.fmean(shares):.2f}% (target <= 5%)")
    if len(shares) > 1:  # the last round's checkpoint ends the run: it cannot overlap
        steady = 100 * statistics.fmean(shares[:-1])
        print(
            f"  the same without the last round (its checkpoint is written at once): {steady:.2f}%"
        )


if __name__ == "__main__":
    main()
