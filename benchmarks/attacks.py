"""Hostile peers against a reader: issue 12's table of attacks, replayed at full size.

For each attack and backend (a local folder; S3 over HTTP to moto's server on 127.0.0.1) this
plants the attack beside three honest peers' rounds, then starts a *fresh reader process*
that lists, indexes, validates, queries ``rollouts`` and samples 10 times, and prints:

- reader peak RSS (the child's ``VmHWM``) and seconds;
- rows wrongly accepted: rows of the attack that a reader serves although it should not
  (forged content, out-of-range rewards, another node's ids, rows under a victim's name);
- crash: the reader raised or exited non-zero; hang: it ran past ``--timeout``.

Targets (issue 12): no crash or hang, 0 forged rows served, reader peak <= 1 GB on every
attack, a flooding peer held to its cap.

    python benchmarks/attacks.py                       # every attack, both backends
    python benchmarks/attacks.py --only bomb-plain-4gib --backends local
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.env import apply_offline_defaults

apply_offline_defaults()
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from ledger_attacks import ATTACKS, Site, peak_rss_mb  # noqa: E402  (benchmarks/)
from receiver_attacks import ATTACKS as RECEIVER_ATTACKS  # noqa: E402
from receiver_attacks import run_attack as run_receiver_attack  # noqa: E402

from ledger import NodeKey  # noqa: E402
from tests import hostile  # noqa: E402
from tests.factories import open_ledger, round_rows  # noqa: E402

# -- the reader, in its own process --------------------------------------------------------


def read(site: Site, wrong_sql: str) -> dict[str, Any]:
    """What a fresh reader does with the ledger; its figures as a dict."""
    from datetime import UTC, datetime, timedelta

    from ledger.policies import RewardFilteredPolicy

    started = time.monotonic()
    led = site.open()
    report = led.validate()
    total = led.query("SELECT count(*) FROM rollouts").item()
    # The receiver knows the honest peers (its reputation of them); the attackers are new.
    known = ["good1", "good2", "good3"]
    drawn: list[str] = []
    blind: list[str] = []
    for seed in range(10):
        frame = led.sample("me", 8, "paper", seed=seed, swarm_id="sw", known_nodes=known)
        drawn += frame.unique("group_id").get_column("node_id").to_list()
        blind += [g.split(".")[1] for g in led.sample_group_ids("me", 8, seed=seed, swarm_id="sw")]
    if wrong_sql == "FLOOD":  # flooders' groups beyond the budget for unknown peers
        evil = sum(n.startswith("evil") for n in drawn)
        wrong = max(0, evil - 2 * 10)  # ceil(0.25 x 8) a draw
        naive = sum(n.startswith("evil") for n in blind)
        extra = (
            f"attackers' share of J: {evil}/{len(drawn)} (knowing no peer: {naive}/{len(blind)})"
        )
    elif wrong_sql == "CONVERT":
        every = led.query("SELECT * FROM rollouts")
        every.rows()  # converts every value, as `sapo ledger query` prints them
        frame = led.sample("me", 8, "paper", seed=0, swarm_id="sw")
        frame.rows()
        wrong = every.filter(every["node_id"] == "evil").height
        extra = ""
    elif wrong_sql == "POLLS":
        polls = []
        for _ in range(5):
            led.refresh()
            feed = getattr(led.store, "feed", None)
            polls.append(feed.last["list"] if feed is not None else 0)
        wrong = 0
        extra = f"LIST requests per poll: {polls}"
    elif wrong_sql == "REFRESH":  # what every later refresh costs, nothing having changed
        refreshes = []
        for _ in range(5):
            begun = time.perf_counter()
            led.refresh()
            refreshes.append(time.perf_counter() - begun)
        wrong = 0
        extra = "seconds per later refresh: " + ", ".join(f"{r:.3f}" for r in refreshes)
    elif wrong_sql == "RECENCY":
        later = datetime.now(UTC) + timedelta(hours=2)
        policy = RewardFilteredPolicy(max_age_s=3600)
        served = led.sample("me", 10, policy, now=later, swarm_id="sw")
        wrong = served.filter(served["node_id"] == "evil").height
        extra = ""
    else:
        wrong = int(led.query(wrong_sql).item())
        extra = ""
    return {
        "seconds": time.monotonic() - started,
        "rows": total,
        "skipped": dict(report.skipped),
        "wrong": wrong,
        "extra": extra,
        "rss_mb": peak_rss_mb(),
    }


def run_reader(site: Site, wrong_sql: str, timeout: float) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--reader",
        json.dumps([site.url, site.options, site.kind, wrong_sql]),
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"hang": True, "crash": False, "seconds": time.monotonic() - started}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {
            "hang": False,
            "crash": True,
            "error": last[:160],
            "seconds": time.monotonic() - started,
        }
    # The figures are the last line (a task's generator may print progress dots before).
    last = done.stdout.strip().splitlines()[-1]
    result: dict[str, Any] = json.loads(last[last.find("{") :])
    result.update(hang=False, crash=False)
    return result


# -- behaviours that are not a planted file ------------------------------------------------


def threads_sharing_a_ledger(site: Site, timeout: float) -> dict[str, Any]:
    led = site.open()
    errors: list[str] = []

    def work(node: str) -> None:
        try:
            for node_round in range(3):
                led.publish(round_rows(node, node_round, [[1, 0]], swarm_id="threads"))
                led.sample(node, 2, swarm_id="threads")
        except Exception as exc:  # reported in the table
            errors.append(f"{type(exc).__name__}: {exc}"[:120])

    started = time.monotonic()
    workers = [threading.Thread(target=work, args=(f"t{i}",), daemon=True) for i in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout)
    hang = any(w.is_alive() for w in workers)
    return {
        "hang": hang,
        "crash": bool(errors),
        "seconds": time.monotonic() - started,
        "wrong": 0,
        "error": "; ".join(errors),
    }


def silent_endpoint(timeout: float) -> dict[str, Any]:
    import socket

    from ledger import RetryPolicy, StorageError

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    threading.Thread(
        target=lambda: [held.append(listener.accept()[0]) for _ in range(1000)], daemon=True
    ).start()
    options = {
        "key": "k",
        "secret": "s",
        "endpoint_url": f"http://127.0.0.1:{listener.getsockname()[1]}",
    }
    led = open_ledger("s3://hung/ledger", options, retry=RetryPolicy(attempts=2))
    started = time.monotonic()
    outcomes = []
    for call in (lambda: led.publish(round_rows("n1", 0, [[1, 0]])), lambda: led.sample("me", 2)):
        try:
            call()
            outcomes.append("returned")
        except StorageError as exc:
            outcomes.append(type(exc).__name__)
    seconds = time.monotonic() - started
    return {
        "hang": seconds > timeout,
        "crash": False,
        "seconds": seconds,
        "wrong": 0,
        "extra": "/".join(outcomes),
    }


def missing_bucket(endpoint: dict[str, Any]) -> dict[str, Any]:
    from ledger import StoreUnusable

    led = open_ledger("s3://no-such-bucket/ledger", endpoint)
    started = time.monotonic()
    outcomes = []
    for call in (lambda: led.query("SELECT 1"), lambda: led.publish(round_rows("n1", 0, [[1, 0]]))):
        try:
            call()
            outcomes.append("no error")
        except StoreUnusable:
            outcomes.append("StoreUnusable")
    return {
        "hang": False,
        "crash": False,
        "seconds": time.monotonic() - started,
        "wrong": outcomes.count("no error"),
        "extra": "/".join(outcomes),
    }


# -- driver ---------------------------------------------------------------------------------


def new_site(kind: str, root: Path, server: Any) -> Site:
    if kind == "local":
        root.mkdir(parents=True, exist_ok=True)
        return Site(str(root / "ledger"), {}, "local")
    import boto3

    bucket = "attack-" + os.urandom(4).hex()
    boto3.client(
        "s3", endpoint_url=server.endpoint, aws_access_key_id="k", aws_secret_access_key="s"
    ).create_bucket(Bucket=bucket)
    return Site(
        f"s3://{bucket}/ledger", {"key": "k", "secret": "s", "endpoint_url": server.endpoint}, "s3"
    )


def seed_honest(site: Site, signed: bool, closed: bool = False) -> None:
    """The honest peers' rounds: signed in a swarm that requires signatures (``closed``: its
    rules list them as its members), or unsigned in an open one (where the reader's own
    checks are all that stands)."""
    setup = site.open()
    if signed:
        members = list(hostile.HONEST_ROUNDS) if closed else None
        setup.declare_swarm("sw", "required", members=members)
    for node, groups in hostile.HONEST_ROUNDS.items():
        key = NodeKey.generate("sw", node)
        if signed:
            setup.register_key(key)
        site.open(signer=key if signed else None).publish(round_rows(node, 0, groups))


SIGNED_SWARM = {"impersonation", "forged-reports", "reopened-rules", "sweep-intruder"}
"""Attacks run in a swarm that requires signatures; the rest in an open swarm, the worst case."""
CLOSED_SWARM = {"sweep-intruder"}
"""Attacks run in a closed swarm (its rules list the honest nodes)."""


class _Moto:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.stop()


# Every row this benchmark can print, in its order: --only takes these names.
ALL_ATTACKS = [
    *ATTACKS,
    "threads",
    "silent-endpoint",
    "missing-bucket",
    "control-tokens",
    "verifier-bomb",
    *RECEIVER_ATTACKS,
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    parser.add_argument(
        "--only", nargs="*", default=None, choices=ALL_ATTACKS, help="attack names (default: all)"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds before a reader counts as hung"
    )
    parser.add_argument("--reader", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader:
        url, options, kind, wrong_sql = json.loads(args.reader)
        print(json.dumps(read(Site(url, options, kind), wrong_sql)))
        return

    print_table(measure(args.only or ALL_ATTACKS, args.backends, args.timeout))


def measure(names: list[str], backends: list[str], timeout: float) -> list[tuple[str, str, Any]]:
    """Each attack of ``names`` on each backend, its row printed as it comes: (name, backend,
    figures). `receiver_attacks.py` runs its own rows through this too."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    logging.getLogger("ledger").setLevel(logging.ERROR)
    server = _Moto() if "s3" in backends else None
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="sapo-attacks-") as tmp:
            for name in names:
                for kind in backends:
                    if name in ("silent-endpoint", "missing-bucket") and kind == "local":
                        continue
                    site = new_site(kind, Path(tmp) / f"{name}-{kind}", server)
                    if name == "threads":
                        result = threads_sharing_a_ledger(site, timeout)
                    elif name == "silent-endpoint":
                        result = silent_endpoint(timeout)
                    elif name == "missing-bucket":
                        result = missing_bucket(site.options)
                    elif name in RECEIVER_ATTACKS:  # issue 43's, in receiver_attacks.py
                        result = run_receiver_attack(name, site, timeout)
                    elif name in ("control-tokens", "verifier-bomb"):
                        if kind != "local":
                            continue
                        result = _node_attack(name)
                    else:
                        seed_honest(site, signed=name in SIGNED_SWARM, closed=name in CLOSED_SWARM)
                        wrong_sql = ATTACKS[name](site)
                        result = run_reader(site, wrong_sql, timeout)
                    rows.append((name, kind, result))
                    print(_line(name, kind, result), flush=True)
    finally:
        if server is not None:
            server.stop()
    return rows


def print_table(rows: list[tuple[str, str, Any]]) -> None:
    """The rows as the table benchmarks/README.md keeps."""
    print()
    print(
        "| attack | backend | reader peak RSS MB | seconds | rows wrongly accepted "
        "| crash | hang | note |"
    )
    print("|---|---|---:|---:|---:|---|---|---|")
    for name, kind, r in rows:
        print(_line(name, kind, r))


def _node_attack(name: str) -> dict[str, Any]:
    """The node-side rows, each measured by its own script in a fresh process."""
    module, function = {
        "control-tokens": ("text_attacks", "control_tokens"),
        "verifier-bomb": ("node_attacks", "verifier_bomb"),
    }[name]
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        f"from {module} import {function}; print(json.dumps({function}()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"crash": True, "hang": False, "seconds": 0.0, "error": last[:160]}
    # The figures are the last line (a task's generator may print progress dots before).
    last = done.stdout.strip().splitlines()[-1]
    result: dict[str, Any] = json.loads(last[last.find("{") :])
    return result


def _line(name: str, kind: str, r: dict[str, Any]) -> str:
    rss = f"{r['rss_mb']:.0f}" if "rss_mb" in r else "-"
    wrong = r.get("wrong", "-")
    note = (
        r.get("error")
        or r.get("extra")
        or ", ".join(f"{k} {v}" for k, v in r.get("skipped", {}).items())
    )
    return (
        f"| {name} | {kind} | {rss} | {r['seconds']:.1f} | {wrong} | "
        f"{'yes' if r.get('crash') else 'no'} | {'yes' if r.get('hang') else 'no'} | {note} |"
    )


if __name__ == "__main__":
    main()
