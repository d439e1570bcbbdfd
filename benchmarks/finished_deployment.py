"""What a deployed swarm does after it finishes (issue 61: its schedules ran forever, every
interval starting a process per node only to print "has finished").

A Prefect server on 127.0.0.1 (SQLite, under a scratch folder), a 2-node x 2-round swarm of
the test suite's tiny model registered on a process work pool (`sapo deploy --work-pool`,
one round a run) and one worker (`prefect worker start`). Once both nodes have finished,
it watches for `--watch` seconds: flow runs the server creates for the swarm, runs in a
Scheduled state, and processes the worker starts (its children, polled every second).
Then `sapo deployments` as a user sees it.

    python benchmarks/finished_deployment.py                       # 30 s interval, 600 s watch
    python benchmarks/finished_deployment.py --interval 20 --watch 120

Figures: docs/running.md ("How far it is, and how it ends").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flows.services.prefect_server import local_prefect_server  # noqa: E402
from tests.conftest import stop_process_group  # noqa: E402
from tests.e2e.test_swarm import swarm_file  # noqa: E402
from tests.tiny_models import build_tiny_model  # noqa: E402


def children(pid: int) -> set[int]:
    """Every descendant of ``pid`` now."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
    parent = {}
    for line in out.stdout.split("\n"):
        if line.strip():
            child, up = line.split()
            parent[int(child)] = int(up)
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {c for c, p in parent.items() if p in frontier} - found
        found |= frontier
    return found


def swarm_runs(api: str) -> list[dict]:
    import httpx

    runs = httpx.post(f"{api}/flow_runs/filter", json={}, timeout=30).json()
    return [r for r in runs if r.get("deployment_id")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--watch", type=float, default=600.0)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sapo-finished-"))
    model = build_tiny_model(scratch / "model")
    path = swarm_file(scratch, model, node_count=2, peer_wait_s=0)
    with local_prefect_server(scratch / "prefect") as api:
        env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_LOGGING_LEVEL": "WARNING"}
        sapo = [sys.executable, "-m", "flows.cli"]
        subprocess.run(
            [*sapo, "deploy", "-c", str(path), "--work-pool", "bench",
             "--interval", str(args.interval)],
            env=env, check=True, timeout=300,
        )  # fmt: skip
        began = time.monotonic()
        with open(scratch / "worker.log", "w") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", "bench"],
                env={**env, "SAPO_WORKDIR": str(scratch / "work")},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=scratch,
            )  # fmt: skip
        try:
            nodes = scratch / "work" / "nodes"
            done = [nodes / f"node-{i}" / "finished.json" for i in range(2)]
            while not all(p.is_file() for p in done):
                if time.monotonic() - began > 1800:
                    raise SystemExit("the swarm did not finish in 30 min")
                time.sleep(2)
            finished_s = time.monotonic() - began
            time.sleep(15)  # the last run's process exits
            before = swarm_runs(api)
            seen: set[int] = set()
            watch_end = time.monotonic() + args.watch
            while time.monotonic() < watch_end:
                seen |= children(worker.pid)
                time.sleep(1)
            after = swarm_runs(api)
            shown = subprocess.run(
                [*sapo, "deployments", "-c", str(path)], env=env, capture_output=True,
                text=True, timeout=300,
            )  # fmt: skip
        finally:
            stop_process_group(worker)
    scheduled = [r for r in after if r["state_type"] == "SCHEDULED"]
    states: dict[str, int] = {}
    for run in after:
        states[run["state_name"]] = states.get(run["state_name"], 0) + 1
    watched = f"{args.watch:.0f} s"
    print(f"interval {args.interval:.0f} s; both nodes finished {finished_s:.0f} s in")
    print(f"flow runs of the swarm at the finish: {len(before)}; {watched} later: {len(after)}")
    print(f"runs in a Scheduled state at the end: {len(scheduled)}; by state: {states}")
    print(f"processes the worker started in those {watched}: {len(seen)}")
    print(shown.stdout or shown.stderr)


if __name__ == "__main__":
    main()
