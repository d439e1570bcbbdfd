"""Issue 59: a node starts in one decision. A resumed `sapo swarm`'s launcher reads each
node's checkpoint once and checks their resume once; each node process then reads its own
checkpoint once before its first round (or before it finishes, when it has no round left)
and does not check again (the launcher told it which checkpoint it checked); the swarm's
rules are declared once per process.

Counted in the real processes: a ``sitecustomize`` on their PYTHONPATH wraps the functions
that do each (reading them, not replacing them) and writes each process's counts at exit.
`counting_env` gives a run the hooks; `check_one_decision` reads what they counted
(tests/e2e/test_adapter_swarm.py's resume)."""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

COUNTING = """
import atexit, json, os, sys

_counts = {"latest": 0, "check_resume": 0, "declare_swarm": 0}
_before_round_0 = {}


def _counted(owner, name, key):
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        _counts[key] += 1
        return real(*args, **kwargs)

    setattr(owner, name, wrapper)


def _install():
    from flows.node import checkpoint, lifecycle, steps
    from ledger import Ledger

    _counted(checkpoint, "latest", "latest")
    _counted(lifecycle, "check_resume", "check_resume")
    _counted(Ledger, "declare_swarm", "declare_swarm")
    from flows.node import round as node_round

    # The counts as the node's first round begins, or as it finishes when it has no round
    # left to run (a resumed node that had run them all before the stop: it only finishes).
    def snapshot_before(owner, name):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            _before_round_0.setdefault("counts", dict(_counts))
            return real(*args, **kwargs)

        setattr(owner, name, wrapper)

    snapshot_before(steps, "run_round")
    snapshot_before(node_round, "finish_run")


def _write():
    if any(_counts.values()):
        out = os.path.join(os.environ["SAPO_TEST_COUNTS"], f"{os.getpid()}.json")
        with open(out, "w") as f:
            json.dump({"argv": sys.orig_argv, "counts": _before_round_0.get("counts", _counts)}, f)


# sys.argv is not set yet while site runs; the interpreter's own argv is.
if "flows.cli" in sys.orig_argv:
    _install()
    atexit.register(_write)
"""


def counting_env(folder: Path) -> dict[str, str]:
    """The environment that makes a `sapo swarm` run count (under ``folder``)."""
    hooks, counts = folder / "hooks", folder / "counts"
    hooks.mkdir(parents=True)
    counts.mkdir()
    (hooks / "sitecustomize.py").write_text(COUNTING)
    return {"PYTHONPATH": os.pathsep.join([str(hooks), str(ROOT)]), "SAPO_TEST_COUNTS": str(counts)}


def check_one_decision(folder: Path, nodes: int) -> None:
    """The counts of a resumed swarm of ``nodes`` nodes run with `counting_env(folder)`."""
    found = [json.loads(p.read_text()) for p in (folder / "counts").glob("*.json")]
    launcher = [f for f in found if "swarm" in f["argv"]]
    processes = [f for f in found if "node" in f["argv"]]
    assert len(launcher) == 1 and len(processes) == nodes, [f["argv"] for f in found]
    # The launcher: each checkpoint read once, the resume checked once, the swarm's rules
    # declared once.
    assert launcher[0]["counts"] == {"latest": nodes, "check_resume": 1, "declare_swarm": 1}
    # Each node before its first round (or its finish): its checkpoint read once, no second
    # check, the rules declared once (as it opens the ledger).
    for node in processes:
        assert node["counts"] == {"latest": 1, "check_resume": 0, "declare_swarm": 1}, node
