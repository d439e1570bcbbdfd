"""The `sapo` command line: a thin layer over the ledger and the flows.

One module per command group (ledger, swarm, deploy, sweep, infra, vllm). Heavy libraries are
imported inside the commands, so `sapo --help` stays quick and `sapo ledger ...` runs on the base
install (no torch, Prefect or MLflow).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, NoReturn

import typer

from flows.cli import deploy, infra, ledger, swarm, sweep, vllm
from flows.cli.common import parse_storage_options
from flows.cli.inert import inert_logs, inert_text
from flows.env import apply_offline_defaults

DEBUG_ENV = "SAPO_DEBUG"
"""Set (by ``--debug``, or by hand) to see tracebacks instead of one-line errors."""

app = typer.Typer(
    help="SAPO (Swarm sAmpling Policy Optimization): RL post-training across a swarm of nodes "
    "that share rollouts through an object store.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain help: rich's boxes cut options' help at 80 columns ("...") and print <bool>
    # beside every flag.
    rich_markup_mode=None,
)
app.add_typer(ledger.app, name="ledger")
app.add_typer(infra.app, name="infra")
app.add_typer(vllm.app, name="vllm")
for command in (
    swarm.swarm,
    swarm.node,
    deploy.deploy,
    deploy.deployments,
    sweep.experiment,
    sweep.report,
    sweep.compare,
    swarm.demo,
):
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
    """The `sapo` command: expected failures are already one line (exit 2); a usage error
    (unknown option, bad value, missing argument) is one line too, and so is anything else,
    naming the exception, unless --debug asks for the traceback."""
    from typer._click.exceptions import NoArgsIsHelpError, UsageError

    from flows.stops import stop_signal
    from flows.swarm.stopping import EXIT_STATUS, SwarmStopped

    try:
        apply_offline_defaults()  # inside: a bad SAPO_MMAP_THRESHOLD is one line too
        inert_logs()  # peers' text in log lines reaches no terminal as control codes
        # Not standalone: click would print usage errors as a boxed block, and exit itself.
        status = app(prog_name="sapo", standalone_mode=False)
    except NoArgsIsHelpError as asked:  # `sapo` or `sapo ledger` alone: its help
        if asked.ctx is not None:
            typer.echo(asked.ctx.get_help())
        sys.exit(0)
    except UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "sapo"
        # typer words a rejected choice "Value error, 'x' is not one of ..."
        message = exc.format_message().replace("Value error, ", "")
        typer.secho(f"error: {message} (see `{where} --help`)", fg=typer.colors.RED, err=True)
        sys.exit(2)
    except typer.Abort:  # Ctrl-C outside a swarm, as click (and older typer) raise it
        status = EXIT_STATUS
    except SwarmStopped as stopped:
        for line in stopped.lines:
            typer.echo(line, err=True)
        typer.echo(f"{stopped}: rerun the same command to resume", err=True)
        sys.exit(EXIT_STATUS)
    except Exception as exc:  # what no command anticipated
        if stop_signal(exc) is None:  # else Ctrl-C mid-query: DuckDB's RuntimeError from it
            if os.environ.get(DEBUG_ENV):
                raise
            _unanticipated(exc)
        status = EXIT_STATUS
    if status == EXIT_STATUS:
        # Ctrl-C outside a swarm (a swarm handles its own), however it came: today's typer
        # turns the KeyboardInterrupt into Exit(130), which a non-standalone app returns
        # silently; click raises Abort; DuckDB mid-query a RuntimeError.
        typer.echo("aborted", err=True)
    sys.exit(status if isinstance(status, int) else 0)


def _unanticipated(exc: Exception) -> NoReturn:
    """One line naming the exception, exit status 2."""
    lines = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {inert_text(lines[0])}" if lines else type(exc).__name__
    typer.secho(
        f"error: {detail} (rerun as `sapo --debug ...` for the traceback)",
        fg=typer.colors.RED,
        err=True,
    )
    sys.exit(2)


__all__ = ["app", "main", "parse_storage_options"]
