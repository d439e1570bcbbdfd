"""The `sapo` command line: a thin layer over the ledger and the flows.

One module per command group (ledger, swarm, sweep). Heavy libraries are imported inside
the commands, so `sapo --help` stays quick and `sapo ledger ...` runs on the base install
(no torch, Prefect or MLflow).
"""

from __future__ import annotations

import typer

from flows.cli import ledger, swarm, sweep
from flows.cli.common import parse_storage_options
from flows.env import apply_offline_defaults

app = typer.Typer(
    help="SAPO (Swarm sAmpling Policy Optimization): RL post-training across a swarm of nodes "
    "that share rollouts through an object store.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(ledger.app, name="ledger")
for command in (swarm.swarm, swarm.node, swarm.deploy, sweep.experiment, sweep.report, swarm.demo):
    app.command()(command)


def main() -> None:
    apply_offline_defaults()
    app()


__all__ = ["app", "main", "parse_storage_options"]
