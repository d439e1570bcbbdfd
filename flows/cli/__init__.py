"""The `sapo` command line: a thin layer over the ledger and the flows.

One module per command group (ledger, swarm, sweep). Heavy libraries are imported inside
the commands, so `sapo --help` stays quick and `sapo ledger ...` runs on the base install
(no torch, Prefect or MLflow).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from flows.cli import ledger, swarm, sweep
from flows.cli.common import parse_storage_options
from flows.env import apply_offline_defaults

DEBUG_ENV = "SAPO_DEBUG"
"""Set (by ``--debug``, or by hand) to see tracebacks instead of one-line errors."""

app = typer.Typer(
    help="SAPO (Swarm sAmpling Policy Optimization): RL post-training across a swarm of nodes "
    "that share rollouts through an object store.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(ledger.app, name="ledger")
for command in (swarm.swarm, swarm.node, swarm.deploy, sweep.experiment, sweep.report, swarm.demo):
    app.command()(command)


def _version(show: bool) -> None:
    if show:
        from importlib.metadata import version

        print(f"sapo {version('sapo-swarm')}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")
    ] = False,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print sapo's version and exit."
        ),
    ] = False,
) -> None:
    if debug:
        os.environ[DEBUG_ENV] = "1"  # node processes the launcher starts inherit it


def main() -> None:
    """The `sapo` command: expected failures are already one line (exit 2); anything else
    is one line too, naming the exception, unless --debug asks for the traceback."""
    from flows.stopping import EXIT_STATUS, SwarmStopped

    apply_offline_defaults()
    try:
        app()
    except SwarmStopped as stopped:
        for line in stopped.lines:
            typer.echo(line, err=True)
        typer.echo(f"{stopped}: rerun the same command to resume", err=True)
        sys.exit(EXIT_STATUS)
    except Exception as exc:  # what no command anticipated
        if os.environ.get(DEBUG_ENV):
            raise
        lines = str(exc).strip().splitlines()
        detail = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        typer.secho(
            f"error: {detail} (rerun as `sapo --debug ...` for the traceback)",
            fg=typer.colors.RED,
            err=True,
        )
        sys.exit(2)


__all__ = ["app", "main", "parse_storage_options"]
