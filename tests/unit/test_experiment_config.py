"""The sweep's configuration: only sharing varies, and every configuration is a valid swarm."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from flows.cli import app
from flows.experiments.plan import format_plan, plan
from flows.experiments.progress import record_progress, run_state, wall_label, wall_times
from flows.experiments.sweep import ExperimentConfig, load_experiment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

BASE: dict[str, Any] = {
    "experiment": "sweep",
    "workdir": "/tmp/sapo-sweep-test",
    "swarm": {
        "rounds": 3,
        "defaults": {"model": "some/model", "generation": {"completions_per_question": 4}},
        "node_count": 2,
    },
    "configurations": [
        {"local_groups": 4, "external_groups": 0},
        {"local_groups": 2, "external_groups": 2},
        {"local_groups": 2, "external_groups": 2, "sampling": {"kind": "variance_weighted"}},
    ],
}


def make(**changes: Any) -> ExperimentConfig:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return ExperimentConfig.model_validate(data)


def test_each_configuration_is_its_own_swarm_sharing_ledger_and_mlflow() -> None:
    exp = make()
    ids = [exp.swarm_id(c) for c in exp.configurations]
    assert ids == ["sweep-4x0", "sweep-2x2", "sweep-2x2-variance-weighted"]
    swarms = [exp.swarm_config(c) for c in exp.configurations]
    assert {s.ledger.url for s in swarms} == {"/tmp/sapo-sweep-test/ledger"}
    assert {s.tracking_uri() for s in swarms} == {"sqlite:////tmp/sapo-sweep-test/mlflow.db"}
    assert {s.tracking.experiment for s in swarms} == {"sweep"}
    # The experiment is data in each swarm's config (nodes write it into their manifests).
    assert {s.experiment for s in swarms} == {"sweep"}
    assert len({s.workdir for s in swarms}) == 3  # checkpoints never collide
    specs = [s.nodes for s in swarms]
    assert [(n.node.local_groups, n.node.external_groups) for n in (s[0] for s in specs)] == [
        (4, 0), (2, 2), (2, 2)
    ]  # fmt: skip
    assert specs[2][1].sampling.kind == "variance_weighted"
    assert specs[1][1].sampling.kind == "paper"
    # Seeds, models and generation are the same node by node in every configuration.
    for a, b in zip(specs[0], specs[1], strict=True):
        assert a.node.seed == b.node.seed and a.node.model == b.node.model
        assert a.node.questions == b.node.questions == 4
        assert a.node.generation == b.node.generation


def test_only_sharing_may_vary() -> None:
    with pytest.raises(ValidationError, match="I \\+ J differs"):
        make(configurations=[{"local_groups": 4, "external_groups": 0},
                             {"local_groups": 4, "external_groups": 2}])  # fmt: skip
    swarm = copy.deepcopy(BASE["swarm"])
    swarm["nodes"] = [{"node_id": "a", "external_groups": 3}]
    with pytest.raises(ValidationError, match="only the configurations vary"):
        make(swarm=swarm)
    with pytest.raises(ValidationError, match=r"swarm\.swarm_id is set per configuration"):
        make(swarm={**BASE["swarm"], "swarm_id": "x"})
    with pytest.raises(ValidationError, match=r"swarm\.experiment is set per configuration"):
        make(swarm={**BASE["swarm"], "experiment": "other"})
    with pytest.raises(ValidationError, match="the same"):
        make(configurations=[{"local_groups": 2, "external_groups": 2}] * 2)
    with pytest.raises(ValidationError, match="extra"):
        make(configurations=[{"local_groups": 2, "external_groups": 2, "model": "other"}])
    bad_policy = {"local_groups": 2, "external_groups": 2, "sampling": {"kind": "nope"}}
    with pytest.raises(ValidationError):
        make(configurations=[bad_policy])


def test_plan_lists_configurations_and_rollouts() -> None:
    exp = make()
    rows = plan(exp)
    # named as the report names them: a policy of its own is in the name
    assert [r["configuration"] for r in rows] == ["4/0", "2/2", "2/2-variance-weighted"]
    assert [r["configuration"] for r in rows] == [c for c, _ in exp.replicates().values()]
    assert rows[2]["policy"] == "variance_weighted"
    assert all(r["rollouts"] == 2 * 3 * 4 * 4 and not r["done"] for r in rows)
    assert "sweep-2x2-variance-weighted" in format_plan(make())


@pytest.mark.parametrize(
    "name",
    [
        "paper.yaml",
        "paper-cpu.yaml",
        "paper-table-cpu.yaml",
        "compute-matched-cpu.yaml",
        "offpolicy-pilot-cpu.yaml",
        "offpolicy-cpu.yaml",
    ],
)
def test_shipped_sweeps_pass_dry_run(name: str) -> None:
    result = CliRunner().invoke(app, ["experiment", "-c", str(EXAMPLES / name), "--dry-run"])
    assert result.exit_code == 0, result.output
    exp = load_experiment(EXAMPLES / name)
    for swarm_id in (exp.swarm_id(c) for c in exp.configurations):
        assert swarm_id in result.output
    assert not (exp.workdir_path() / "ledger").exists()  # nothing ran


def test_paper_sweep_is_the_papers_design() -> None:
    exp = load_experiment(EXAMPLES / "paper.yaml")
    assert [c.label for c in exp.configurations] == ["8/0", "6/2", "4/4", "2/6"]
    swarm = exp.swarm_config(exp.configurations[2])
    node = swarm.nodes[0].node
    assert len(swarm.nodes) == 8 and swarm.rounds == 2000
    assert node.model.startswith("Qwen/Qwen2.5-0.5B")
    assert len(node.tasks.specs) == 9 and node.generation.completions_per_question == 8
    assert (node.grpo.beta, node.grpo.eps_low, node.grpo.eps_high) == (0.0, 0.2, 0.28)


def test_paper_table_sweep_is_fixed_as_its_file_says() -> None:
    exp = load_experiment(EXAMPLES / "paper-table-cpu.yaml")
    labels = [exp.label(c) for c in exp.configurations]
    assert labels == ["4/0", "3/1", "2/2", "1/3", "1/3-fresh"]
    assert exp.seeds == list(range(8)) and exp.baseline_label() == "4/0"
    swarm = exp.swarm_config(exp.configurations[4], 7)
    node = swarm.nodes[0].node
    assert swarm.rounds == 12 and len(swarm.nodes) == 3
    assert {s.sampling.kind for s in swarm.nodes} == {"fresh"}
    assert node.generation.backend == "transformers" and node.questions == 4
    assert node.evaluation.due(12, 12) and node.evaluation.due(6, 12)


def test_progress_file_says_where_a_sweep_stands(tmp_path: Path) -> None:
    exp = make(workdir=str(tmp_path), seeds=[0, 1])
    first, second = exp.swarm_id(exp.configurations[0], 0), exp.swarm_id(exp.configurations[1], 0)
    record_progress(exp, first, "started")
    record_progress(exp, first, "finished", failed=0)
    path = record_progress(exp, second, "started")
    progress = json.loads(path.read_text())
    assert progress["summary"].startswith("1 of 6 runs done")
    run = progress["runs"][first]
    assert (run["configuration"], run["seed"], run["state"]) == ("4/0", 0, "finished")
    assert [e["event"] for e in run["events"]] == ["started", "finished"]
    assert progress["runs"][second]["state"] == "started"
    assert (run_state(exp, first), run_state(exp, second), run_state(exp, "x")) == (
        "finished", "started", None
    )  # fmt: skip
    for torn in ("{not json", '{"runs": {"x": 1}}', "[]", '{"runs": []}'):  # not a crash
        path.write_text(torn)
        assert run_state(exp, first) is None and run_state(exp, "x") is None
        summary = json.loads(record_progress(exp, first, "skipped").read_text())["summary"]
        assert summary.startswith("1 of 6")
    # Another experiment in the same working directory keeps a file of its own.
    other = make(workdir=str(tmp_path), experiment="other", seeds=[0])
    second_file = record_progress(other, other.swarm_id(other.configurations[0], 0), "started")
    assert second_file.name == "progress-other.json" and path.exists()


def test_bad_sweep_is_a_clear_error() -> None:
    result = CliRunner().invoke(
        app,
        [
            "experiment",
            "-c",
            str(EXAMPLES / "paper-cpu.yaml"),
            "--dry-run",
            "--set",
            "configurations.0.external_groups=1",
        ],
    )
    assert result.exit_code == 2
    assert "I + J differs" in result.output
    result = CliRunner().invoke(
        app,
        [
            "experiment",
            "-c",
            str(EXAMPLES / "paper-cpu.yaml"),
            "--dry-run",
            "--set",
            "configurations.1.sampling.kind=variance_weighted",
        ],
    )
    assert result.exit_code == 0 and "paper-cpu-3x1-variance-weighted" in result.output


def test_a_swarm_key_set_on_an_experiment_names_its_place_under_swarm() -> None:
    """`--set defaults.grpo.learning_rate=...` is a swarm file's form; an experiment holds
    its swarm under `swarm:`, and pydantic alone said only 'Extra inputs are not permitted'."""
    sweep = str(EXAMPLES / "paper-cpu.yaml")
    said = CliRunner().invoke(
        app, ["experiment", "-c", sweep, "--dry-run", "--set", "defaults.grpo.learning_rate=1e-5"]
    )
    assert said.exit_code == 2
    assert "--set swarm.defaults.grpo.learning_rate=1e-5" in said.output
    moved = load_experiment(EXAMPLES / "paper-cpu.yaml", ["swarm.rounds=3", "baseline=2/2"])
    assert moved.swarm["rounds"] == 3 and moved.baseline_label() == "2/2"


def test_seeds_run_every_configuration_once_per_replicate_with_paired_node_seeds() -> None:
    exp = make(seeds=[0, 2])
    runs = exp.runs()
    # Seed by seed, so a stopped experiment holds whole replicates.
    assert [(exp.label(c), s) for c, s in runs] == [
        ("4/0", 0), ("2/2", 0), ("2/2-variance-weighted", 0),
        ("4/0", 2), ("2/2", 2), ("2/2-variance-weighted", 2),
    ]  # fmt: skip
    ids = [exp.swarm_id(c, s) for c, s in runs]
    assert ids[0] == "sweep-4x0-s0" and ids[-1] == "sweep-2x2-variance-weighted-s2"
    assert len(set(ids)) == 6
    seeds = {
        i: [n.node.seed for n in exp.swarm_config(c, s).nodes]
        for i, (c, s) in zip(ids, runs, strict=True)
    }
    assert seeds["sweep-4x0-s0"] == seeds["sweep-2x2-s0"] == [0, 1]
    assert seeds["sweep-4x0-s2"] == seeds["sweep-2x2-variance-weighted-s2"] == [2000, 2001]
    assert exp.replicates()["sweep-2x2-s2"] == ("2/2", 2)
    assert exp.baseline_label() == "4/0"
    assert [r["seed"] for r in plan(exp)] == [0, 0, 0, 2, 2, 2]


def test_listed_nodes_keep_their_own_seeds_shifted_and_bad_seed_lists_are_refused() -> None:
    swarm = copy.deepcopy(BASE["swarm"])
    del swarm["node_count"]
    swarm["nodes"] = [{"node_id": "a", "seed": 7}, {"node_id": "b"}]
    exp = make(swarm=swarm, seeds=[1])
    nodes = exp.swarm_config(exp.configurations[0], 1).nodes
    assert [(n.node_id, n.node.seed) for n in nodes] == [("a", 1007), ("b", 1000)]
    with pytest.raises(ValidationError, match="distinct"):
        make(seeds=[1, 1])
    with pytest.raises(ValidationError, match="baseline"):
        make(baseline="9/9")
    assert make(baseline="2/2").baseline_label() == "2/2"


def test_records_must_be_a_folder_and_a_recorded_run_counts_as_done(tmp_path: Path) -> None:
    path = EXAMPLES / "paper-cpu.yaml"
    not_a_folder = tmp_path / "records"
    not_a_folder.write_text("x")
    args = ["experiment", "-c", str(path), "--dry-run", "--records", str(not_a_folder)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "not a folder" in result.output
    # a report from records that are not there is a mistyped path, not "no rounds"
    missing = tmp_path / "no-such-records"
    args = ["experiment", "-c", str(path), "--report-only", "--records", str(missing)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "no such folder to report from" in result.output
    assert not missing.exists()
    exp = load_experiment(path)
    first = exp.swarm_id(*exp.runs()[0])
    folder = tmp_path / "kept" / first
    folder.mkdir(parents=True)
    (folder / "record.json").write_text("{}")
    done = {r["swarm_id"]: r["done"] for r in plan(exp, tmp_path / "kept")}
    assert done[first] is True and not any(v for k, v in done.items() if k != first)


def test_wall_times_time_the_attempt_that_ended_and_count_the_stopped_ones() -> None:
    def run(*events: tuple[str, str]) -> dict[str, Any]:
        return {"events": [{"event": e, "at": f"2026-12-03T{t}+00:00"} for e, t in events]}

    progress = {"runs": {
        "clean": run(("started", "10:00:00"), ("finished", "10:21:30")),
        # stopped with the session, resumed: only the resumed attempt is timed
        "resumed": run(("started", "11:00:00"), ("started", "12:00:00"), ("finished", "12:06:00")),
        "failed": run(("started", "13:00:00"), ("failed", "13:10:00")),
        "running": run(("started", "14:00:00")),
        "skipped": run(("skipped", "15:00:00")),
        "torn": {"events": "not a list"},
        "stray": {"events": ["not an event", *run(("started", "16:00:00"),
                                                  ("finished", "16:01:00"))["events"]]},
    }}  # fmt: skip
    times = wall_times(progress)
    assert times["clean"] == {"seconds": 1290.0, "attempts": 1, "interrupted": 0}
    assert times["resumed"] == {"seconds": 360.0, "attempts": 2, "interrupted": 1}
    assert times["failed"] == {"seconds": 600.0, "attempts": 1, "interrupted": 0}
    assert times["running"] == {"seconds": None, "attempts": 1, "interrupted": 1}
    assert times["skipped"] == {"seconds": None, "attempts": 0, "interrupted": 0}
    assert "torn" not in times
    assert times["stray"] == {"seconds": 60.0, "attempts": 1, "interrupted": 0}
    labels = {k: wall_label(v) for k, v in times.items() if k != "stray"}
    assert labels == {"clean": "21.5 min", "resumed": "6.0 min (+1 earlier)",
                      "failed": "10.0 min", "running": "unfinished", "skipped": "-"}  # fmt: skip
    # A failed attempt and its rerun: the rerun's minutes, the failure counted.
    rerun = run(("started", "10:00:00"), ("failed", "10:30:00"), ("started", "11:00:00"),
                ("finished", "11:05:00"))  # fmt: skip
    again = wall_times({"runs": {"rerun": rerun}})["rerun"]
    assert again == {"seconds": 300.0, "attempts": 2, "interrupted": 0}
    assert wall_label(again) == "5.0 min (+1 earlier)"
    assert wall_label(None) == "-"


def test_the_plan_shows_each_runs_wall_time_from_the_progress_file(tmp_path: Path) -> None:
    exp = make(workdir=str(tmp_path), seeds=[0])
    first = exp.swarm_id(exp.configurations[0], 0)
    record_progress(exp, first, "started")
    record_progress(exp, first, "finished", failed=0)
    text = format_plan(exp)
    assert "timed runs: 1, 0.0 h in all (last attempts)" in text
    (row,) = [line for line in text.splitlines() if first in line]
    assert row.rstrip().endswith("0.0 min")
    (other,) = [line for line in text.splitlines() if "sweep-2x2-s0" in line]
    assert other.rstrip().endswith("-")
    # what is left, at the timed runs' mean: two runs of 30 and 60 minutes, one done
    second = exp.swarm_id(exp.configurations[1], 0)
    events = {first: [("started", "10:00:00"), ("finished", "10:30:00")],
              second: [("started", "11:00:00"), ("failed", "12:00:00")]}  # fmt: skip
    progress = {"experiment": exp.experiment, "runs": {
        sid: {"events": [{"event": e, "at": f"2026-12-04T{at}+00:00"} for e, at in evs]}
        for sid, evs in events.items()
    }}  # fmt: skip
    (tmp_path / "progress.json").write_text(json.dumps(progress))
    runs = len(exp.runs())
    records = tmp_path / "records"
    (records / first).mkdir(parents=True)
    (records / first / "record.json").write_text("{}")  # counts as done
    head = format_plan(exp, records).splitlines()[0]
    assert f"{runs - 1} of {runs} runs left, about {(runs - 1) * 0.75:.1f} h" in head


def test_the_compute_matched_control_is_a_node_alone_making_more_questions() -> None:
    exp = load_experiment(EXAMPLES / "compute-matched-cpu.yaml")
    labels = [exp.label(c) for c in exp.configurations]
    assert labels == ["4/0", "2/2", "4/0-q8-informative-first"]
    assert exp.baseline_label() == "4/0" and exp.seeds == list(range(12))
    control = exp.configurations[2]
    swarm = exp.swarm_config(control, 3)
    node = swarm.nodes[0].node
    assert (node.local_groups, node.external_groups, node.questions) == (4, 0, 8)
    assert node.local_selection == "informative_first"
    plain = exp.swarm_config(exp.configurations[0], 3).nodes[0].node
    assert (plain.questions, plain.local_selection) == (4, "drawn")
    # what the round-0 pairing check is told: the control draws other own groups by design
    assert exp.own_generation() == {
        "4/0": ((4, 8),) * 3, "2/2": ((4, 8),) * 3, "4/0-q8-informative-first": ((8, 8),) * 3
    }  # fmt: skip
    # and a control with larger groups (issue 58's 4/0-L16) draws other groups as well
    wider = load_experiment(EXAMPLES / "offpolicy-cpu.yaml").own_generation()
    assert wider["4/0-L16"] == ((4, 16),) * 3 and wider["2/2-none"] == ((4, 8),) * 3
    # Only the configurations vary the selection: a node entry may not set it.
    data = copy.deepcopy(exp.model_dump())
    data["swarm"]["nodes"][0]["local_selection"] = "informative_first"
    with pytest.raises(ValidationError, match="only the configurations vary"):
        ExperimentConfig.model_validate(data)


def test_a_fresh_sweeps_dry_run_estimates_its_time(tmp_path: Path) -> None:
    """Issue 47: --dry-run of a sweep never run gave no time at all. The paper-table sweep
    (40 runs), which took about 12 h here, is estimated from the measured cost a rollout."""
    out = CliRunner().invoke(
        app,
        ["experiment", "-c", str(EXAMPLES / "paper-table-cpu.yaml"), "--dry-run",
         "--set", f"workdir={tmp_path}"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    head = out.output.splitlines()[0]
    match = re.search(r"; 40 runs, about ([0-9.]+) h on an idle 2-core CPU machine", head)
    assert match is not None, head
    assert 11.0 <= float(match.group(1)) <= 13.0


def test_a_sweep_may_vary_the_group_size_and_the_off_policy_correction() -> None:
    exp = make(
        configurations=[
            {"local_groups": 4, "external_groups": 0, "completions_per_question": 8},
            {"local_groups": 2, "external_groups": 2, "off_policy": "none"},
            {"local_groups": 2, "external_groups": 2, "off_policy": "token_truncate"},
        ]
    )
    labels = [exp.label(c) for c in exp.configurations]
    assert labels == ["4/0-L8", "2/2-none", "2/2-token-truncate"]
    nodes = [exp.swarm_config(c).nodes[0].node for c in exp.configurations]
    assert [n.generation.completions_per_question for n in nodes] == [8, 4, 4]
    assert [n.grpo.off_policy.correction for n in nodes] == ["none", "none", "token_truncate"]
    with pytest.raises(ValidationError, match="off_policy"):
        make(configurations=[{"local_groups": 2, "external_groups": 2, "off_policy": "bogus"}])
    data = copy.deepcopy(BASE)
    data["swarm"]["nodes"] = [{"node_id": "a", "completions_per_question": 8}]
    with pytest.raises(ValidationError, match="only the configurations vary"):
        ExperimentConfig.model_validate(data)


def test_the_offpolicy_pilot_is_the_paper_table_regime_over_24_rounds() -> None:
    pilot = load_experiment(EXAMPLES / "offpolicy-pilot-cpu.yaml")
    table = load_experiment(EXAMPLES / "paper-table-cpu.yaml")
    assert pilot.swarm["rounds"] == 24 and pilot.seeds == [0]
    assert {**pilot.swarm, "rounds": 12} == table.swarm
    [conf] = pilot.configurations
    node = pilot.swarm_config(conf, 0).nodes[0].node
    assert (node.local_groups, node.external_groups) == (1, 3)
    assert node.grpo.off_policy.correction == "none"


def test_the_offpolicy_sweep_is_fixed_as_its_file_says() -> None:
    sweep = load_experiment(EXAMPLES / "offpolicy-cpu.yaml")
    table = load_experiment(EXAMPLES / "paper-table-cpu.yaml")
    assert {**sweep.swarm, "rounds": 12} == table.swarm and sweep.swarm["rounds"] == 24
    assert sweep.seeds == list(range(6)) and sweep.baseline_label() == "4/0-L16"
    labels = [sweep.label(c) for c in sweep.configurations]
    assert labels == [
        "4/0-L16", "2/2-none", "2/2-token-truncate", "1/3-none", "1/3-token-truncate",
    ]  # fmt: skip
    alone = sweep.swarm_config(sweep.configurations[0], 2).nodes[0].node
    assert alone.generation.completions_per_question == 16 and alone.external_groups == 0
    corrected = sweep.swarm_config(sweep.configurations[4], 2).nodes[0].node
    assert corrected.grpo.off_policy.correction == "token_truncate"
    assert corrected.grpo.off_policy.cap == 2.0
    assert corrected.generation.completions_per_question == 8
