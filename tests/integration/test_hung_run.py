"""A node run that hangs while its process lives (and beats) is ended by its watchdog: the
run, its round and the task it hung in are marked Crashed, naming the step, and the process
exits with STALL_EXIT_CODE; a run that keeps making progress is left alone. Against
Prefect's test harness, each run in a process of its own (the watchdog ends its process)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml

from flows.node.watchdog import HANG_AT_ENV, STALL_EXIT_CODE
from tests.tiny_models import build_tiny_model

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _python(args: list[str], hang_at: str | None = None) -> subprocess.CompletedProcess[str]:
    from prefect.settings import PREFECT_API_URL

    env = {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),  # the harness's server
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",  # as deployed node runs beat
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    env.pop(HANG_AT_ENV, None)
    if hang_at:
        env[HANG_AT_ENV] = hang_at
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def _run_id(out: str) -> UUID:
    return UUID(next(line for line in out.splitlines() if line.startswith("flow-run ")).split()[1])


def _node_run(swarm_file: str) -> UUID:
    """The node flow run that was given this swarm file."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["sapo-node"]))
        )
    (run,) = [r for r in runs if r.parameters.get("swarm_file") == swarm_file]
    return run.id


def _states(run_id: UUID) -> dict[str, Any]:
    """name -> state of the run, its subflow runs and all their task runs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas import filters

    with get_client(sync_client=True) as client:
        runs = [client.read_flow_run(run_id)]
        runs += client.read_flow_runs(
            flow_run_filter=filters.FlowRunFilter(
                parent_flow_run_id=filters.FlowRunFilterParentFlowRunId(any_=[run_id])
            )
        )
        tasks = client.read_task_runs(
            flow_run_filter=filters.FlowRunFilter(
                id=filters.FlowRunFilterId(any_=[r.id for r in runs])
            )
        )
    by_flow = {run.id: run.name for run in runs}
    states = {"node": runs[0].state}
    states.update({f"round {r.name}": r.state for r in runs[1:]})
    states.update({f"{by_flow[t.flow_run_id or run_id]}/{t.name}": t.state for t in tasks})
    return states


@pytest.mark.slow  # Prefect's harness (a server: ~30 s to start) and a process a run
def test_a_hung_step_is_marked_crashed_naming_it_and_its_process_ends(
    prefect_harness: None,
) -> None:
    began = time.monotonic()
    # 10 s without progress: opening the run (its flow and task runs on the harness) takes
    # seconds on a loaded machine, and that counts too.
    done = _python(["-m", "tests.integration.watched_flow", "10", "1"], hang_at="update:0")
    assert done.returncode == STALL_EXIT_CODE, done.stderr
    assert time.monotonic() - began < 60
    why = re.search(r"sapo: (no progress for \d+ s in step update of round 0);", done.stderr)
    assert why is not None, done.stderr
    assert "in update" in done.stderr  # every thread's stack, the hung one's included
    assert "in heartbeat_loop" in done.stderr  # ...and the run's heartbeats, still going
    states = _states(_run_id(done.stdout))
    assert {s.type.value for s in states.values()} == {"CRASHED"}, states
    assert len(states) >= 3  # the node's run, its round's, the task that hung
    for state in states.values():
        assert state.message == why[1]


@pytest.mark.slow  # Prefect's harness (a server: ~30 s to start) and a process a run
def test_a_run_that_keeps_making_progress_is_not_marked(prefect_harness: None) -> None:
    # 12 s of work, longer than the 10 s allowed without progress, never 10 s without it
    done = _python(["-m", "tests.integration.watched_flow", "10", "12"])
    assert done.returncode == 0, done.stderr
    assert "no progress" not in done.stderr
    states = _states(_run_id(done.stdout))
    assert {s.type.value for s in states.values()} == {"COMPLETED"}, states


GIL_HANG = """
import ctypes, time
from flows.node.watchdog import Watchdog
Watchdog(1.0, lambda why: print("the watchdog ran", flush=True), backstop_s=1.0).start()
ctypes.PyDLL(None).sleep(60)  # libc's sleep holding the GIL: no Python thread runs
"""


def test_a_process_hung_holding_the_gil_is_ended_by_the_backstop() -> None:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", GIL_HANG], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert time.monotonic() - began < 30
    assert done.returncode == 1  # faulthandler's exit: the heartbeat automation marks the run
    assert "the watchdog ran" not in done.stdout
    assert "Timeout (0:00:0" in done.stderr and "<string>" in done.stderr


@pytest.mark.slow
def test_a_hung_node_run_is_marked_crashed_naming_its_step(
    tmp_path: Path,
    prefect_harness: None,
) -> None:
    """The node flow itself, hung in its sample step with the default peer wait (none)."""
    model = build_tiny_model(tmp_path / "model")
    swarm = tmp_path / "swarm.yaml"
    swarm.write_text(
        yaml.safe_dump(
            {
                "swarm_id": "hung",
                "workdir": str(tmp_path / "work"),
                "rounds": 2,
                "stall_timeout_s": 30,  # opening the node counts (imports, under load)
                "tracking": {"enabled": False},
                "defaults": {
                    "model": str(model),
                    "local_groups": 1,
                    "external_groups": 1,
                    "tasks": {"specs": [{"name": "chain_sum", "config": {"max_terms": 2}}]},
                    "generation": {"completions_per_question": 2, "max_new_tokens": 3},
                },
                "nodes": [{"node_id": "a", "seed": 0}],
            }
        )
    )
    runner = (
        "import sys; from flows.node.round import node_flow; node_flow('a', swarm_file=sys.argv[1])"
    )
    done = _python(["-c", runner, str(swarm)], hang_at="sample:0")
    assert done.returncode == STALL_EXIT_CODE, done.stderr[-3000:]
    found = re.search(r"sapo: (no progress for \d+ s in step sample of round 0);", done.stderr)
    assert found is not None, done.stderr[-3000:]
    why = found[1]
    assert "in heartbeat_loop" in done.stderr  # it beat on while it hung
    states = _states(_node_run(str(swarm)))
    assert states["node"].type.value == "CRASHED" and states["node"].message == why
    assert states["round a-round-0"].type.value == "CRASHED"
    sample = [s for name, s in states.items() if name.startswith("a-round-0/sample")]
    assert [s.type.value for s in sample] == ["CRASHED"] and sample[0].message == why
    done_before = [n for n, s in states.items() if "/generate" in n and s.type.value == "COMPLETED"]
    assert done_before  # the steps before it ran and were left as they were
