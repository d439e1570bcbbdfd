"""Docs that run: every `sapo ...` command quoted in the README, the pages under docs/, the
examples' headers and infra/README.md parses against the CLI as it is (issue 47: the mixed
example's header said `sapo report sapo-mixed/ledger`, which fails with "Missing option
'--ledger'"). Whole commands (code blocks, headers) are parsed as the shell would pass them;
a command named inline in prose (`sapo ledger validate URL`) must name a real command and
real options. Each command's --help then runs."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

# typer builds its commands on its own copy of click: click's classes are not theirs.
from typer._click.core import Context, Exit
from typer._click.exceptions import ClickException, UsageError
from typer.testing import CliRunner

from flows.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = (
    "README.md",
    "infra/README.md",
    "benchmarks/README.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*.yaml")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "infra").glob("*.yaml")),
)
SHELL_VALUES = {"$MLFLOW_TRACKING_URI": "sqlite:///mlflow.db", "~": "/home/user"}


@dataclass(frozen=True)
class Quoted:
    where: str  # file:line
    text: str
    whole: bool  # a command as typed (a code block, a header), not a name in prose


def quoted_commands(name: str) -> list[Quoted]:
    """The `sapo` commands a document quotes: in code blocks and YAML comments, whole (with
    `\\` continuations joined, trailing comments dropped); in prose, inline."""
    lines = (ROOT / name).read_text().splitlines()
    found: list[Quoted] = []
    fenced = name.endswith((".yaml", ".yml"))  # a YAML file's comments are its code
    pending = ""
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        body = stripped.lstrip("#").strip() if name.endswith(".yaml") else stripped
        body = body.removeprefix("$ ")
        if fenced and (pending or body.startswith("sapo ")):
            command = re.sub(r"\s+#\s.*$", "", body)  # a trailing comment
            if command.endswith("\\"):
                pending += command[:-1] + " "
                continue
            text = pending + command
            # A synopsis ([--strict], (--a | --b)) names options; it is not typed as is.
            synopsis = re.search(r"\[-|\(-| \| ", text) is not None
            found.append(Quoted(f"{name}:{number}", text, whole=not synopsis))
            pending = ""
        elif not fenced:
            for match in re.finditer(r"`(sapo [^`]+)`", line):
                found.append(Quoted(f"{name}:{number}", match.group(1), whole=False))
    return found


ALL = [q for name in DOCS for q in quoted_commands(name)]


def resolve(words: list[str]) -> tuple[list[str], Any, list[str]]:
    """The command path words name (``["ledger", "query"]``), its command and the rest."""
    command: Any = typer.main.get_command(app)
    path: list[str] = []
    rest = list(words)
    while isinstance(command, typer.core.TyperGroup) and rest and not rest[0].startswith("-"):
        found = command.get_command(Context(command), rest[0])
        if found is None:
            raise UsageError(f"no command {' '.join(['sapo', *path, rest[0]])!r}")
        path.append(rest.pop(0))
        command = found
    return path, command, rest


def parse_whole(text: str) -> None:
    """Parse ``text`` as the shell would pass it to `sapo`: every option and argument checked
    against the command's own (a missing required option, an unknown one, a bad value)."""
    for shell, value in SHELL_VALUES.items():
        text = text.replace(shell, value)
    words = shlex.split(text)[1:]
    top = typer.main.get_command(app)
    parent = Context(top, info_name="sapo")
    _, command, rest = resolve([w for w in words if w != "--debug"])
    if command is top:
        top.make_context("sapo", rest)
        return
    command.make_context(command.name or "", rest, parent=parent)


PLACEHOLDER = re.compile(r"^(\.\.\.|\[.*|.*\]|[A-Z][A-Z0-9_-]*|<.*|.*>|\(.*|.*\)|\|)$")


def check_named(text: str) -> None:
    """A command named in prose: its words up to the first placeholder name a command, and
    each ``--option`` it shows is one of that command's."""
    words = [w for w in text.split() if w != "/"]
    path_words = []
    for word in words[1:]:
        if word.startswith("-") or PLACEHOLDER.match(word) or "/" in word or "." in word:
            break
        path_words.append(word)
    path, command, _ = resolve(path_words)
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    if command is typer.main.get_command(app):
        known |= {"--help", "--version", "--debug"}
    for word in words:
        option = word.split("=")[0].strip("[]()|")
        if option.startswith("--") and option not in known | {"--help"}:
            raise UsageError(f"no option {option} of 'sapo {' '.join(path)}'")


def test_every_document_quotes_commands() -> None:
    """The extraction finds what it is for (a test that cannot fail is none)."""
    whole = [q for q in ALL if q.whole]
    assert len(whole) > 40 and len(ALL) > 100
    assert any(q.where.startswith("examples/mixed-cpu.yaml") for q in whole)
    with pytest.raises(UsageError) as missing:
        parse_whole("sapo report sapo-mixed/ledger")
    assert missing.value.format_message() == "Missing option '--ledger'."
    with pytest.raises(UsageError, match="no option --nope"):
        check_named("sapo swarm --nope")


@pytest.mark.parametrize("quoted", ALL, ids=lambda q: q.where)
def test_a_quoted_command_parses(quoted: Quoted, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # paths in the docs are the checkout's
    # What the docs have the user export before the commands that read it.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    try:
        if quoted.whole:
            parse_whole(quoted.text)
        else:
            check_named(quoted.text)
    except Exit:
        pass  # --version and the like answer while parsing
    except ClickException as exc:
        pytest.fail(f"{quoted.where}: {quoted.text!r}: {exc.format_message()}")


def test_each_quoted_command_has_help_that_runs() -> None:
    runner = CliRunner()
    paths = set()
    for quoted in ALL:
        words = [w for w in quoted.text.split()[1:] if not w.startswith("-")]
        try:
            path, _, _ = resolve(words)
        except UsageError:
            continue  # reported by test_a_quoted_command_parses
        paths.add(tuple(path))
    assert ("ledger", "query") in paths and ("swarm",) in paths
    for path in sorted(paths):
        out = runner.invoke(app, [*path, "--help"], terminal_width=80)
        assert out.exit_code == 0, (path, out.output)


def test_every_relative_link_in_the_docs_reaches_a_file() -> None:
    """The README's references moved to docs/ (issue 47): a link left pointing at the old
    place, or at a page's old neighbour, is found here."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += [ROOT / "infra" / "README.md", ROOT / "benchmarks" / "README.md"]
    links = [
        (page, target)
        for page in pages
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text())
        if not re.match(r"^(https?:|mailto:|#)", target)
    ]
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page, target in links
        if not (page.parent / target.split("#")[0]).exists()
    ]
    assert len(links) > 20 and broken == []
