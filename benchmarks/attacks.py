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
    python benchmarks/attacks.py --only bomb-plain --backends local
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.env import apply_offline_defaults

apply_offline_defaults()
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from receiver_attacks import ATTACKS as RECEIVER_ATTACKS  # noqa: E402
from receiver_attacks import run_attack as run_receiver_attack  # noqa: E402

from ledger import Ledger, NodeKey  # noqa: E402
from ledger import identity as ident  # noqa: E402
from ledger.records import to_table  # noqa: E402
from tests import hostile  # noqa: E402
from tests.factories import open_ledger, round_rows  # noqa: E402


@dataclass
class Site:
    url: str
    options: dict[str, Any]
    kind: str

    def open(self, **kwargs: Any) -> Ledger:
        return open_ledger(self.url, self.options or None, **kwargs)

    def put_raw(self, key: str, data: bytes) -> None:
        """Write past the store's key checks, as a peer with bucket access could."""
        hostile.put_raw(self.open(), key, data)


# -- the attacks: each plants its payload and returns the SQL that counts wrong rows -----

WRONG_NONE = "SELECT 0"
EVIL_ROWS = "SELECT count(*) FROM rollouts WHERE node_id = 'evil'"


def plant(site: Site, name: str, data: bytes) -> str:
    return hostile.plant(site.open(), name, data)


def nul_id(site: Site) -> str:
    plant(site, "r0-nul.parquet", hostile.parquet_bytes(hostile.nul_in_group_id()))
    return EVIL_ROWS


def nested(depth: int) -> Callable[[Site], str]:
    def attack(site: Site) -> str:
        plant(site, f"r0-deep{depth}.parquet", hostile.deep_nesting(depth))
        return EVIL_ROWS

    return attack


def reason_column(site: Site) -> str:
    plant(site, "r0-reason.parquet", hostile.reason_column())
    return "SELECT count(*) FROM rollouts WHERE reward > 1"


def unsafe_keys(site: Site) -> str:
    data = hostile.parquet_bytes(hostile.attacker_table())
    site.put_raw(f"{hostile.PREFIX}/*.parquet", data)
    if site.kind == "s3":
        site.put_raw(f"{hostile.PREFIX}/x/../r9-dots.parquet", data)
    else:
        folder = Path(site.open().store.root) / hostile.PREFIX  # type: ignore[attr-defined]
        folder.mkdir(parents=True, exist_ok=True)
        os.mkfifo(folder / "r1-fifo.parquet")
        outside = Path(tempfile.mkdtemp()) / "outside.parquet"
        outside.write_bytes(data)
        os.symlink(outside, folder / "r2-link.parquet")
    return EVIL_ROWS


def glob_compaction(site: Site) -> str:
    """A '*.parquet' object beside a node that compacts: only its inputs may go."""
    evil = site.open()
    for node_round in range(1, 4):
        evil.publish(round_rows("evil", node_round, [[1, 0]]))
    site.put_raw(f"{hostile.PREFIX}/*.parquet", hostile.parquet_bytes(hostile.attacker_table()))
    evil.compact(["evil"], before=__import__("datetime").date(2100, 1, 1))
    # Every honest row must survive, and evil's 6 merged rows are served: 'wrong' = lost rows.
    return "SELECT 7 - count(*) FROM rollouts WHERE node_id IN ('good1', 'good2')"


def bomb_plain(gib: float) -> Callable[[Site], str]:
    def attack(site: Site) -> str:
        plant(site, "r0-bomb.parquet", _bomb(gib, dictionary=False))
        return WRONG_NONE

    return attack


def bomb_dictionary(gib: float) -> Callable[[Site], str]:
    def attack(site: Site) -> str:
        plant(site, "r0-bombdict.parquet", _bomb(gib, dictionary=True))
        return WRONG_NONE

    return attack


def _bomb(gib: float, dictionary: bool) -> bytes:
    """Completions of 32,000 'a's, ``gib`` GiB of them unpacked, written a row group at a time."""
    chars, rows_per_group = 32_000, 4096
    groups = max(1, int(gib * 2**30 / (chars * rows_per_group)))
    base = to_table(round_rows("evil", 0, [[1, 0]] * (rows_per_group // 2)))
    base = hostile.with_column(base, "completion", pa.array(["a" * chars] * rows_per_group))
    path = Path(tempfile.mkdtemp()) / "bomb.parquet"
    with pq.ParquetWriter(path, base.schema, compression="zstd", use_dictionary=dictionary) as w:
        for g in range(groups):
            ids = [f"sw.evil.r0.b{g}.{i // 2}" for i in range(rows_per_group)]
            part = hostile.with_column(base, "group_id", pa.array(ids))
            part = hostile.with_column(
                part, "rollout_id", pa.array([f"{x}.{i}" for i, x in enumerate(ids)])
            )
            w.write_table(part)
    data = path.read_bytes()
    shutil.rmtree(path.parent)
    return data


def tiny_rows(rows: int) -> Callable[[Site], str]:
    def attack(site: Site) -> str:
        plant(site, "r0-tiny.parquet", hostile.many_tiny_rows(rows))
        return WRONG_NONE

    return attack


def shadowing(site: Site) -> str:
    plant(site, "r0-shadow.parquet", hostile.shadowing("good1"))
    return "SELECT count(*) FROM rollouts WHERE question = 'forged'"


def dotted_namespace(site: Site) -> str:
    prefix, data = hostile.dotted_namespace("good1")
    hostile.plant(site.open(), "r0-dotted.parquet", data, prefix=prefix)
    return "SELECT count(*) FROM rollouts WHERE question = 'forged'"


def impersonation(site: Site) -> str:
    """publish() as the victim, in a swarm that requires signatures (the sapo default)."""
    thief = NodeKey.generate("sw", "evil")
    site.open(signer=thief).register_key(thief)
    forged = to_table(round_rows("good1", 7, [[1, 0]]))
    key = "swarm_id=sw/node_id=good1/day=2026-03-01/r00000007-forged.parquet"
    data = hostile.parquet_bytes(forged)
    store = site.open().store
    store.put_new(
        ident.signature_key(key, ident.sha256_of(data)), thief.signature_object(key, data)
    )
    store.put_new(key, data)
    return "SELECT count(*) FROM rollouts WHERE node_round = 7"


def flood(groups: int, sybils: int = 0) -> Callable[[Site], str]:
    def attack(site: Site) -> str:
        led = site.open()
        if sybils:
            per = max(1, groups // sybils)
            for s in range(sybils):
                led.publish(hostile.flood(per, node_id=f"evil{s}"))
        else:
            led.publish(hostile.flood(groups))
        led.publish(to_table(round_rows("good3", 0, [[1, 0]] * 120)))
        return "FLOOD"

    return attack


def future_date(site: Site) -> str:
    site.open().publish(hostile.from_the_future(node_round=3))
    return "RECENCY"


def overwrite(site: Site) -> str:
    table = hostile.attacker_table([[1.0, 0.0]])
    key = plant(site, "r0-swap.parquet", hostile.parquet_bytes(table))
    site.open().query("SELECT count(*) FROM rollouts")  # indexed by someone: now swap it
    forged = hostile.parquet_bytes(hostile.with_column(table, "reward", pa.array([5.0, 0.0])))
    time.sleep(0.01)
    site.put_raw(key, forged)
    return "SELECT count(*) FROM rollouts WHERE reward > 1"


# -- issue 27: values out of range, costs that explode -------------------------------------


def stamped(micros: int) -> Callable[[Site], str]:
    def attack(site: Site) -> str:
        plant(site, "r0-time.parquet", hostile.stamped_at(micros))
        return "CONVERT"  # every served row converted to Python, as the node and CLI do

    return attack


def endless_round(site: Site) -> str:
    plant(site, "r1-endless.parquet", hostile.endless_round())
    return EVIL_ROWS


def repeated_text(site: Site) -> str:
    plant(site, "r0-repeated.parquet", hostile.repeated_text(200_000, 32_000))  # 6.4 GB
    return EVIL_ROWS


def many_row_groups(site: Site) -> str:
    plant(site, "r0-rowgroups.parquet", hostile.many_row_groups(4000, 200))  # 95 MB footer
    return EVIL_ROWS


def future_markers(site: Site) -> str:
    """10,000 change-log markers stamped a year ahead (S3; a local ledger has none)."""
    from ledger.changes import ChangeLogStore, marker_key

    store = site.open().store
    if isinstance(store, ChangeLogStore):
        inner = store.inner
        ahead = int((time.time() + 365 * 86400) * 1000)
        root = f"{inner.bucket}/{inner.prefix}"  # type: ignore[attr-defined]
        names = [
            marker_key(f"{hostile.PREFIX}/r{i}-x.parquet", True, ahead + i) for i in range(10_000)
        ]
        inner.fs.pipe({f"{root}/{n}": b"" for n in names})  # type: ignore[attr-defined]
    return "POLLS"


# -- issue 27, second pass: reports under another's prefix, sweeps, floods ----------------


def forged_reports(site: Site) -> str:
    """With shared credentials, an unsigned evaluation (accuracy 1.0) and a manifest (J = 0,
    another experiment) under good1's prefix; good1 has a key (signed swarm) and wrote none."""
    from datetime import UTC, datetime

    from ledger import NodeManifest, node_logs, parse_policy
    from ledger import manifests as mf

    early = datetime(2026, 1, 1, tzinfo=UTC)
    row = {"task": "chain_sum", "questions": 8, "completions": 8, "correct": 8.0,
           "accuracy": 1.0, "policy_version": 0, "eval_seed": 1}  # fmt: skip
    lines = node_logs.EVALUATIONS.lines(node_logs.EVALUATIONS.validate([row], 0), early)
    manifest = NodeManifest.for_node(
        swarm_id="sw", node_id="good1", experiment="other", local_groups=4, external_groups=0,
        policy=parse_policy({"kind": "paper"}), model_id="m", seed=0, written_at=early,
    )  # fmt: skip
    site.put_raw(node_logs.EVALUATIONS.key("sw", "good1", 0, early), lines)
    site.put_raw(mf.manifest_key(manifest), mf.encode(manifest))
    return (
        "SELECT (SELECT count(*) FROM evaluations WHERE node_id = 'good1') "
        "+ (SELECT count(*) FROM manifests WHERE node_id = 'good1')"
    )


def reopened_rules(site: Site) -> str:
    """With shared credentials, the signed swarm's rules rewritten to open, then an unsigned
    file as good1 (a node with a key)."""
    site.put_raw(ident.swarm_rules_key("sw"), ident.rules_object("open"))
    data = hostile.parquet_bytes(to_table(round_rows("good1", 7, [[1, 1]])))
    site.put_raw("swarm_id=sw/node_id=good1/day=2026-03-01/r00000007-open.parquet", data)
    return "SELECT count(*) FROM rollouts WHERE node_round = 7"


def sweep_intruder(site: Site) -> str:
    """A stranger joins a closed swarm: its own key, a signed manifest claiming J = 2 in the
    sweep's experiment, and 100 signed groups, all under its own prefix."""
    from ledger import NodeManifest, parse_policy

    evil = NodeKey.generate("sw", "evil")
    led = site.open(signer=evil)
    led.register_key(evil)
    led.write_manifest(
        NodeManifest.for_node(
            swarm_id="sw",
            node_id="evil",
            experiment="exp",
            local_groups=2,
            external_groups=2,
            policy=parse_policy({"kind": "paper"}),
            model_id="m",
            seed=0,
        )
    )
    led.publish(round_rows("evil", 0, [[1, 0]] * 100))
    return (
        "SELECT (SELECT count(*) FROM rollouts WHERE node_id = 'evil') "
        "+ (SELECT count(*) FROM manifests WHERE node_id = 'evil')"
    )


def sample_logs(files: int, mb: int) -> Callable[[Site], str]:
    def attack(site: Site) -> str:
        line = b'{"node_round": 0, "group_id": "' + b"g" * 200 + b'", "peer_node_id": "good1"}\n'
        data = line * (mb * 2**20 // len(line))
        for i in range(files):
            key = f"_samples/swarm_id=sw/node_id=evil/day=2026-03-01/s{i:08d}-{i:020x}.jsonl"
            site.put_raw(key, data)
        return "SELECT count(*) FROM samples WHERE node_id = 'evil'"

    return attack


def signature_folders(local: int, s3: int) -> Callable[[Site], str]:
    """Signature objects each in a folder of its own (the layout's), by the ten thousand."""

    def attack(site: Site) -> str:
        count = local if site.kind == "local" else s3
        keys = [
            ident.signature_key(f"swarm_id=sw/node_id=evil/day=2026-03-01/r{i:08d}-x", f"{i:064x}")
            for i in range(count)
        ]
        store = site.open().store
        inner = getattr(store, "inner", store)
        if site.kind == "local":
            for key in keys:
                path = Path(inner.root, key)  # type: ignore[attr-defined]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"{}")
        else:
            root = f"{inner.bucket}/{inner.prefix}"  # type: ignore[attr-defined]
            inner.fs.pipe({f"{root}/{k}": b"{}" for k in keys})  # type: ignore[attr-defined]
        return "REFRESH"

    return attack


ATTACKS: dict[str, Callable[[Site], str]] = {
    "nul-in-id": nul_id,
    "nested-50": nested(50),
    "nested-1000": nested(1000),
    "reason-column": reason_column,
    "unsafe-keys": unsafe_keys,
    "glob-compaction": glob_compaction,
    "bomb-plain-4gib": bomb_plain(4.0),
    "bomb-dictionary-4gib": bomb_dictionary(4.0),
    "10M-tiny-rows": tiny_rows(10_000_000),
    "shadow-ids": shadowing,
    "dotted-node-id": dotted_namespace,
    "impersonation": impersonation,
    "flood-1200": flood(1200),
    "sybil-300": flood(1200, sybils=300),
    "future-date": future_date,
    "same-size-overwrite": overwrite,
    "time-year-10000": stamped(hostile.YEAR_10000_US),
    "time-infinity": stamped(hostile.INT64_MAX),
    "round-int64-max": endless_round,
    "repeated-text-6gb": repeated_text,
    "row-groups-95mb-footer": many_row_groups,
    "future-markers-10k": future_markers,
    "forged-reports": forged_reports,
    "reopened-rules": reopened_rules,
    "sweep-intruder": sweep_intruder,
    "sample-logs-10x40mb": sample_logs(10, 40),
    "signature-folders-100k": signature_folders(100_000, 20_000),
}
NEW_IN_ISSUE_27 = [*list(ATTACKS)[-11:], "control-tokens", "verifier-bomb"]
"""Rows added by issue 27 (the last two are the node's, not the reader's: benchmarks/
text_attacks.py and benchmarks/node_attacks.py measure them in their own processes)."""


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


def peak_rss_mb() -> float:
    """This process's peak RSS since it started its program: VmHWM belongs to the address
    space made at exec (``ru_maxrss`` would carry over the forking parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    parser.add_argument("--only", nargs="*", default=None, help="attack names (default: all)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds before a reader counts as hung"
    )
    parser.add_argument("--reader", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader:
        url, options, kind, wrong_sql = json.loads(args.reader)
        print(json.dumps(read(Site(url, options, kind), wrong_sql)))
        return

    names = args.only or [
        *ATTACKS,
        "threads",
        "silent-endpoint",
        "missing-bucket",
        "control-tokens",
        "verifier-bomb",
        *RECEIVER_ATTACKS,
    ]
    print_table(measure(names, args.backends, args.timeout))


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
