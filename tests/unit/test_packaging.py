"""What `pip install sapo-swarm` gives: the ledger and `sapo ledger ...` without torch,
Transformers, Prefect or MLflow; and every package the code imports is declared."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from ledger.config import DEFAULT_WORKDIR

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ledger", "flows", "sapo_core", "dashboards", "analysis")
HEAVY = ("torch", "transformers", "prefect", "mlflow", "reasoning_gym", "matplotlib")
NOT_IN_BASE = {"torch", "transformers", "prefect", "mlflow", "reasoning-gym", "gguf", "matplotlib"}
# Import name -> distribution, where they differ (checked without the packages installed).
DISTRIBUTION_OF = {
    "yaml": "pyyaml",
    "duckdb_extension_httpfs": "duckdb-extension-httpfs",
    "reasoning_gym": "reasoning-gym",
}

LEDGER_ONLY = textwrap.dedent(
    """
    import contextlib, io, json, runpy, sys

    BLOCKED = set(sys.argv[2].split(","))
    for name in BLOCKED:
        # What the import system (and importlib.util.find_spec) take for "not installed":
        # `import torch` raises ImportError, find_spec("torch") answers None.
        sys.modules[name] = None

    import dashboards
    import dashboards.report  # its figures import matplotlib only when they draw
    from ledger import Ledger
    from ledger.synthetic import synthetic_round

    url = sys.argv[1]
    with Ledger.open(url) as led:
        for node in ("a", "b"):
            led.publish(synthetic_round("sw", node, 0, n_groups=3, group_size=4))
        direct = led.query("SELECT count(*) FROM rollouts").item()
    shipped = dashboards.query("swarm_totals")

    import flows.cli

    out = io.StringIO()
    sys.argv = ["sapo", "ledger", "query", url, "SELECT count(*) AS n FROM rollouts", "-f", "json"]
    code = None
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module("flows.cli", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
    loaded = sorted(m for m in BLOCKED if sys.modules.get(m) is not None)
    print(json.dumps({"direct": direct, "cli": out.getvalue(), "code": code,
                      "dashboard": bool(shipped), "loaded": loaded}))
    """
)


def test_the_ledger_and_its_commands_run_without_the_heavy_stacks(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LEDGER_ONLY, str(tmp_path / "ledger"), ",".join(HEAVY)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["direct"] == 2 * 3 * 4
    assert result["code"] in (None, 0), result
    assert json.loads(result["cli"]) == [{"n": 2 * 3 * 4}]
    assert result["dashboard"] and result["loaded"] == []


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {_normal(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in requirements}

    extras = {k: names(v) for k, v in project["optional-dependencies"].items()}
    return names(project["dependencies"]), extras


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


OWN_ENVIRONMENT = {"sapo_core/policy/vllm_worker.py"}
"""Programs run by another environment's Python (`sapo vllm install` makes vLLM's): their
imports are that environment's, not this package's."""


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level names imported by the packages, outside the standard library: name -> files."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if str(path.relative_to(ROOT)) in OWN_ENVIRONMENT:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.partition(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_base_install_is_the_ledger_and_every_import_is_declared() -> None:
    base, extras = _declared()
    assert not base & NOT_IN_BASE, base & NOT_IN_BASE
    assert {"duckdb", "pyarrow", "polars", "s3fs", "pydantic", "pyyaml", "typer"} <= base
    assert "sapo-swarm" in extras["dev"] and "sapo-swarm" in extras["all"]
    declared = base.union(*extras.values())
    installed = packages_distributions()
    missing = {}
    for name, files in _third_party_imports().items():
        candidates = {_normal(DISTRIBUTION_OF.get(name, name))}
        candidates |= {_normal(d) for d in installed.get(name, [])}
        if not candidates & declared:
            missing[name] = sorted(files)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_a_program_of_another_environment_imports_nothing_of_sapo() -> None:
    """The vLLM worker runs where sapo is not installed: the standard library and vLLM only."""
    for name in OWN_ENVIRONMENT:
        tree = ast.parse((ROOT / name).read_text())
        imported = {
            (alias.name if isinstance(node, ast.Import) else node.module or "").partition(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert imported - sys.stdlib_module_names <= {"vllm", "torch"}, (name, imported)


def test_package_data_ships_every_file_the_packages_read() -> None:
    """A non-editable install holds only .py files and what package-data names."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    unshipped = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_dir() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            relative = path.relative_to(ROOT)
            shipped = any(
                relative.parts[: len(owner.split("."))] == tuple(owner.split("."))
                and fnmatch.fnmatch("/".join(relative.parts[len(owner.split(".")) :]), glob)
                for owner, globs in patterns.items()
                for glob in globs
            )
            if not shipped:
                unshipped.append(str(relative))
    assert not unshipped, f"not in [tool.setuptools.package-data]: {unshipped}"


NEEDS_AN_EXTRA = textwrap.dedent(
    """
    import contextlib, io, runpy, sys

    for name in sys.argv[2].split(","):
        sys.modules[name] = None  # not installed
    sys.argv = ["sapo", *sys.argv[1].split(" ")]
    try:
        runpy.run_module("flows.cli", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        print("exit", exc.code)
    """
)


def test_commands_beyond_the_ledger_name_the_extra_they_need(tmp_path: Path) -> None:
    for command, extra in (
        ("swarm --rounds 1", "flows"),
        ("node --node-id node-0", "flows"),
        (f"report --ledger {tmp_path} --out {tmp_path / 'r'}", "dashboards"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", NEEDS_AN_EXTRA, command, ",".join(HEAVY)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        assert done.stdout.strip().endswith("exit 2"), (command, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        # sapo is not on the package index: the hint names the checkout it runs from.
        assert len(lines) == 1 and f"pip install -e '{ROOT}[{extra}]'" in lines[0], lines
        assert not (tmp_path / DEFAULT_WORKDIR).exists()  # nothing started
    # `sapo vllm` needs no torch to say where its environment is (it said "No module named
    # 'torch'").
    done = subprocess.run(
        [sys.executable, "-c", NEEDS_AN_EXTRA, f"vllm check --path {tmp_path}", ",".join(HEAVY)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.stderr.strip() == (
        f"error: no vLLM environment at {tmp_path}: run `sapo vllm install`"
    ), done.stderr


def test_a_missing_extras_hint_names_where_this_install_came_from() -> None:
    """Issue 47, run as a user runs it: `pip install ./sapo` (a checkout, not editable),
    then `sapo swarm`, was told to install a wheel it never had. pip records the origin
    (PEP 610); the hint names it: the folder, the editable checkout or the wheel file."""
    from flows.cli.common import hint_from_direct_url

    folder = {"url": "file:///home/me/my%20sapo", "dir_info": {}}
    assert hint_from_direct_url(folder, "flows", "0.1.0").startswith(
        "pip install '/home/me/my sapo[flows]'"
    )
    editable = {"url": "file:///home/me/sapo", "dir_info": {"editable": True}}
    assert hint_from_direct_url(editable, "flows", "0.1.0").startswith(
        "pip install -e '/home/me/sapo[flows]'"
    )
    wheel = {"url": "file:///tmp/dist/sapo_swarm-0.1.0-py3-none-any.whl", "archive_info": {}}
    assert hint_from_direct_url(wheel, "dashboards", "0.1.0").startswith(
        "pip install '/tmp/dist/sapo_swarm-0.1.0-py3-none-any.whl[dashboards]'"
    )
    sdist = {"url": "file:///tmp/dist/sapo_swarm-0.1.0.tar.gz", "archive_info": {}}
    assert hint_from_direct_url(sdist, "flows", "0.1.0").startswith(
        "pip install '/tmp/dist/sapo_swarm-0.1.0.tar.gz[flows]'"
    )
    git = {"url": "https://example.org/sapo.git", "vcs_info": {"vcs": "git", "commit_id": "ab1"}}
    assert hint_from_direct_url(git, "flows", "0.1.0").startswith(
        "pip install 'sapo-swarm[flows] @ git+https://example.org/sapo.git@ab1'"
    )
    quoted = {"url": "file:///home/o%27brien/sapo", "dir_info": {}}  # the shell reads it whole
    assert shlex.split(hint_from_direct_url(quoted, "flows", "0.1.0"))[2] == (
        "/home/o'brien/sapo[flows]"
    )
    for unknown in (None, {"url": "https://example.org/sapo.tar.gz", "archive_info": {}}):
        assert hint_from_direct_url(unknown, "flows", "0.2.0").startswith(
            "pip install 'sapo_swarm-0.2.0-py3-none-any.whl[flows]'"
        )
