"""A node's round against the delay of its link to the bucket (issue 60).

Two hosts of a network built from Linux namespaces (tests/netns.py, as root): the bucket
(moto's S3 server) on one, a swarm of two nodes (`sapo swarm`, the test suite's tiny model)
on the other, reaching the bucket only through a proxy that holds every chunk it forwards
for a delay with +-25% jitter (`tests/netns_proxy.py`: this kernel has no netem). One fresh
swarm and ledger per delay; each node's per-step seconds come from its MLflow run. Rounds
after the first are reported (the first draws nothing: no peer has published yet).

    sudo python benchmarks/slow_link.py                     # delays 0, 100, 250, 500 ms
    sudo python benchmarks/slow_link.py --delays 0 0.25 --rounds 4
    sudo python benchmarks/slow_link.py --ask-first    # writes check for the key first
                                                       # (conditional_writes=false)

Figures and their reading: benchmarks/README.md, `slow_link.py`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import netns  # noqa: E402
from tests.e2e.test_swarm import swarm_file  # noqa: E402

S3_PORT = 5000
STEPS = ("generate", "publish", "sample", "reward", "update")


def step_seconds(tracking_uri: str) -> dict[int, list[dict[str, float]]]:
    """Round -> each node's seconds per step and in all, from the nodes' MLflow runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name("slow-link")
    assert exp is not None
    found: dict[int, list[dict[str, float]]] = {}
    for run in client.search_runs([exp.experiment_id]):
        if run.data.tags.get("sapo.node_id") is None:
            continue
        per_round: dict[int, dict[str, float]] = {}
        for key in run.data.metrics:
            if key.startswith("seconds_"):
                for m in client.get_metric_history(run.info.run_id, key):
                    per_round.setdefault(m.step, {})[key.removeprefix("seconds_")] = m.value
        for step, seconds in per_round.items():
            seconds["round"] = sum(seconds.values())
            found.setdefault(step, []).append(seconds)
    return found


def measure(
    net: netns.Network,
    folder: Path,
    model: Path,
    delay: float,
    port: int,
    rounds: int,
    ask_first: bool = False,
) -> tuple[float, dict[str, float]]:
    """The swarm's wall time and the median seconds per step of rounds after the first."""
    services, worker = net["services"], net["worker"]
    proxy = services.start(
        [sys.executable, str(ROOT / "tests" / "netns_proxy.py"), services.address, str(port),
         services.address, str(S3_PORT), str(delay), str(delay / 4)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proxy.stdout is not None and proxy.stdout.readline().strip() == "listening"
    endpoint = f"http://{services.address}:{port}"
    options = {"key": "testing", "secret": "testing", "endpoint_url": endpoint}
    if ask_first:
        options["conditional_writes"] = "false"
    folder.mkdir()
    # The e2e tests' swarm (2 + 2 groups of 3 completions, tiny model), two nodes.
    ledger = {"url": f"s3://bench/ledger-{port}", "storage_options": options}
    swarm = swarm_file(
        folder, model, ledger, swarm_id="slow-link", node_count=2, rounds=rounds, peer_wait_s=0
    )
    began = time.monotonic()
    done = subprocess.run(
        worker.command([sys.executable, "-m", "flows.cli", "swarm", "-c", str(swarm)]),
        capture_output=True, text=True, timeout=1800, cwd=ROOT,
    )  # fmt: skip
    wall = time.monotonic() - began
    proxy.terminate()
    proxy.wait(timeout=30)
    if done.returncode != 0:
        tail = done.stdout[-3000:] + done.stderr[-3000:]
        raise SystemExit(f"the swarm at {delay} s failed:\n{tail}")
    found = step_seconds(f"sqlite:///{folder / 'work' / 'mlflow.db'}")
    later = [s for step, nodes in found.items() if step > 0 for s in nodes]
    return wall, {k: statistics.median(s.get(k, 0.0) for s in later) for k in (*STEPS, "round")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 0.1, 0.25, 0.5])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--ask-first", action="store_true", help="conditional_writes=false")
    args = parser.parse_args()
    refused = netns.refusal()
    if refused:
        raise SystemExit(refused)
    from tests.tiny_models import build_tiny_model

    with (
        tempfile.TemporaryDirectory(prefix="slow-link-") as tmp,
        netns.Network(["services", "worker"]) as net,
    ):
        model = build_tiny_model(Path(tmp) / "model")
        services = net["services"]
        services.start(
            [sys.executable, "-m", "moto.server", "-H", services.address, "-p", str(S3_PORT)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        create = f"""
import time, boto3
for _ in range(120):
    try:
        boto3.client("s3", endpoint_url="http://{services.address}:{S3_PORT}",
                     aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket="bench")
        break
    except Exception:
        time.sleep(0.5)
"""
        net["worker"].python(create, timeout=120)
        writes = "asking first" if args.ask_first else "conditional"
        print(f"2 nodes x {args.rounds} rounds (tiny model), {writes} writes; medians of rounds")
        print("1.. over nodes, s")
        heads = " ".join(f"{s:>8}" for s in STEPS)
        print(f"{'delay ms':>8} {'round':>7} {heads}  swarm wall")
        for i, delay in enumerate(args.delays):
            port = S3_PORT + 1 + i
            wall, med = measure(
                net, Path(tmp) / f"d{i}", model, delay, port, args.rounds, args.ask_first
            )
            cells = " ".join(f"{med[s]:8.2f}" for s in STEPS)
            print(f"{delay * 1000:8.0f} {med['round']:7.2f} {cells}  {wall:8.1f}", flush=True)


if __name__ == "__main__":
    main()
