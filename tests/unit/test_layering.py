"""The house's layers, read from the source: which package may import which, and no cycles.

Every import counts: at module level, inside a function (a deferred import is still a
dependency) and under ``if TYPE_CHECKING:`` (a module that names another's types depends on
it as much as one that calls it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ledger", "sapo_core", "flows", "dashboards", "analysis")
FORBIDDEN = {
    # A person analysing rollouts with SQL needs no deep-learning stack, and the ledger
    # knows nothing of the algorithm or the orchestration above it.
    "ledger": {"sapo_core", "flows", "dashboards", "torch", "transformers", "prefect", "mlflow"},
    # The algorithm: no storage, no orchestration, no tracking.
    "sapo_core": {"ledger", "flows", "dashboards", "prefect", "mlflow"},
    # The SQL and figures of a ledger, for anyone with the ledger: no algorithm, no
    # orchestration, no tracking, no deep-learning stack.
    # (And nothing of an experiment's statistics, which stand on it.)
    "dashboards": {"sapo_core", "flows", "analysis", "torch", "transformers", "prefect", "mlflow"},
    # An experiment's statistics, from committed records or a ledger: the same.
    "analysis": {"sapo_core", "flows", "torch", "transformers", "prefect", "mlflow"},
}
FLOWS_ROOMS = {
    # The rooms of flows/, from the top: a room imports only rooms below it (or itself).
    "flows.cli": 0,  # the command line, over everything
    "flows.services": 1,  # deployments, the infra stack
    "flows.experiments": 1,  # sweeps, their flow, records and statistics
    "flows.reports": 2,  # `sapo report`, `sapo compare`
    "flows.swarm": 3,  # the local launcher of node processes
    "flows.node": 4,  # one node's run
}
SHARED_RANK = 5
"""flows' shared modules (config, tracking, progress, env, limits) stand below every room."""
SIZE_LIMIT = 450
"""Lines a source file may hold: past it a reader no longer holds it in mind; split it
along a real seam."""
SOURCE_DIRS = (*PACKAGES, "benchmarks", "examples")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SCRIPT_DIRS = ("benchmarks",)
"""Folders of scripts run from their own folder, whose imports of each other are bare names
(``from vs_trl import ...`` is benchmarks.vs_trl): under the cycle rule like the packages."""


def all_modules() -> dict[str, Path]:
    found = {}
    for package in (*PACKAGES, *SCRIPT_DIRS):
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imported_names(path: Path, module: str) -> set[str]:
    """Every dotted name ``path`` imports (``from a import b`` gives ``a.b``: a module, or a
    name of module ``a``)."""
    is_package = path.name == "__init__.py"
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                anchor = here[: len(here) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return names


def internal_edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project's modules it imports (a name re-exported by a package counts as
    an import of the package)."""
    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(path, module):
            folder = module.split(".")[0]
            if folder in SCRIPT_DIRS and f"{folder}.{name.split('.')[0]}" in modules:
                name = f"{folder}.{name}"  # a sibling script, imported bare
            if name in modules:
                targets.add(name)
            elif name.rpartition(".")[0] in modules:  # `from pkg import name`
                targets.add(name.rpartition(".")[0])
        targets.discard(module)
        edges[module] = targets
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_lower_layer_never_imports_what_stands_above_it(package: str) -> None:
    modules = all_modules()
    breaches = [
        f"{module} imports {name}"
        for module, path in modules.items()
        if module.split(".")[0] == package
        for name in sorted(imported_names(path, module))
        if name.split(".")[0] in FORBIDDEN[package]
    ]
    assert breaches == []


def test_no_two_modules_import_each_other_even_through_others() -> None:
    modules = all_modules()
    assert "benchmarks.vs_trl" in modules  # the scripts are walked too (issue 59)
    edges = internal_edges(modules)
    assert "benchmarks.gpu_round" in edges["benchmarks.vs_trl"]  # their bare imports resolve
    assert cycles(edges) == []


def test_the_checks_themselves_see_a_breach_and_a_cycle(tmp_path: Path) -> None:
    """The parser and the cycle finder on hand-made modules: a test that cannot fail is none."""
    source = tmp_path / "m.py"
    source.write_text(
        "import torch.nn\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import mlflow\n"
        "def f():\n    from . import catalog\n"
    )
    names = imported_names(source, "ledger.m")
    assert {"torch.nn", "mlflow", "ledger.catalog"} <= names
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def flows_rank(module: str) -> int | None:
    """A flows module's room rank (see FLOWS_ROOMS); None outside flows."""
    parts = module.split(".")
    if parts[0] != "flows":
        return None
    return FLOWS_ROOMS.get(".".join(parts[:2]), SHARED_RANK)


def test_flows_rooms_import_only_the_rooms_below_them() -> None:
    edges = internal_edges(all_modules())
    upward = [
        f"{module} imports {target}"
        for module, targets in edges.items()
        for target in sorted(targets)
        if (rank := flows_rank(module)) is not None
        and (target_rank := flows_rank(target)) is not None
        and module.split(".")[:2] != target.split(".")[:2]
        and target_rank <= rank
        and not (rank == target_rank == SHARED_RANK)  # shared modules among themselves
    ]
    assert upward == []


def test_the_config_models_stand_below_the_rest_of_the_algorithm() -> None:
    """sapo_core.config is read by every layer (a swarm file, a report, a benchmark): it
    imports no other part of sapo_core, so loading a config never loads the algorithm."""
    edges = internal_edges(all_modules())
    upward = [
        f"{module} imports {target}"
        for module, targets in edges.items()
        if module.startswith("sapo_core.config")
        for target in sorted(targets)
        if not target.startswith("sapo_core.config")
    ]
    assert upward == []


def test_no_source_file_outgrows_what_a_reader_holds_in_mind() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for folder in SOURCE_DIRS
        for path in sorted((ROOT / folder).rglob("*.py"))
    }
    assert len(sizes) > 100  # the walk found the sources
    assert {name: n for name, n in sizes.items() if n > SIZE_LIMIT} == {}


def test_a_rollouts_record_is_the_ledgers_row_less_what_the_ledger_stamps() -> None:
    """The record type crosses the wall as plain columns: sapo_core's `Rollout.to_record()`
    and `RECORD_FIELDS` are the ledger schema's columns, in its order, less the three the
    publishing side stamps (swarm, time, schema version)."""
    from ledger.schema import COLUMN_NAMES
    from sapo_core.rollouts import RECORD_FIELDS
    from tests.factories import rollout_of

    stamped = {"swarm_id", "published_at", "schema_version"}
    assert tuple(c for c in COLUMN_NAMES if c not in stamped) == RECORD_FIELDS
    from sapo_core.tasks import Question

    question = Question("chain_sum", "{}", 0, 0, "1 + 1 =", "2", "{}")
    assert tuple(rollout_of(question, "<answer>2</answer>").to_record()) == RECORD_FIELDS


def test_the_bounds_declared_on_both_sides_of_the_wall_agree() -> None:
    """sapo_core and ledger never import each other, so a bound both check is declared in
    each: here they are held equal (I and J per round)."""
    from ledger.schema import MAX_GROUPS_PER_ROUND as LEDGER_MAX
    from sapo_core.config.node import MAX_GROUPS_PER_ROUND as CORE_MAX

    assert CORE_MAX == LEDGER_MAX
    import math

    from ledger.node_logs import DRIFT_LOG_LIMIT, DRIFT_WEIGHT_LIMIT
    from sapo_core.grpo.offpolicy import LOG_RATIO_LIMIT

    assert DRIFT_LOG_LIMIT == LOG_RATIO_LIMIT
    assert math.exp(LOG_RATIO_LIMIT) <= DRIFT_WEIGHT_LIMIT
    # The paper's nine tasks: the ledger's synthetic swarm draws the specialties a node does.
    from ledger.synthetic import SPECIALTIES
    from sapo_core.config import PAPER_SPECIALTIES

    assert SPECIALTIES == PAPER_SPECIALTIES and len(SPECIALTIES) == 9


@pytest.mark.parametrize("name", ["records", "statistics"])
def test_a_module_moved_out_of_dashboards_names_its_new_home(name: str) -> None:
    import importlib

    with pytest.raises(ModuleNotFoundError, match=f"dashboards.{name} moved to analysis.{name}"):
        importlib.import_module(f"dashboards.{name}")
    assert importlib.import_module(f"analysis.{name}").__name__ == f"analysis.{name}"


LEARNER_INTERFACE = {
    # What flows/ may use of a node's learner (sapo_core/learner.py): its round, its state
    # as a whole, and what it says about itself. Its optimizer, encoder, backend and
    # anything private are its own.
    "generate", "train_round", "evaluate", "state_dict", "close",
    "config", "policy", "prompt_format", "policy_version", "totals", "reputation",
    "judged_tasks",
}  # fmt: skip


def learner_uses(path: Path) -> set[str]:
    """The attributes read of anything named ``learner`` (``node.learner.x``, ``learner.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            named = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if named == "learner":
                found.add(node.attr)
    return found


def test_flows_use_the_learner_through_its_public_interface_alone() -> None:
    """Issue 59: flows/ keeps I/O only; what a node is (weights, optimizer, RNG, reputation,
    totals) the learner owns, read and restored as a whole through its state dict."""
    from sapo_core.learner import Learner

    for name in LEARNER_INTERFACE:
        assert not name.startswith("_") and (
            hasattr(Learner, name) or name in Learner.__init__.__code__.co_names
        ), name
    for path in sorted((ROOT / "flows").rglob("*.py")):
        outside = learner_uses(path) - LEARNER_INTERFACE
        assert not outside, f"{path.relative_to(ROOT)} reaches into the learner: {outside}"


def test_the_learner_rule_sees_a_reach_into_its_optimizer(tmp_path: Path) -> None:
    breach = tmp_path / "breach.py"
    breach.write_text("def f(node):\n    return node.learner.optimizer.state_dict()\n")
    assert learner_uses(breach) == {"optimizer"}


def test_the_default_work_directory_is_written_once() -> None:
    """Issue 59: "sapo-work" was written in five places; the swarm file, the command line,
    the ledger's own default and the tests now take it from ledger.config."""
    from ledger.config import DEFAULT_WORKDIR, LedgerConfig

    name = str(DEFAULT_WORKDIR)
    written = []
    for folder in (*SOURCE_DIRS, "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                text = node.value if isinstance(node, ast.Constant) else None
                if isinstance(text, str) and (text == name or text.startswith(f"{name}/")):
                    written.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        for path in sorted((ROOT / folder).rglob("*.yaml")):
            written += [
                f"{path.relative_to(ROOT)}:{n}"
                for n, line in enumerate(path.read_text().splitlines(), 1)
                if line.split("#")[0].strip() == f"workdir: {name}"
            ]
    assert [where.partition(":")[0] for where in written] == ["ledger/config.py"], written
    assert LedgerConfig().url == f"{name}/ledger"


def test_the_ledger_package_names_load_on_first_use() -> None:
    """ledger/__init__ loads its names lazily, so the command line reads the default work
    directory without DuckDB or pyarrow: each name it lists is its module's, and nothing
    else is there."""
    import importlib
    import subprocess
    import sys

    import ledger

    assert sorted(ledger.__all__) == sorted(ledger._HOMES)
    for name, home in ledger._HOMES.items():
        assert getattr(ledger, name) is getattr(importlib.import_module(f"ledger.{home}"), name)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        ledger.Nope  # noqa: B018
    probe = "import sys, flows.limits; print(sorted({'duckdb', 'pyarrow'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "[]", done.stderr


def test_a_node_logs_record_types_are_the_ledgers_log_columns() -> None:
    """Issue 59: node-log rows are typed in sapo_core (TrainingRecord, EvaluationRecord),
    and their keys are the ledger's log columns less what its writer stamps (the round and
    the time); a key the ledger treats as optional is optional in the type too."""
    from ledger.node_logs import EVALUATIONS, TRAININGS
    from sapo_core.assembly import TrainingRecord
    from sapo_core.evaluation import EvaluationRecord

    for record, node_log in ((TrainingRecord, TRAININGS), (EvaluationRecord, EVALUATIONS)):
        stamped = {"node_round", node_log.stamp}
        columns = {c.name: c for c in node_log.columns if c.name not in stamped}
        keys = record.__required_keys__ | record.__optional_keys__
        assert keys == set(columns), record.__name__
        assert all(columns[k].optional for k in record.__optional_keys__), record.__name__


def test_a_nodes_finish_lives_in_one_module() -> None:
    """Issue 59: how a run finishes (evaluate, log the model, keep, mark finished) is
    flows/node/finish.py's alone; no other module of flows/ calls those steps."""
    finishing = {"final_evaluation", "log_model", "keep_final_model", "mark_finished"}
    callers: dict[str, set[str]] = {}
    for path in sorted((ROOT / "flows").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            called = node.func if isinstance(node, ast.Call) else None
            if isinstance(called, ast.Attribute) and called.attr in finishing:
                callers.setdefault(called.attr, set()).add(path.name)
    assert callers == {
        "log_model": {"finish.py"},
        "keep_final_model": {"finish.py"},
        "mark_finished": {"finish.py"},
        "final_evaluation": {"round.py"},  # the Prefect task that finish_run is handed
    }
