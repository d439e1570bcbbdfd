"""What a node writes, where a user looks (issue 47): each round, a node's MLflow run gets a
small table of sample completions, its own and the peers' it trained on, with the prompt
and this node's reward, so the MLflow UI shows text and not only scalars."""

from __future__ import annotations

from pathlib import Path

from flows.node.runtime import open_node
from tests.integration.test_round_steps import make_swarm, run_round


def test_each_round_logs_a_table_of_own_and_peer_completions(tmp_path: Path) -> None:
    import mlflow

    swarm = make_swarm(tmp_path, tracking={"enabled": True})
    a, b = open_node(swarm, "a"), open_node(swarm, "b")
    try:
        run_round(a, 0)  # a publishes; b then draws a peer group of a's
        run_round(b, 0)
        assert b.run is not None
        run_id = b.run.run_id
    finally:
        a.close()
        b.close()
    mlflow.set_tracking_uri(swarm.tracking_uri())  # load_table searches through it
    client = mlflow.MlflowClient(swarm.tracking_uri())
    experiment = client.get_run(run_id).info.experiment_id
    table = client.load_table(experiment, "completions/round-0000.json", run_ids=[run_id])
    rows = table.to_dict("records")
    assert {r["origin"] for r in rows} == {"own", "peer"}
    assert {r["publisher"] for r in rows if r["origin"] == "peer"} == {"a"}
    assert {r["publisher"] for r in rows if r["origin"] == "own"} == {"b"}
    assert all(r["round"] == 0 and r["question"] and 0 <= r["reward"] <= 1 for r in rows), rows
    # Two groups of each origin at most, each of the node's G completions.
    group_size = swarm.node("b").node.generation.completions_per_question
    assert len(rows) <= 2 * 2 * group_size and len(rows) % group_size == 0


def test_a_round_logged_again_replaces_its_table(tmp_path: Path) -> None:
    """A resumed node replays its round, or a retry follows an upload that went through: the
    round's table is then the last one logged, not both (MLflow's log_table appends)."""
    import mlflow

    from flows.tracking import open_tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = open_tracker(uri, "tables", str(tmp_path / "artifacts"))
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    first = [{"round": 3, "completion": "twelve", "reward": 0.0}] * 2
    again = [{"round": 3, "completion": f"forty-{k}", "reward": 1.0} for k in range(3)]
    for rows in (first, again, again):
        tracker.log_table(run_id, rows, "completions/round-0003.json")
    tracker.log_table(run_id, first, "completions/round-0004.json")
    mlflow.set_tracking_uri(uri)  # load_table searches through it
    client = mlflow.MlflowClient(uri)
    table = client.load_table(tracker.experiment_id, "completions/round-0003.json", [run_id])
    assert table.to_dict("records") == again
    other = client.load_table(tracker.experiment_id, "completions/round-0004.json", [run_id])
    assert other.to_dict("records") == first
