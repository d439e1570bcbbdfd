"""Per-node credentials (ledger/credentials.py) on an S3 server that enforces IAM: a node
writes its own prefixes and nothing else, and reads everything."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from ledger import NodeKey, NodeManifest, StoreUnusable, parse_policy
from ledger.credentials import node_policy
from tests.conftest import stop_process_group
from tests.factories import open_ledger, round_rows

pytestmark = pytest.mark.s3
SETUP_ACTIONS = 20
"""Requests the server takes without credentials: the administrator's setup below."""


@pytest.fixture(scope="module")
def iam_server() -> Iterator[dict[str, Any]]:
    """moto's S3 + IAM server on loopback, enforcing policies after the setup requests."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(SETUP_ACTIONS))
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield {"endpoint_url": f"http://127.0.0.1:{port}"}
    finally:
        stop_process_group(proc)


def node_credentials(server: dict[str, Any]) -> dict[str, dict[str, str]]:
    import boto3

    admin = {
        "endpoint_url": server["endpoint_url"],
        "aws_access_key_id": "admin",
        "aws_secret_access_key": "admin",
        "region_name": "us-east-1",
    }
    boto3.client("s3", **admin).create_bucket(Bucket="swarm")
    iam = boto3.client("iam", **admin)
    found = {}
    for node in ("a", "b"):
        iam.create_user(UserName=node)
        policy = json.dumps(node_policy("swarm", "ledger", "sw", node))
        arn = iam.create_policy(PolicyName=f"sapo-sw-{node}", PolicyDocument=policy)["Policy"][
            "Arn"
        ]
        iam.attach_user_policy(UserName=node, PolicyArn=arn)
        key = iam.create_access_key(UserName=node)["AccessKey"]
        found[node] = {
            "endpoint_url": server["endpoint_url"],
            "key": key["AccessKeyId"],
            "secret": key["SecretAccessKey"],
        }
    return found


@pytest.fixture(scope="module")
def creds(iam_server: dict[str, Any]) -> dict[str, dict[str, str]]:
    return node_credentials(iam_server)


def test_a_node_writes_only_its_own_prefixes_and_reads_everything(creds):
    url = "s3://swarm/ledger"
    keys = {node: NodeKey.generate("sw", node) for node in creds}
    ledgers = {node: open_ledger(url, creds[node], signer=keys[node]) for node in creds}
    ledgers["a"].declare_swarm("sw", "required")
    for node, led in ledgers.items():
        led.register_key(keys[node])
        led.publish(round_rows(node, 0, [[1, 0]]))
        led.publish(round_rows(node, 1, [[0, 1]]))
    a = ledgers["a"]
    assert a.query("SELECT count(*) FROM rollouts").item() == 8  # reads b's files too
    assert a.validate().clean
    # a cannot write, overwrite or delete under b's prefix ...
    theirs = next(o.key for o in a.store.list() if o.key.startswith("swarm_id=sw/node_id=b/"))
    with pytest.raises(StoreUnusable, match="refused"):
        a.store.put_new(theirs.replace(".parquet", "-x.parquet"), b"forged")
    with pytest.raises(StoreUnusable, match="refused"):
        a.store.delete([theirs])
    with pytest.raises(StoreUnusable, match="refused"):
        a.register_key(NodeKey.generate("sw", "c"))  # nor claim a node id of its own making
    # ... and compacts its own files (writes its merged file, deletes its inputs).
    report = a.compact(["a"], before=datetime(2100, 1, 1, tzinfo=UTC).date())
    assert report.files_in == 2 and report.files_out == 1
    assert open_ledger(url, creds["b"]).query("SELECT count(*) FROM rollouts").item() == 8
    # Its signed reports (a manifest, an evaluation) and their signatures, and the
    # collection of its own old change-log markers, are all within its credentials.
    a.write_manifest(
        NodeManifest.for_node(
            swarm_id="sw", node_id="a", experiment=None, local_groups=2, external_groups=2,
            policy=parse_policy({"kind": "paper"}), model_id="m", seed=0,
        )
    )  # fmt: skip
    row = {"task": "chain_sum", "questions": 2, "completions": 2, "correct": 1.0,
           "accuracy": 0.5, "policy_version": 0, "eval_seed": 1}  # fmt: skip
    a.write_evaluation("sw", "a", 0, [row])
    b = open_ledger(url, creds["b"])
    assert b.query("SELECT count(*) FROM manifests").item() == 1
    assert b.query("SELECT accuracy FROM evaluations").item() == 0.5
    assert b.validate().clean
    assert a.collect_markers(now=time.time() + 3 * 3600) > 0


def test_a_swarm_whose_credentials_cannot_write_stops_before_any_model_loads(creds, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    # Node a's credentials may write swarm sw's places only: a swarm named otherwise is
    # refused at the launcher's pre-flight, in one line, before a node process starts.
    args = ["swarm", "--workdir", str(tmp_path), "--set", "swarm_id=other"]
    args += ["--set", "ledger.url=s3://swarm/ledger"]
    for name, value in creds["a"].items():
        args += ["--set", f"ledger.storage_options.{name}={value}"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2, out.output
    assert out.output.startswith("error: cannot use the ledger at s3://swarm/ledger: ")
    assert "refused" in out.output and "check the credentials" in out.output
    assert len(out.output.strip().splitlines()) == 1 and not (tmp_path / "nodes").exists()
