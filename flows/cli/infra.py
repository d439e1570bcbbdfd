"""`sapo infra up|down|status|restart`: the production-shaped stack from packages
(flows/services/stack.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import fail, require
from flows.limits import DEFAULT_WORKDIR

app = typer.Typer(
    help="PostgreSQL, S3, Prefect and MLflow here, without Docker. "
    "infra/docker-compose.yml is the same stack with Docker.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help (flows/cli/__init__.py)
)

HomeOpt = Annotated[
    Path, typer.Option("--home", help="Where the stack keeps its state, logs and data.")
]


@app.command()
def up(
    home: HomeOpt = DEFAULT_WORKDIR / "stack",
    host: Annotated[str, typer.Option(help="Address every service binds.")] = "127.0.0.1",
    s3_endpoint: Annotated[
        str | None, typer.Option(help="Use this S3 server (MinIO) instead of starting one.")
    ] = None,
    free_ports: Annotated[
        bool, typer.Option(help="Pick free ports instead of 5432, 9000, 4200 and 5000.")
    ] = False,
) -> None:
    """Start the stack; print its URLs and the variables clients export. What an earlier
    stack at --home kept (database, S3 objects) comes back."""
    require("infra")
    from flows.services import stack

    ports = dict.fromkeys(stack.DEFAULT_PORTS, 0) if free_ports else None
    try:
        started = stack.up(home, host=host, ports=ports, s3_endpoint=s3_endpoint)
    except stack.StackError as exc:
        raise fail(str(exc)) from exc
    described = stack.describe(started)
    for name in ("prefect", "mlflow", "s3", "ledger", "postgres"):
        print(f"{name:9s}{described[name]}")
    print("\n# on every machine that runs nodes or workers:")
    for name, value in described["env"].items():
        print(f"export {name}={value}")


@app.command()
def down(
    home: HomeOpt = DEFAULT_WORKDIR / "stack",
    purge: Annotated[
        bool,
        typer.Option(
            help="Also delete what the stack keeps: its database (Prefect's deployments, "
            "MLflow's runs and registry) and the S3 objects (ledger, models)."
        ),
    ] = False,
) -> None:
    """Stop everything the stack at --home started. What it holds is kept for the next
    `up` (moto's objects copied into --home first) unless --purge."""
    from flows.services import stack

    if purge and not (home / stack.STATE).is_file():  # nothing runs: only its data to delete
        try:
            gone = stack.purge_data(home.resolve())
        except ValueError as exc:
            raise fail(str(exc)) from exc
        print(f"purged: {', '.join(map(str, gone))}" if gone else f"no stack data at {home}")
        return
    try:
        stopped = stack.down(home, purge=purge)
    except stack.StackError as exc:
        raise fail(str(exc)) from exc
    print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
    print(f"purged the stack's data at {home}" if purge else f"its data is kept at {home}")


@app.command()
def restart(
    service: Annotated[str, typer.Argument(help="prefect or mlflow.")],
    home: HomeOpt = DEFAULT_WORKDIR / "stack",
) -> None:
    """Restart prefect or mlflow of the stack at --home, on the same port."""
    from flows.services import stack

    try:
        stack.restart(home, service)
    except stack.StackError as exc:
        raise fail(str(exc)) from exc
    print(f"restarted: {service}")


@app.command()
def status(
    home: HomeOpt = DEFAULT_WORKDIR / "stack",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Whether each service answers (exit 1 if one does not)."""
    from flows.services import stack

    try:
        answers = stack.status(home)
    except stack.StackError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print(json.dumps(answers))
    else:
        for name, ok in answers.items():
            print(f"{name:9s}{'up' if ok else 'DOWN'}")
    if not all(answers.values()):
        raise typer.Exit(1)
