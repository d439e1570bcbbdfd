"""A tiny node-like flow under the run watchdog, for tests/integration/test_hung_run.py:
a node flow whose round subflow runs one task that reports progress every 0.25 s for
`seconds`; with SAPO_TEST_HANG_AT=update:0 the task hangs on entering instead, while the
process's threads (heartbeats, the watchdog) run on.

    python -m tests.integration.watched_flow TIMEOUT_S SECONDS
"""

from __future__ import annotations

import sys
import time

from prefect import flow, task
from prefect.cache_policies import NONE

from flows.node.watchdog import Watchdog, current_flow_run_id, watching

_dog: list[Watchdog] = []


@task(name="update", cache_policy=NONE)
def update(seconds: float) -> None:
    dog = _dog[-1]
    dog.saw({"event": "step", "round": 0, "step": "update"})
    ticks = int(seconds / 0.25)
    for done in range(ticks):
        time.sleep(0.25)
        dog.saw({"event": "generate", "done": done + 1, "total": ticks})


@flow(name="watched-round")
def round_flow(seconds: float) -> None:
    update(seconds)


@flow(name="watched-node")
def node_flow(timeout_s: float, seconds: float) -> None:
    print(f"flow-run {current_flow_run_id()}", flush=True)
    with watching(timeout_s) as dog:
        _dog.append(dog)
        round_flow(seconds)


if __name__ == "__main__":
    node_flow(float(sys.argv[1]), float(sys.argv[2]))
