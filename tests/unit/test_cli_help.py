"""Help a person reads at 80 columns without a second try (issue 47): no option's help cut
short, no `<bool>` beside every flag or `<list[str]>` for a repeatable option, every option
said, every choice listed (all sampling policies, every dashboard), every default given."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

import pytest
import typer
import typer.main
from typer.testing import CliRunner

import dashboards
from flows.cli import app
from ledger.policies import AnyPolicy


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    if isinstance(command, typer.core.TyperGroup):
        for name in command.list_commands(None):  # type: ignore[arg-type]
            yield from commands(command.get_command(None, name), (*path, name))  # type: ignore[arg-type]


ALL = list(commands(typer.main.get_command(app)))


def help_text(path: tuple[str, ...]) -> str:
    out = CliRunner().invoke(app, [*path, "--help"], terminal_width=80)
    assert out.exit_code == 0, out.output
    return out.output


@pytest.mark.parametrize(("path", "command"), ALL, ids=[" ".join(p) or "sapo" for p, _ in ALL])
def test_help_reads_at_80_columns_and_says_every_option(
    path: tuple[str, ...], command: Any
) -> None:
    text = help_text(path)
    lines = text.splitlines()
    assert [line for line in lines if len(line) > 80] == []
    for noise in ("…", "<bool>", "<list[", "<int range>", "{url}"):
        assert noise not in text, (noise, path)
    undocumented = [
        param.opts[0]
        for param in command.params
        if param.param_type_name == "option" and param.name != "help" and not param.help
    ]
    assert undocumented == [], path


def test_choices_and_defaults_are_listed() -> None:
    sample = help_text(("ledger", "sample"))
    for policy in get_args(AnyPolicy):
        assert f"{policy.model_fields['kind'].default} (" in " ".join(sample.split())
    query = " ".join(help_text(("ledger", "query")).split())
    assert all(name in query for name in dashboards.names())
    swarm = " ".join(help_text(("swarm",)).split())
    assert "Default: the swarm file's checkpoint_keep (resume)." in swarm
    demo = " ".join(help_text(("demo",)).split())
    assert "[default: final-model]" in demo and "--rounds N" in demo


@pytest.mark.parametrize(
    "path", [p for p, c in ALL if isinstance(c, typer.core.TyperGroup)], ids=lambda p: " ".join(p)
)
def test_a_groups_command_list_says_each_command_whole(path: tuple[str, ...]) -> None:
    """A listing ends each line at a sentence's end, never cut with '...' (each command's
    first sentence fits the column)."""
    listing = help_text(path).split("Commands:\n", 1)[1].splitlines()
    assert listing, path
    assert [line for line in listing if line.rstrip().endswith("...")] == [], path
