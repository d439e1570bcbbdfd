"""Resuming honestly: a finished swarm says so and does nothing; a node whose configuration
changed since its checkpoint is not resumed without --force."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from flows.cli.swarm import check_resume
from flows.config import load_swarm
from flows.env import CHECKED_ENV
from flows.node import lifecycle, steps
from flows.node.lifecycle import node_config
from flows.node.runtime import node_key, open_node
from flows.node.state import RoundState
from ledger import Ledger
from tests.tiny_models import build_tiny_model

runner = CliRunner()
OLD = ["defaults.grpo.learning_rate=1e-5"]


def checkpoint_at(
    workdir: Path, node_id: str, next_round: int, config: dict[str, str], registered: bool = True
) -> None:
    """A node's checkpoint as `flows.node.checkpoint.write` leaves it (its state; no weights are
    read before a resume is allowed), and its key in the embedded swarm's ledger under
    ``workdir``, as the node registered it before its first round (unless not
    ``registered``: a ledger that never saw the node)."""
    path = workdir / "nodes" / node_id / "checkpoints" / f"round-{next_round:06d}"
    path.mkdir(parents=True)
    state = {"next_round": next_round, "policy_version": next_round, "config": config}
    (path / "state.json").write_text(json.dumps(state))
    if registered:
        swarm = load_swarm(None, [], workdir=workdir)
        key = node_key(swarm, node_id)
        with Ledger(swarm.ledger, signer=key) as ledger:
            ledger.register_key(key)


def one_node_swarm(tmp_path: Path, model: Path, swarm_id: str, learning_rate: float = 1e-5) -> str:
    """A swarm file's text: one node on a tiny model, two rounds, checkpointed each round."""
    return yaml.safe_dump(
        {
            "swarm_id": swarm_id,
            "workdir": str(tmp_path / "work"),
            "rounds": 2,
            "checkpoint_every": 1,
            "tracking": {"enabled": False},
            "defaults": {
                "model": str(model),
                "local_groups": 1,
                "tasks": {"specs": [{"name": "chain_sum", "config": {"max_terms": 2}}]},
                "generation": {"completions_per_question": 2, "max_new_tokens": 3},
                "grpo": {"learning_rate": learning_rate},
            },
            "nodes": [{"node_id": "n", "seed": 0}],
        }
    )


def test_a_node_resumed_with_another_configuration_is_refused_unless_forced(tmp_path, capsys):
    old = load_swarm(None, OLD, nodes=2, rounds=4, workdir=tmp_path)
    checkpoint_at(tmp_path, "node-0", 2, node_config(old.node("node-0")))
    changed = ["--set", "defaults.grpo.learning_rate=2e-5"]
    args = ["node", "--node-id", "node-0", "--workdir", str(tmp_path), *changed]
    out = runner.invoke(app, [*args, "--rounds", "4"])
    assert out.exit_code == 2
    assert out.output.strip() == (
        "error: checkpoints made with another configuration (node-0: grpo.learning_rate: "
        "1e-05 -> 2e-05). Rerun with --force (or SAPO_RESUME_FORCE=1) to resume with this "
        "one, or use another --workdir to start afresh"
    )
    # Every node that changed is named, once per distinct change.
    checkpoint_at(tmp_path, "node-1", 2, node_config(old.node("node-1")))
    both = runner.invoke(app, ["swarm", "--nodes", "2", "--workdir", str(tmp_path), *changed])
    assert both.exit_code == 2
    assert "(node-0, node-1: grpo.learning_rate: 1e-05 -> 2e-05)" in both.output
    # Only the number of rounds may change freely; --force accepts the rest, and says so.
    again = load_swarm(None, OLD, nodes=2, rounds=9, workdir=tmp_path)
    check_resume(again, ["node-0", "node-1"], force=False)
    new = load_swarm(None, changed[1:], nodes=2, rounds=4, workdir=tmp_path)
    check_resume(new, ["node-0"], force=True)
    assert "node-0 resume with a changed configuration: grpo.learning_rate" in (
        capsys.readouterr().err
    )


def test_a_changed_policy_is_one_difference_not_each_of_its_defaults(tmp_path: Path) -> None:
    """Issue 61: `--force --set sampling.kind=reward_filtered` listed the new policy's
    defaults as changes (`sampling.min_mean_reward: (unset) -> 0.0`, ...)."""
    from flows.node import checkpoint
    from flows.node.lifecycle import resume_differences

    old = load_swarm(None, nodes=1, rounds=4, workdir=tmp_path)
    checkpoint_at(tmp_path, "node-0", 2, node_config(old.node("node-0")))
    saved = checkpoint.latest(tmp_path, "node-0")
    new = load_swarm(None, ["sampling.kind=reward_filtered"], nodes=1, rounds=4, workdir=tmp_path)
    kind = "sampling.kind: paper -> reward_filtered"
    assert resume_differences(new.node("node-0"), saved) == [kind]
    tuned = ["sampling.kind=reward_filtered", "sampling.min_mean_reward=0.2"]
    new = load_swarm(None, tuned, nodes=1, rounds=4, workdir=tmp_path)
    assert resume_differences(new.node("node-0"), saved) == [
        kind,
        "sampling.min_mean_reward: (unset) -> 0.2",
    ]
    assert resume_differences(old.node("node-0"), saved) == []


def test_a_finished_swarm_says_so_and_refuses_new_nodes(tmp_path):
    cfg = load_swarm(None, nodes=2, rounds=3, workdir=tmp_path)
    for spec in cfg.nodes:
        checkpoint_at(tmp_path, spec.node_id, 3, node_config(spec))
    args = ["swarm", "--nodes", "2", "--rounds", "3", "--workdir", str(tmp_path)]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    first = out.output.splitlines()[0]
    assert first == (
        f"swarm {cfg.swarm_id}: every node has finished its 3 rounds; nothing to do "
        "(--rounds N continues it)"
    )
    assert "registered" not in out.output and not (tmp_path / "mlflow.db").exists()

    # Issue 47: `--nodes 3` on this finished 2-node swarm trained a new node-2 alone,
    # without a word, and registered node-0's model again.
    args = ["swarm", "--nodes", "3", "--rounds", "3", "--workdir", str(tmp_path)]
    more = runner.invoke(app, args)
    assert more.exit_code == 2, more.output
    assert more.output.strip() == (
        f"error: swarm {cfg.swarm_id}: node-0, node-1 finished 3 rounds; node-2 would start "
        "alone after them. Use another --workdir for a new swarm, --nodes 2 for this one, or "
        "--force to add them"
    )
    assert not (tmp_path / "nodes" / "node-2").exists()


def test_a_finished_node_says_so_without_starting_its_flow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: `sapo node` on a finished node started a Prefect server (8-21 s) for a flow
    that then said there was nothing to do."""
    from flows.node import checkpoint
    from flows.node import round as node_round

    cfg = load_swarm(None, nodes=1, rounds=3, workdir=tmp_path)
    checkpoint_at(tmp_path, "node-0", 3, node_config(cfg.node("node-0")))
    checkpoint.mark_finished(tmp_path, "node-0", 3)
    started: list[str] = []
    monkeypatch.setattr(node_round, "node_flow", lambda *a, **k: started.append("flow"))
    out = runner.invoke(app, ["node", "--node-id", "node-0", "--workdir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == "node-0 has finished its 3 rounds" and started == []


def test_a_folder_whose_ledger_is_gone_is_refused_not_told_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 61: after `sapo infra down` deleted the ledger, a worker's old folder told the new
    deployment "node-0 has finished its 3 rounds" against an empty ledger (and resumed an
    unfinished node at its round). The folder is checked against the ledger it serves."""
    from flows.node import checkpoint
    from flows.node import round as node_round

    cfg = load_swarm(None, nodes=2, rounds=3, workdir=tmp_path)
    checkpoint_at(tmp_path, "node-0", 3, node_config(cfg.node("node-0")), registered=False)
    checkpoint.mark_finished(tmp_path, "node-0", 3)
    checkpoint_at(tmp_path, "node-1", 2, node_config(cfg.node("node-1")), registered=False)
    started: list[str] = []
    monkeypatch.setattr(node_round, "node_flow", lambda *a, **k: started.append("flow"))
    for node_id, rounds in (("node-0", 3), ("node-1", 2)):
        args = ["node", "--node-id", node_id, "--workdir", str(tmp_path)]
        out = runner.invoke(app, args)
        assert out.exit_code == 2, out.output
        assert out.output.startswith(
            f"error: {node_id}'s folder {tmp_path / 'nodes' / node_id} holds {rounds} rounds "
            f"of swarm {cfg.swarm_id}, but the ledger at {tmp_path / 'ledger'} has never seen "
            f"{node_id}"
        )
    assert started == []
    swarm = runner.invoke(app, ["swarm", "--nodes", "2", "--workdir", str(tmp_path)])
    assert swarm.exit_code == 2 and "node-0's folder" in swarm.output, swarm.output
    # Rows it has not published yet (its backlog) are no sign of another ledger.
    backlog = tmp_path / "nodes" / "node-1" / "backlog"
    backlog.mkdir()
    (backlog / "r00000001-rollouts.parquet").write_bytes(b"")
    # One start asks once: `decide` checks, and its resume check does not check again.
    real, asked = lifecycle.ledger_problem, []
    monkeypatch.setattr(lifecycle, "ledger_problem", lambda *a: asked.append(a) or real(*a))
    start = lifecycle.decide(cfg, "node-1")
    assert start.refusal is None and len(asked) == 1
    # and a node process whose launcher checked this checkpoint (the ledger too) asks not at all
    monkeypatch.setenv(CHECKED_ENV, lifecycle.checked_marker(start.saved))
    assert lifecycle.decide(cfg, "node-1").checked_by_launcher and len(asked) == 1


def test_a_deployed_run_refuses_a_changed_configuration_as_the_cli_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: a deployment's run (`node_flow`, its swarm passed as text) resumed a node
    whose configuration had changed since its checkpoint, without a word."""
    from flows.node.round import node_flow

    model = build_tiny_model(tmp_path / "model")

    def text(learning_rate: float) -> str:
        return one_node_swarm(tmp_path, model, "deployed", learning_rate)

    first = load_swarm(text=text(1e-5))
    node = open_node(first, "n")
    try:
        steps.run_round(node, RoundState(0, last=True))  # checkpointed: next round 1
    finally:
        node.close()

    monkeypatch.delenv("SAPO_RESUME_FORCE", raising=False)
    with pytest.raises(RuntimeError) as refused:  # lifecycle.ResumeRefused
        node_flow.fn("n", swarm_text=text(2e-5), more_rounds=1, until_round=1)
    assert str(refused.value).startswith(
        "checkpoints made with another configuration (n: grpo.learning_rate: 1e-05 -> 2e-05)"
    )
    # The same configuration resumes; so does the changed one where the worker forces it.
    assert node_flow.fn("n", swarm_text=text(1e-5), until_round=1)["rounds"] == []
    monkeypatch.setenv("SAPO_RESUME_FORCE", "1")
    assert node_flow.fn("n", swarm_text=text(2e-5), until_round=1)["rounds"] == []


def test_a_resumed_node_reads_its_checkpoint_and_resolves_its_model_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: a node's start read its newest checkpoint five times (the flow, each check,
    the learner) and resolved its model twice on a resume. Now the start reads it once, and
    the run's end once more (to log and keep its final model)."""
    from flows.node import checkpoint
    from flows.node.round import node_flow
    from sapo_core import learner as learner_module

    model = build_tiny_model(tmp_path / "model")
    text = one_node_swarm(tmp_path, model, "once")
    assert len(node_flow.fn("n", swarm_text=text, until_round=1)["rounds"]) == 1

    reads: list[str] = []
    resolved: list[str] = []
    latest, resolve_model = checkpoint.latest, learner_module.resolve_model

    def counted_latest(workdir: Path, node_id: str) -> checkpoint.Checkpoint | None:
        reads.append(node_id)
        return latest(workdir, node_id)

    def counted_resolve(model: str) -> object:
        resolved.append(model)
        return resolve_model(model)

    monkeypatch.setattr(checkpoint, "latest", counted_latest)
    monkeypatch.setattr(learner_module, "resolve_model", counted_resolve)
    ran = node_flow.fn("n", swarm_text=text)  # resumes at round 1, runs it, finishes
    assert len(ran["rounds"]) == 1
    assert reads == ["n", "n"]  # the start, then the finish
    assert resolved == [str(model)]


def test_a_resumed_node_draws_what_it_would_have_drawn(tmp_path: Path) -> None:
    """Issue 57: a node's draw is keyed by a secret from its key, kept in its workdir, so a
    node stopped and opened again draws, over the same ledger, the groups it would have
    drawn; the draw is neither the public one of its seed nor another node's."""
    from ledger import NodeKey
    from ledger.draws import public_draw_key
    from sapo_core.learner import round_seed
    from sapo_core.reputation import PeerEvidence
    from tests.factories import open_ledger, round_rows

    model = build_tiny_model(tmp_path / "model")
    text = one_node_swarm(tmp_path, model, "drawn")
    swarm = load_swarm(text=text, overrides=["defaults.external_groups=2"])
    peer = NodeKey.generate("drawn", "p")
    led = open_ledger(str(swarm.ledger.url), signer=peer)
    led.register_key(peer)
    for r in range(3):
        led.publish(round_rows("p", r, [[1, 0]] * 6, swarm_id="drawn", task="chain_sum"))

    def draw(swarm: object, round_: int) -> tuple[str, list[str]]:
        node = open_node(swarm, "n")  # type: ignore[arg-type]
        try:
            request = steps.draw_request(node, round_)
            assert request.draw_key is not None
            return request.draw_key, node.ledger.draw_group_ids(request)
        finally:
            node.close()

    key, drawn = draw(swarm, 3)
    assert len(drawn) == 2 and key != public_draw_key("n", round_seed(0, 3))
    assert draw(swarm, 3) == (key, drawn)  # opened again: the same key, the same groups
    assert draw(swarm, 4)[0] != key  # a new key every round
    # The draw asks with the learner's reputation, which only its checkpoints keep: what a
    # node learned of its peers after its last checkpoint is gone with its process, so a
    # node opened again draws as before (and will count those verdicts once, again).
    node = open_node(swarm, "n")
    try:
        node.learner.reputation.update({"p": PeerEvidence(rows=16)})
        assert steps.draw_request(node, 4).known_nodes == ("p",)
    finally:
        node.close()
    assert draw(swarm, 3) == (key, drawn)
    # A node of the same name in another workdir has another key.
    elsewhere = load_swarm(
        text=text, overrides=["defaults.external_groups=2"], workdir=tmp_path / "elsewhere"
    )
    assert draw(elsewhere, 3)[0] != key
