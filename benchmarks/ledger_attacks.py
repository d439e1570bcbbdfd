"""The attacks of `attacks.py` on a ledger's reader: each plants its payload beside honest
peers' rounds (as a peer with bucket access could) and returns the SQL that counts the rows
a reader would wrongly serve. `attacks.py` runs them, each against a fresh reader process."""

from __future__ import annotations

import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from benchmarks/

import pyarrow as pa
import pyarrow.parquet as pq

from ledger import Ledger, NodeKey
from ledger import identity as ident
from ledger.records import to_table
from tests import hostile
from tests.factories import open_ledger, round_rows


def peak_rss_mb() -> float:
    """This process's peak RSS since it started its program: VmHWM belongs to the address
    space made at exec (``ru_maxrss`` would carry over the forking parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Site:
    url: str
    options: dict[str, Any]
    kind: str

    def open(self, **kwargs: Any) -> Ledger:
        return open_ledger(self.url, self.options or None, **kwargs)

    def sibling(self, name: str) -> Site:
        """Another ledger on the same store (a folder or prefix beside this one)."""
        return Site(f"{self.url}-{name}", self.options, self.kind)

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
