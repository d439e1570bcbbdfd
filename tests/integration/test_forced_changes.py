"""A node resumed with another configuration (`--force`) is recorded round by round where a
user reads it (issue 61: MLflow's params, the manifests and the `swarm_nodes` dashboard said
`paper` while the node drew with `reward_filtered`, and `sapo compare` credited
`reward_filtered` with every round)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dashboards
from flows.node.runtime import CONFIG_CHANGES_TAG, config_change_tags
from flows.tracking import open_tracker
from ledger import Ledger, NodeManifest, parse_policy
from tests.factories import T0, round_rows


def declared(policy: str, when_s: int) -> NodeManifest:
    return NodeManifest.for_node(
        swarm_id="sw", node_id="n1", experiment=None, local_groups=2, external_groups=2,
        policy=parse_policy(policy), model_id="tiny", seed=0,
        written_at=T0 + timedelta(seconds=when_s),
    )  # fmt: skip


def test_the_ledger_reads_each_configuration_from_the_round_it_began(tmp_path: Path):
    """Rounds 0-1 under `paper`; resumed with `reward_filtered`, rounds 2-3. `manifests`
    keeps the first (no later write rewrites it); `manifest_revisions` has both with the
    round each began; `swarm_nodes` lists them in order."""
    with Ledger.open(str(tmp_path / "ledger")) as led:
        led.write_manifest(declared("paper", -60))
        for node_round in (0, 1):
            led.publish(round_rows("n1", node_round, [[1, 0]]))  # stamped T0 + round minutes
        led.write_manifest(declared("reward_filtered", 90))  # after round 1's rows
        for node_round in (2, 3):
            led.publish(round_rows("n1", node_round, [[1, 0]]))
        first = led.query("SELECT policy, revisions FROM manifests").rows()
        revisions = led.query(
            "SELECT revision, policy, from_round FROM manifest_revisions ORDER BY revision"
        ).rows()
        nodes = led.query(dashboards.runnable("swarm_nodes"))
    assert first == [("paper", 2)]
    assert revisions == [(1, "paper", 0), (2, "reward_filtered", 2)]
    assert nodes["configurations"].to_list() == [
        "2/2 paper from round 0; 2/2 reward_filtered from round 2"
    ]


def test_mlflow_records_the_change_and_the_round_it_applies_from(tmp_path: Path):
    tracker = open_tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "sw", str(tmp_path / "art"))
    params = {"sampling.kind": "paper", "grpo.learning_rate": "1e-05"}
    run_id = tracker.run("n1", {"sapo.node_id": "n1"}, params)
    assert run_id is not None
    assert config_change_tags(tracker, run_id, params, 2) == {}  # the same: nothing
    forced = {**params, "sampling.kind": "reward_filtered"}
    tags = config_change_tags(tracker, run_id, forced, 2)
    assert tags == {
        CONFIG_CHANGES_TAG: "from round 2: sampling.kind: paper -> reward_filtered",
        "sapo.sampling_policy": "paper→reward_filtered",
    }
    tracker.set_tags(run_id, tags)
    again = config_change_tags(tracker, run_id, forced, 2)  # resumed again, same change
    assert again == tags
    assert config_change_tags(tracker, run_id, forced, 3) == tags  # no line a resume
    later = config_change_tags(tracker, run_id, {**forced, "grpo.learning_rate": "2e-05"}, 5)
    assert later[CONFIG_CHANGES_TAG].splitlines() == [
        "from round 2: sampling.kind: paper -> reward_filtered",
        "from round 5: grpo.learning_rate: 1e-05 -> 2e-05; sampling.kind: paper -> reward_filtered",
    ]
