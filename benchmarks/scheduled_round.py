"""What a round costs when a work pool's worker runs it on a schedule, against a round of
`sapo swarm`, on the package stack (`sapo infra up`: PostgreSQL, moto's S3, Prefect and
MLflow servers), and how long that stack takes to start.

One node with the embedded CPU swarm's settings (bundled model) runs R rounds twice, on the
same services:
- `sapo swarm`: one process runs every round (its start-up and model load paid once);
- a deployment on a process work pool with one worker (`prefect worker start`), one round
  per scheduled run (each run is a new process that loads the node from its checkpoint).

Times come from Prefect's API: each `sapo-round` flow run's duration is the round itself;
for a scheduled run, "due to start" is the run's expected start to its `sapo-node` run
entering Running (the worker's poll, a new process, imports), "set-up" is from there to
the round (swarm, ledger, model and checkpoint, MLflow run), "finish" is after it.

    python benchmarks/scheduled_round.py --rounds 3 --interval 60
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.env import apply_offline_defaults


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=float, default=60.0, help="schedule, seconds")
    p.add_argument("--keep", action="store_true", help="leave the work folder")
    args = p.parse_args()
    apply_offline_defaults()
    from flows.services import stack as stacks

    work = Path(tempfile.mkdtemp(prefix="sapo-scheduled-"))
    os.environ["PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS"] = "5"
    begun = time.perf_counter()
    stack = stacks.up(work / "stack", ports=dict.fromkeys(stacks.DEFAULT_PORTS, 0))
    print(f"stack up: {time.perf_counter() - begun:.1f} s (PostgreSQL, S3, Prefect, MLflow)")
    env = {**os.environ, **stack.client_env(), "PREFECT_LOGGING_LEVEL": "WARNING"}
    worker = None
    try:
        swarm = write_swarm(work, stack.ledger_url, args.rounds)
        begun = time.perf_counter()
        # Swarms of their own, so that neither node samples the other's groups.
        alone = ["--set", "swarm_id=bench-swarm", "--set", "nodes.0.node_id=in-swarm"]
        sapo(["swarm", "-c", str(swarm), *alone], env)
        swarm_wall = time.perf_counter() - begun
        pins = ["--pin", "scheduled=machine"]
        alone = ["--set", "swarm_id=bench-scheduled", "--set", "nodes.0.node_id=scheduled"]
        sapo(["deploy", "-c", str(swarm), *alone, "--work-pool", "bench",
              "--interval", str(args.interval), *pins], env)  # fmt: skip
        machine = work / "machine"
        machine.mkdir()
        with open(machine / "worker.log", "wb") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", "bench",
                 "--work-queue", "machine"],
                cwd=machine, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**env, "SAPO_WORKDIR": str(machine / "work"),
                     "PREFECT_HOME": str(machine / "prefect")},
            )  # fmt: skip
        api = stack.prefect_api_url
        deadline = time.monotonic() + args.rounds * args.interval + 900
        while not all_done(api, args.rounds):
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit(f"the scheduled rounds did not run (see {machine}/worker.log)")
            time.sleep(5)
        report(api, swarm_wall, args.rounds)
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        stacks.down(stack.home)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def write_swarm(work: Path, ledger_url: str, rounds: int) -> Path:
    from flows.config import default_swarm_text

    data = yaml.safe_load(default_swarm_text())
    data.pop("node_count", None)
    data.update(
        swarm_id="scheduled-bench", workdir=str(work / "deployer"), rounds=rounds,
        nodes=[{"node_id": "node-0", "seed": 0}], ledger={"url": ledger_url},
    )  # fmt: skip
    path = work / "swarm.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def sapo(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "flows.cli", *args], env=env, text=True,
                          capture_output=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"sapo {args[0]} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")


def post(api: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    import httpx

    answer = httpx.post(f"{api}/{path}", json=body, timeout=30)
    answer.raise_for_status()
    result: list[dict[str, Any]] = answer.json()
    return result


def rounds_of(api: str, node: str) -> list[dict[str, Any]]:
    """The node's completed `sapo-round` flow runs, in round order."""
    runs = post(api, "flow_runs/filter", {
        "flows": {"name": {"any_": ["sapo-round"]}},
        "flow_runs": {"name": {"like_": f"{node}-round-"},
                      "state": {"type": {"any_": ["COMPLETED"]}}},
    })  # fmt: skip
    return sorted(runs, key=lambda r: int(r["name"].rsplit("-", 1)[1]))


def node_run_of(api: str, round_run: dict[str, Any]) -> dict[str, Any]:
    """The `sapo-node` flow run a round ran in."""
    import httpx

    task = httpx.get(f"{api}/task_runs/{round_run['parent_task_run_id']}", timeout=30).json()
    node: dict[str, Any] = httpx.get(f"{api}/flow_runs/{task['flow_run_id']}", timeout=30).json()
    return node


def all_done(api: str, rounds: int) -> bool:
    """Every scheduled round ran, and the node runs that held them have ended."""
    done = rounds_of(api, "scheduled")
    return len(done) >= rounds and all(node_run_of(api, r)["end_time"] for r in done)


def at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def report(api: str, swarm_wall: float, rounds: int) -> None:
    in_swarm = [r["total_run_time"] for r in rounds_of(api, "in-swarm")]
    outside = swarm_wall - sum(in_swarm)
    print(f"\n`sapo swarm`, {rounds} rounds: {swarm_wall:.1f} s in all; rounds "
          f"{', '.join(f'{s:.1f}' for s in in_swarm)} s; {outside:.1f} s outside rounds "
          f"(start-up, model load, final model), {outside / rounds:.1f} s per round")  # fmt: skip
    print("\n| scheduled run | due to start s | set-up s | round s | finish s | total s | "
          "overhead s |\n|---:|---:|---:|---:|---:|---:|---:|")  # fmt: skip
    overheads = []
    for r in rounds_of(api, "scheduled"):
        node = node_run_of(api, r)
        due, started, ended = (at(node[k]) for k in ("expected_start_time", "start_time",
                                                       "end_time"))  # fmt: skip
        round_start, round_end = at(r["start_time"]), at(r["end_time"])
        total = ended - due
        overheads.append(total - r["total_run_time"])
        print(f"| {r['name']} | {started - due:.1f} | {round_start - started:.1f} | "
              f"{r['total_run_time']:.1f} | {ended - round_end:.1f} | {total:.1f} | "
              f"{overheads[-1]:.1f} |")  # fmt: skip
    print(f"\nmedian overhead of a scheduled round: {statistics.median(overheads):.1f} s "
          f"(`sapo swarm`: {outside / rounds:.1f} s per round over {rounds} rounds)")  # fmt: skip


if __name__ == "__main__":
    main()
