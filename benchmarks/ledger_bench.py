"""Ledger benchmark: publish and sampling latency on synthetic ledgers, local disk and S3.

Synthetic swarms (no model) of 10k, 100k and 1M completions from up to 1,000 nodes; each node
round is one file of 8 groups x 8 completions, as a node of the paper's setup publishes it.
For each size and backend it measures, before and after compaction:

- publish: latency of ``Ledger.publish`` of one more round (64 rows) into the full ledger;
- index: a new reader's first refresh (lists and validates every file once);
- sample: ``Ledger.sample`` of J=8 groups for a random receiver, p50/p95, for the paper's
  policy and the reward-filtered one, with a fresh listing on every call (``staleness 0``)
  and with listings reused for up to 10 s (``staleness 10s``).

The S3 backend is moto's server in its own process on 127.0.0.1, spoken to over HTTP.

    python benchmarks/ledger_bench.py                 # all sizes, both backends
    python benchmarks/ledger_bench.py --sizes 10000 --backends local
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.env import apply_offline_defaults
from ledger import Ledger, LedgerConfig, RewardFilteredPolicy
from ledger.keys import compacted_key, partition_prefix, round_key
from ledger.synthetic import synthetic_round

GROUPS, GROUP_SIZE, J = 8, 8, 8
CLAIMS = True
"""Rows carry a generator's claim (schema 2: token ids and log-probs, ~8 bytes a token);
``--no-claims`` writes them as schema 1 did, to measure what the claim costs."""
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def shape(rows: int) -> tuple[int, int]:
    """(nodes, rounds) for a ledger of about ``rows`` completions, at most 1,000 nodes."""
    per_round = GROUPS * GROUP_SIZE
    nodes = min(1000, max(2, rows // (per_round * 8)))
    return nodes, max(1, round(rows / (per_round * nodes)))


def round_table(node: str, r: int) -> pa.Table:
    return synthetic_round(
        "bench",
        node,
        r,
        n_groups=GROUPS,
        group_size=GROUP_SIZE,
        skill=0.1 + 0.8 * (hash(node) % 100) / 100,
        published_at=T0 + timedelta(minutes=r),
        claims=CLAIMS,
    )


def round_bytes(node: str, r: int) -> tuple[str, bytes]:
    table = round_table(node, r)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    key = round_key("bench", node, date(2026, 1, 1), r, table.column("rollout_id").to_pylist())
    return key, buf.getvalue()


def fill(led: Ledger, nodes: int, rounds: int) -> float:
    """Write the synthetic ledger with parallel writers (what a swarm does); seconds taken."""
    start = time.perf_counter()
    jobs = [(f"n{i:04d}", r) for i in range(nodes) for r in range(rounds)]

    def write(job: tuple[str, int]) -> None:
        key, data = round_bytes(*job)
        led.store.put_new(key, data)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, jobs))
    return time.perf_counter() - start


def fill_compacted(led: Ledger, nodes: int, rounds: int) -> float:
    """Write the ledger as compaction leaves it: one file per node, sorted by group."""
    start = time.perf_counter()

    def write(i: int) -> None:
        node = f"n{i:04d}"
        tables = [round_table(node, r) for r in range(rounds)]
        table = pa.concat_tables(tables).sort_by([("group_id", "ascending")])
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd", row_group_size=8192)
        partition = partition_prefix("bench", node, date(2026, 1, 1))
        keys = [k for t in tables for k in t.column("rollout_id").to_pylist()]
        led.store.put_new(compacted_key(partition, keys), buf.getvalue())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(nodes)))
    return time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def sample_once(
    reader: Ledger, policy: object, nodes: int, rng: random.Random, **node_draw: object
) -> None:
    node = f"n{rng.randrange(nodes):04d}"
    got = reader.sample(
        node,
        J,
        policy,
        seed=rng.randrange(1 << 30),
        swarm_id="bench",
        now=T0 + timedelta(days=1),
        **node_draw,  # type: ignore[arg-type]
    )
    assert got.get_column("group_id").n_unique() == J, got.height


NODE_DRAWS = {
    # As a node draws: keyed by its secret, of each group its own group size (the synthetic
    # groups' 8: nothing to recut), and at G = 4 (every group longer than G: all recut).
    "as a node, G=8": {"draw_key": "0123456789abcdef" * 2, "rows_per_group": 8},
    "as a node, G=4 (every group recut)": {"draw_key": "0123456789abcdef" * 2, "rows_per_group": 4},
}


def measure(open_ledger: Callable[..., Ledger], nodes: int, label: str, repeat: int) -> list[dict]:
    rows = []
    rng = random.Random(0)
    writer = open_ledger()
    next_round = iter(range(10_000, 10_000 + 10 * repeat))
    publish_ms = timed(
        lambda: writer.publish(
            synthetic_round("bench", "writer", next(next_round), published_at=T0)
        ),
        repeat,
    )
    rows.append(
        {
            "phase": label,
            "op": "publish 1 round",
            "p50": pct(publish_ms, 50),
            "p95": pct(publish_ms, 95),
        }
    )
    filtered = RewardFilteredPolicy(
        min_mean_reward=0.1, max_mean_reward=0.9, max_per_peer=2, max_age_s=10 * 86400
    )
    for staleness in (0.0, 10.0):
        reader = open_ledger(max_staleness_s=staleness)
        start = time.perf_counter()
        reader.refresh()
        index_ms = (time.perf_counter() - start) * 1000
        if staleness == 0.0:
            rows.append(
                {"phase": label, "op": "index (first refresh)", "p50": index_ms, "p95": index_ms}
            )
        draws: list[tuple[str, object, dict[str, object]]] = [
            ("paper", "paper", {}),
            ("reward_filtered", filtered, {}),
            *(("paper " + name, "paper", kw) for name, kw in NODE_DRAWS.items()),
        ]
        for name, policy, kw in draws:
            ms = timed(lambda r=reader, p=policy, k=kw: sample_once(r, p, nodes, rng, **k), repeat)
            rows.append(
                {
                    "phase": label,
                    "op": f"sample J={J} {name}, staleness {staleness:g}s",
                    "p50": pct(ms, 50),
                    "p95": pct(ms, 95),
                }
            )
        reader.close()
    writer.close()
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoProcess:
    """moto's S3 server in a child process, bound to loopback."""

    def __init__(self) -> None:
        self.port = free_port()
        env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.endpoint = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("moto server did not start")

    def options(self) -> dict:
        return {"key": "bench", "secret": "bench", "endpoint_url": self.endpoint}

    def bucket(self, name: str) -> str:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            region_name="us-east-1",
        ).create_bucket(Bucket=name)
        return f"s3://{name}/ledger"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def run(
    size: int,
    backend: str,
    repeat: int,
    moto: MotoProcess | None,
    work: Path,
    layout: str = "rounds",
) -> list[dict]:
    nodes, rounds = shape(size)
    if backend == "local":
        url, options = str(work / f"ledger-{size}"), None
        shutil.rmtree(url, ignore_errors=True)
    else:
        assert moto is not None
        url, options = moto.bucket(f"bench-{size}-{int(time.time())}"), moto.options()

    def open_ledger(**kw: object) -> Ledger:
        config = LedgerConfig.model_validate({"url": url, "storage_options": options or {}, **kw})
        return Ledger(config)

    led = open_ledger()
    total = nodes * rounds * GROUPS * GROUP_SIZE
    if layout == "compacted":
        fill_s = fill_compacted(led, nodes, rounds)
        print(
            f"# {backend}: {total:,} completions written as {nodes} compacted files in "
            f"{fill_s:.1f}s",
            flush=True,
        )
        results = measure(open_ledger, nodes, "compacted layout", repeat)
    else:
        fill_s = fill(led, nodes, rounds)
        print(
            f"# {backend}: {total:,} completions, {nodes} nodes x {rounds} rounds, "
            f"{nodes * rounds:,} files written in {fill_s:.1f}s"
            + (f", {stored_bytes(url) / total:.0f} bytes a row" if backend == "local" else ""),
            flush=True,
        )
        results = measure(open_ledger, nodes, "before compaction", repeat)
        start = time.perf_counter()
        report = led.compact(all_nodes=True, before=date.max)
        print(
            f"# {backend}: compacted {report.files_in:,} files into {report.files_out:,} "
            f"in {time.perf_counter() - start:.1f}s",
            flush=True,
        )
        results += measure(open_ledger, nodes, "after compaction", repeat)
    led.close()
    files = nodes if layout == "compacted" else nodes * rounds
    for r in results:
        r.update({"rows": total, "backend": backend, "files": files})
        print("#", row_text(r), flush=True)  # partial results survive an interrupted run
    return results


def stored_bytes(root: str) -> int:
    """Bytes of the rollout files under a local ledger (zstd Parquet as published)."""
    return sum(p.stat().st_size for p in Path(root).rglob("*.parquet"))


def row_text(r: dict) -> str:
    return (
        f"| {r['rows']:,} | {r['backend']} | {r['phase']} | {r['op']} | "
        f"{r['p50']:.1f} | {r['p95']:.1f} |"
    )


def main() -> None:
    apply_offline_defaults()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--backends", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per figure")
    parser.add_argument(
        "--layout",
        choices=["rounds", "compacted"],
        default="rounds",
        help="rounds: one file per node round, measured before and after compaction; "
        "compacted: write the post-compaction layout directly (one file per node)",
    )
    parser.add_argument(
        "--no-claims",
        action="store_true",
        help="rows without the generator's claim (token_ids, token_logprobs NULL), as "
        "before schema 2",
    )
    args = parser.parse_args()
    global CLAIMS
    CLAIMS = not args.no_claims
    moto = MotoProcess() if "s3" in args.backends else None
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="sapo-bench-") as tmp:
            for size in args.sizes:
                for backend in args.backends:
                    results += run(size, backend, args.repeat, moto, Path(tmp), args.layout)
    finally:
        if moto:
            moto.stop()
    print("\n| rows | backend | phase | operation | p50 ms | p95 ms |")
    print("|---:|---|---|---|---:|---:|")
    for r in results:
        print(row_text(r))


if __name__ == "__main__":
    main()
