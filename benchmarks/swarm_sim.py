"""Swarm simulator: a ledger growing under N synthetic nodes while a reader samples from it.

No model: each node publishes one file per round (8 groups x 8 completions, 64 rows, as a
node of the paper's setup does) into S3 over HTTP (moto's server on 127.0.0.1) or a local
folder. The ledger grows in waves (one round of every node each); after every few waves the
simulator measures, with writers still publishing at ``--rate`` files a second:

- sample: ``Ledger.sample`` of J = 8 groups by a long-lived reader in its own process, with a
  fresh refresh on every call (``max_staleness_s = 0``), p50 / p95, and the refresh's part;
- requests per sample call, by kind (list pages, head, get), from the reader's store;
- new objects the reader met per call, and the reader process's RSS;
- publish: ``Ledger.publish`` of one more round (validation, Parquet, PUT, markers), p50;
- at the end, a new reader's first sample (a cold start: lists and indexes everything).

``--change-log on`` is the change log (ledger/changes.py), ``off`` a full listing per refresh;
``--copies off`` lets DuckDB read S3 instead of the readers' one-GET local copies.

    python benchmarks/swarm_sim.py --store s3 --nodes 1000 --waves 20 --change-log on
    python benchmarks/swarm_sim.py --store s3 --nodes 1000 --waves 20 --change-log off
    python benchmarks/swarm_sim.py --store local --nodes 1000 --waves 20 --change-log off
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ledger_bench import T0, MotoProcess, pct, round_bytes, round_table

from flows.env import apply_offline_defaults
from ledger import Ledger, LedgerConfig

J = 8
SWARM = "bench"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_ledger(
    url: str, options: dict[str, Any], args: argparse.Namespace, reader_index: Path | None = None
) -> Ledger:
    config = LedgerConfig.model_validate(
        {
            "url": url,
            "storage_options": options,
            "change_log": {"use": args.change_log},
            "local_copies": args.copies,
        }
    )
    return Ledger(config, index_path=reader_index)


# --- the reader, in its own process ------------------------------------------------------


def reader_main(conn: Any, url: str, options: dict[str, Any], args: argparse.Namespace) -> None:
    apply_offline_defaults()
    reader = open_ledger(url, options, args)
    rng = random.Random(0)
    while True:
        command = conn.recv()
        if command is None:
            return
        nodes, calls = command
        conn.send(sample_calls(reader, nodes, calls, rng))


def sample_calls(reader: Ledger, nodes: int, calls: int, rng: random.Random) -> dict[str, Any]:
    latencies, refreshes, listings, reads, requests, added = [], [], [], [], [], []
    for _ in range(calls):
        before = dict(reader.store.requests)
        start = time.perf_counter()
        got = reader.sample(
            f"n{rng.randrange(nodes):04d}",
            J,
            seed=rng.randrange(1 << 30),
            swarm_id=SWARM,
            now=T0 + timedelta(days=1),
        )
        latencies.append((time.perf_counter() - start) * 1000)
        after = reader.store.requests
        requests.append({k: after[k] - before.get(k, 0) for k in after})
        added.append(reader._last_refresh.added)
        refreshes.append(reader._last_refresh.seconds * 1000)
        listings.append(reader._last_refresh.list_seconds * 1000)
        reads.append(reader._last_refresh.read_seconds * 1000)
        assert got.get_column("group_id").n_unique() == J, got.height
        time.sleep(0.05)  # a node samples once a round, not in a tight loop
    kinds = sorted({k for r in requests for k in r})
    return {
        "sample_p50_ms": pct(latencies, 50),
        "sample_p95_ms": pct(latencies, 95),
        "refresh_p50_ms": pct(refreshes, 50),
        "refresh_list_p50_ms": pct(listings, 50),
        "refresh_read_p50_ms": pct(reads, 50),
        "requests_per_call": {k: statistics.mean(r.get(k, 0) for r in requests) for k in kinds},
        "new_objects_per_call": statistics.mean(added),
        "new_objects_p50": pct(added, 50),
        "reader_rss_mb": rss_mb(),
        "files_indexed": len(reader.catalog.files),
    }


# --- writers ------------------------------------------------------------------------------


def write_wave(writer: Ledger, nodes: int, wave: int, threads: int = 8) -> None:
    def put(node: int) -> None:
        key, data = round_bytes(f"n{node:04d}", wave)
        writer.store.put_new(key, data)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, range(nodes)))


def trickle(writer: Ledger, nodes: int, wave: int, rate: float, stop: threading.Event) -> int:
    """Publish rounds of wave ``wave`` at ``rate`` files a second until stopped."""
    written = 0
    while rate > 0 and not stop.is_set() and written < nodes:
        started = time.perf_counter()
        key, data = round_bytes(f"n{written:04d}", wave)
        writer.store.put_new(key, data)
        written += 1
        stop.wait(max(0.0, 1 / rate - (time.perf_counter() - started)))
    return written


def publish_latency(writer: Ledger, wave: int, repeat: int = 5) -> float:
    times = []
    for i in range(repeat):
        table = round_table(f"p{i:03d}", wave)
        start = time.perf_counter()
        writer.publish(table)
        times.append((time.perf_counter() - start) * 1000)
    return pct(times, 50)


# --- the run ------------------------------------------------------------------------------


def run(args: argparse.Namespace, url: str, options: dict[str, Any]) -> list[dict[str, Any]]:
    writer = open_ledger(url, options, args)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    reader = ctx.Process(target=reader_main, args=(there, url, options, args))
    reader.start()
    results = []
    try:
        wave = 0
        while wave < args.waves:
            for _ in range(min(args.every, args.waves - wave)):
                write_wave(writer, args.nodes, wave)
                wave += 1
            stop = threading.Event()
            extra = args.waves + wave  # rounds numbered apart from the waves'
            here.send((args.nodes, args.calls))
            background = ThreadPoolExecutor(1)
            trickled = background.submit(trickle, writer, args.nodes, extra, args.rate, stop)
            measured = here.recv()
            stop.set()
            background.shutdown()
            objects = args.nodes * wave + trickled.result()
            row = {
                "objects": objects,
                "rows": objects * 64,
                **measured,
                "publish_p50_ms": publish_latency(writer, extra + 1),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
        index = Path(tempfile.mkdtemp(prefix="swarm-sim-index-")) / "reader.duckdb"
        start = time.perf_counter()
        cold = open_ledger(url, options, args, index)
        sample_calls(cold, args.nodes, 1, random.Random(1))
        cold_s = time.perf_counter() - start
        start = time.perf_counter()
        cold.close()  # saves its index
        save_s = time.perf_counter() - start
        write_wave(writer, args.nodes // 10, args.waves + wave + 2)  # news while it was down
        start = time.perf_counter()
        restarted = open_ledger(url, options, args, index)
        sample_calls(restarted, args.nodes, 1, random.Random(2))
        restart_s = time.perf_counter() - start
        restarted.close()
        results.append(
            {
                "cold_start_s": cold_s,
                "index_save_s": save_s,
                "index_mb": index.stat().st_size / 2**20,
                "restart_s": restart_s,
                "new_while_down": args.nodes // 10,
            }
        )
        print(json.dumps(results[-1]), flush=True)
    finally:
        here.send(None)
        reader.join(timeout=60)
        if reader.is_alive():
            reader.terminate()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--store", choices=["s3", "local"], default="s3")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--waves", type=int, default=20, help="rounds of every node to publish")
    p.add_argument("--every", type=int, default=4, help="measure after this many waves")
    p.add_argument("--calls", type=int, default=30, help="sample calls per measurement")
    p.add_argument(
        "--rate", type=float, default=20.0, help="files a second while sampling (0: none)"
    )
    p.add_argument("--change-log", choices=["on", "off"], default="on")
    p.add_argument(
        "--copies",
        choices=["auto", "on", "off"],
        default="auto",
        help="readers' verified local copies (ledger.local_copies; auto: on for S3)",
    )
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    apply_offline_defaults()
    moto = MotoProcess() if args.store == "s3" else None
    with tempfile.TemporaryDirectory(prefix="swarm-sim-") as tmp:
        try:
            if moto is not None:
                url, options = moto.bucket(f"sim-{int(time.time())}"), moto.options()
            else:
                url, options = str(Path(tmp) / "ledger"), {}
            print(
                f"{args.store}, change log {args.change_log}, copies {args.copies}, "
                f"{args.nodes} nodes",
                flush=True,
            )
            results = run(args, url, options)
        finally:
            if moto is not None:
                moto.stop()
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def print_table(results: list[dict[str, Any]]) -> None:
    print(
        "objects    rows  sample_p50  sample_p95  refresh_p50  (list  read)  list/call  head/call  "
        "get/call  new/call (p50)  publish_p50  reader_MB"
    )
    for r in results:
        if "objects" not in r:
            continue
        req = r["requests_per_call"]
        print(
            f"{r['objects']:7d} {r['rows']:7d}  {r['sample_p50_ms']:8.0f}ms  "
            f"{r['sample_p95_ms']:8.0f}ms  {r['refresh_p50_ms']:9.0f}ms  "
            f"({r.get('refresh_list_p50_ms', 0):4.0f} {r.get('refresh_read_p50_ms', 0):5.0f})  "
            f"{req.get('list', 0):9.1f}  {req.get('head', 0):9.1f}  "
            f"{req.get('get', 0):8.1f}  {r['new_objects_per_call']:8.1f} "
            f"({r.get('new_objects_p50', 0):4.0f})  "
            f"{r['publish_p50_ms']:9.0f}ms  {r['reader_rss_mb']:9.0f}"
        )
    for r in results:
        if "cold_start_s" in r:
            print(
                f"a new reader's first sample: {r['cold_start_s']:.1f} s; saving its index: "
                f"{r['index_save_s']:.1f} s ({r['index_mb']:.0f} MB); restarted with it, "
                f"{r['new_while_down']} files newer: first sample {r['restart_s']:.1f} s"
            )


if __name__ == "__main__":
    main()
