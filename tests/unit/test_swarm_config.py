"""The swarm file: typed, resolved once, and every mistake one line naming its key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from flows.config import (
    NODE_LISTING_STALENESS_S,
    ConfigError,
    NodeSpec,
    SwarmConfig,
    load_swarm,
    swarm_yaml,
)
from ledger import LedgerConfig, RewardFilteredPolicy, VarianceWeightedPolicy
from sapo_core.config import NodeConfig

SWARM = {
    "swarm_id": "typed",
    "workdir": "/tmp/sapo-typed",
    "sampling": {"kind": "reward_filtered", "max_per_peer": 2},
    "defaults": {"local_groups": 3, "external_groups": 1, "grpo": {"learning_rate": 1e-5}},
    "nodes": [
        {"node_id": "a", "seed": 0},
        {"node_id": "b", "seed": 1, "grpo": {"beta": 0.04}, "sampling": {"min_mean_reward": 0.2}},
        {"node_id": "c", "seed": 2, "sampling": {"kind": "variance_weighted", "min_std": 0.1}},
    ],
}


def test_nodes_ledger_and_policies_are_typed_and_merged_once() -> None:
    cfg = load_swarm(text=yaml.safe_dump(SWARM))
    assert isinstance(cfg.ledger, LedgerConfig)
    assert all(isinstance(s, NodeSpec) and isinstance(s.node, NodeConfig) for s in cfg.nodes)
    a, b, c = cfg.nodes
    assert (a.node.local_groups, a.node.external_groups) == (3, 1)
    assert a.node.grpo.learning_rate == b.node.grpo.learning_rate == 1e-5  # deep merge
    assert (a.node.grpo.beta, b.node.grpo.beta) == (0.0, 0.04)
    assert a.sampling == RewardFilteredPolicy(max_per_peer=2)
    assert b.sampling == RewardFilteredPolicy(max_per_peer=2, min_mean_reward=0.2)
    # Another kind does not inherit the swarm policy's parameters.
    assert c.sampling == VarianceWeightedPolicy(min_std=0.1)
    assert cfg.node("b") is b
    with pytest.raises(ConfigError, match="no node 'z'"):
        cfg.node("z")


def test_defaults_live_in_one_place() -> None:
    cfg = load_swarm(text="swarm_id: s\nworkdir: /tmp/sapo-one\n")
    # A swarm's nodes reuse a listing for a few seconds; a reader outside one always lists.
    assert cfg.ledger.max_staleness_s == NODE_LISTING_STALENESS_S > 0
    assert LedgerConfig().max_staleness_s == 0
    set_here = load_swarm(text="swarm_id: s\nledger: {max_staleness_s: 0}\n")
    assert set_here.ledger.max_staleness_s == 0
    assert cfg.ledger.url == "/tmp/sapo-one/ledger"  # under the workdir unless set
    assert [s.node_id for s in cfg.nodes] == ["node-0", "node-1", "node-2"]
    assert cfg.workdir == Path("/tmp/sapo-one") and cfg.workdir.is_absolute()
    relative = load_swarm(text="workdir: here\n")
    assert relative.workdir == Path.cwd() / "here"  # node processes run from anywhere


def test_resolved_yaml_round_trips(tmp_path: Path) -> None:
    cfg = load_swarm(text=yaml.safe_dump(SWARM), rounds=7, nodes=2)
    again = load_swarm(text=swarm_yaml(cfg))
    assert again == cfg
    assert again.rounds == 7 and [s.node_id for s in again.nodes] == ["a", "b"]
    assert "defaults" not in yaml.safe_load(swarm_yaml(cfg))  # resolved: nothing left to merge


def test_flags_beat_overrides_beat_the_file() -> None:
    cfg = load_swarm(text=yaml.safe_dump(SWARM), overrides=["rounds=5", "nodes.1.seed=9"], rounds=6)
    assert cfg.rounds == 6 and cfg.nodes[1].node.seed == 9


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"defaults": {"grpo": {"learning_rat": 1e-5}}}, ": defaults.grpo.learning_rat:"),
        ({"rounds": "many"}, "rounds"),
        ({"defaults": {"grpo": {"learning_rate": -1}}}, ": defaults.grpo.learning_rate:"),
        (
            {"nodes": [{"node_id": "a", "grpo": {"beta": -1}}]},
            ": nodes.0.grpo.beta:",  # set in the node's own entry: named there
        ),
        ({"ledger": {"max_staleness_s": -1}}, "ledger.max_staleness_s"),
        (
            {"sampling": {"kind": "reward_filtered", "max_per_peer": 0}},
            ": sampling.max_per_peer:",
        ),
        ({"colour": "blue"}, "colour"),
        ({"defaults": {"sampling": {"kind": "paper"}}}, "defaults.sampling"),
        ({"node_count": 2}, "node_count"),  # and a list of nodes: which one?
    ],
)
def test_a_bad_key_is_one_line_naming_it(change: dict, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_swarm(text=yaml.safe_dump({**SWARM, **change}))
    message = str(caught.value)
    assert "\n" not in message and key in message, message


@pytest.mark.parametrize(
    "change",
    [
        {"nodes": [{"node_id": "a.b"}]},
        {"swarm_id": "sw.1"},
        {"experiment": "e.x"},
        {"swarm_id": "x" * 129},
        {"nodes": [{"node_id": "has space"}]},
    ],
)
def test_ids_follow_the_ledgers_one_rule_when_the_file_loads(change: dict) -> None:
    # A node whose id its ledger refuses would pass here and fail at its start; and the
    # rule is the ledger's, not a second pattern beside it.
    from ledger.schema import check_id

    (field, value), *_ = change.items()
    bad = value[0]["node_id"] if field == "nodes" else value
    with pytest.raises(ValueError):
        check_id(field, bad)
    with pytest.raises(ConfigError, match="no dots"):
        load_swarm(text=yaml.safe_dump({**SWARM, **change}))


def test_ids_too_long_together_for_the_rollout_ids_fail_at_load() -> None:
    # Each id alone is legal (128 characters at most), but a rollout id joins them.
    with pytest.raises(ConfigError, match="too long together"):
        load_swarm(
            text=yaml.safe_dump({**SWARM, "swarm_id": "s" * 64, "nodes": [{"node_id": "n" * 60}]})
        )
    load_swarm(
        text=yaml.safe_dump({**SWARM, "swarm_id": "s" * 40, "nodes": [{"node_id": "n" * 40}]})
    )


def test_an_experiments_name_follows_the_same_rule(tmp_path: Path) -> None:
    from flows.experiments.sweep import load_experiment

    path = tmp_path / "exp.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "experiment": "paper.cpu",
                "configurations": [{"local_groups": 1, "external_groups": 0}],
            }
        )
    )
    with pytest.raises(ConfigError, match="no dots"):
        load_experiment(path)


def test_node_ids_must_not_repeat() -> None:
    nodes = [{"node_id": "a"}, {"node_id": "a", "seed": 1}]
    with pytest.raises(ConfigError, match="node ids repeat"):
        load_swarm(text=yaml.safe_dump({"nodes": nodes}))


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({**SWARM, "defaults": {"grpo": {"learning_rat": 1}}}))
    broken = tmp_path / "broken.yaml"
    broken.write_text("swarm_id: [unclosed\n")
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(
        yaml.safe_dump(
            {
                "experiment": "e",
                "workdir": str(tmp_path / "e"),
                "swarm": {"rounds": 0},
                "configurations": [{"local_groups": 1, "external_groups": 0}],
            }
        )
    )
    return {"unknown": unknown, "broken": broken, "experiment": experiment}


@pytest.mark.parametrize(
    "command",
    [
        ["swarm"],
        ["node", "--node-id", "a"],
        ["deploy", "--serve", "--interval", "30"],
    ],
)
def test_every_command_refuses_a_bad_swarm_file_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    files = _bad_files(tmp_path)
    for name, expected in (("unknown", "learning_rat"), ("broken", "not valid YAML")):
        result = CliRunner().invoke(app, [*command, "-c", str(files[name])])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0] and str(files[name]) in lines[0], lines
    assert not (tmp_path / "sapo-typed").exists()  # nothing started


def test_experiment_refuses_a_bad_swarm_in_one_line(tmp_path: Path) -> None:
    path = _bad_files(tmp_path)["experiment"]
    result = CliRunner().invoke(app, ["experiment", "-c", str(path), "--dry-run"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "rounds" in lines[0], lines


def test_swarm_config_needs_at_least_one_node() -> None:
    with pytest.raises(ConfigError, match="node_count"):
        load_swarm(text="node_count: 0\n")
    assert len(SwarmConfig.model_validate({"node_count": 2}).nodes) == 2


def test_experiment_with_malformed_nodes_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad-nodes.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "experiment": "e",
                "workdir": str(tmp_path / "e"),
                "swarm": {"nodes": [1]},
                "configurations": [{"local_groups": 1, "external_groups": 0}],
            }
        )
    )
    result = CliRunner().invoke(app, ["experiment", "-c", str(path), "--dry-run"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "swarm.nodes" in lines[0], lines


def test_a_bad_value_given_with_set_is_blamed_on_set_not_on_the_file() -> None:
    with pytest.raises(ConfigError) as raised:
        load_swarm(None, ["defaults.grpo.learning_rate=abc"])
    assert str(raised.value) == (
        "--set: defaults.grpo.learning_rate: Input should be a valid number, unable to parse "
        "string as a number; got 'abc'"
    )
    with pytest.raises(ConfigError) as from_file:
        load_swarm(None, ["swarm_id=x"], text="rounds: 0\nnodes: [{node_id: a, model: m}]\n")
    assert str(from_file.value).startswith("swarm text: rounds: ")


def test_a_swarm_without_a_workdir_takes_the_default_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded swarm names no workdir (issue 59 wrote it once, in ledger.config): the
    default must be resolved as a given one is, or MLflow's artifact URI cannot be built
    (`sapo demo` failed: "relative path can't be expressed as a file URI")."""
    from flows.config import load_swarm
    from ledger.config import DEFAULT_WORKDIR

    monkeypatch.chdir(tmp_path)
    swarm = load_swarm(text="swarm_id: s\nnode_count: 2\n")
    assert swarm.workdir == tmp_path / DEFAULT_WORKDIR
    assert swarm.ledger.url == str(tmp_path / DEFAULT_WORKDIR / "ledger")
    assert swarm.artifact_location() == (tmp_path / DEFAULT_WORKDIR / "mlartifacts").as_uri()
