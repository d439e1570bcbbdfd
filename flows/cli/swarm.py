"""`sapo swarm`, `sapo node` and `sapo demo`: running nodes (`sapo deploy`: flows/cli/deploy.py)."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli.common import (
    SetOpt,
    SwarmFileOpt,
    WorkdirOpt,
    fail,
    print_frame,
    require,
)
from flows.env import FORCE_ENV, LAUNCHED_ENV
from flows.limits import CHECKPOINT_KEEP_HELP, DEFAULT_WORKDIR, MAX_NODES

if TYPE_CHECKING:
    from flows.config import SwarmConfig
    from flows.node.checkpoint import Checkpoint


NodesOpt = Annotated[
    int | None, typer.Option(metavar="N", min=1, max=MAX_NODES, help="Number of nodes.")
]
RoundsOpt = Annotated[int | None, typer.Option(metavar="N", min=1, help="Rounds per node (total).")]
"""`sapo swarm`'s and `sapo deploy`'s sizes of the swarm, over the file's."""


def load(
    config: Path | None,
    overrides: list[str] | None,
    nodes: int | None = None,
    rounds: int | None = None,
    workdir: Path | None = None,
) -> SwarmConfig:
    """The swarm file resolved with flags and overrides, or a one-line error (exit 2)."""
    from flows.config import ConfigError, load_swarm

    try:
        return load_swarm(config, overrides or [], nodes=nodes, rounds=rounds, workdir=workdir)
    except ConfigError as exc:
        raise fail(f"bad swarm configuration: {exc}") from exc


def check_no_late_nodes(cfg: SwarmConfig, saved: dict[str, Checkpoint | None], force: bool) -> None:
    """`lifecycle.late_nodes`, said on the terminal: refused, or (``force``) stated."""
    from flows.node import lifecycle

    late = lifecycle.late_nodes(cfg, saved)
    if late is None:
        return
    done, new = late
    line = (
        f"swarm {cfg.swarm_id}: {', '.join(done)} finished {cfg.rounds} rounds; "
        f"{', '.join(new)} would start alone after them"
    )
    if force:
        typer.secho(f"{line} (--force)", err=True)
        return
    raise fail(
        f"{line}. Use another --workdir for a new swarm, --nodes {len(done)} for this one, "
        "or --force to add them"
    )


def check_models(swarm: SwarmConfig, node_ids: list[str] | None = None) -> None:
    """Fail in one line, before anything is created, when a node's model cannot load here
    (sapo_core.policy.loading.model_problem): a mistyped hub id is found now, not after
    a work folder, a key, a Prefect server and a traceback."""
    from sapo_core.policy.loading import model_problem

    for spec in swarm.nodes:
        if node_ids is None or spec.node_id in node_ids:
            problem = model_problem(spec.node.model)
            if problem:
                raise fail(f"{spec.node_id}: {problem}")


def check_ledger(swarm: SwarmConfig) -> None:
    """Fail before any model loads when the ledger cannot be listed or written: it lists
    the ledger, then declares the swarm's rules (a write the swarm's first node makes anyway,
    and a no-op once made), so a missing bucket or read-only credentials stop here."""
    from ledger import IdentityError, Ledger
    from ledger.retrying import first_line
    from ledger.storage import StorageError

    try:
        with Ledger(swarm.ledger) as ledger:
            ledger.refresh()
            ledger.declare_swarm(swarm.swarm_id, swarm.signatures, swarm.members())
    except (StorageError, OSError, IdentityError) as exc:
        raise fail(f"cannot use the ledger at {swarm.ledger.url}: {first_line(exc)}") from exc


class Keep(StrEnum):
    """What a node keeps when it finishes (SwarmConfig.checkpoint_keep)."""

    resume = "resume"
    final_model = "final-model"
    nothing = "nothing"


KeepOpt = Annotated[
    Keep | None,
    typer.Option(
        "--keep",
        help=CHECKPOINT_KEEP_HELP + " Default: the swarm file's checkpoint_keep (resume).",
    ),
]
DemoKeepOpt = Annotated[Keep, typer.Option("--keep", help=CHECKPOINT_KEEP_HELP)]


def with_keep(overrides: list[str] | None, keep: Keep | None) -> list[str]:
    """The --set overrides plus --keep's (a flag wins over a --set of the same key)."""
    return [*(overrides or []), *([f"checkpoint_keep={keep.value}"] if keep else [])]


ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        envvar=FORCE_ENV,
        help="Resume even if the configuration differs from the checkpoints'.",
    ),
]


def check_resume(
    cfg: SwarmConfig, node_ids: list[str], force: bool, more_rounds: int | None = None
) -> dict[str, Checkpoint | None]:
    """`lifecycle.check_resume`, said on the terminal: what was forced, or the refusal;
    the nodes' newest checkpoints it read (once), for the caller's own decisions."""
    from flows.node import lifecycle
    from flows.node.home import HomeUnreachable

    try:
        saved = lifecycle.newest_checkpoints(cfg, node_ids)
    except HomeUnreachable as exc:
        raise fail(str(exc)) from exc
    checked = lifecycle.check_resume(cfg, node_ids, force, more_rounds, saved)
    for line in checked.forced:
        typer.secho(line, err=True)
    if checked.refusal:
        raise fail(checked.refusal)
    return saved


def where(cfg: SwarmConfig) -> str:
    uri = cfg.tracking_uri()
    return (
        f"ledger: {cfg.ledger.url}  (sapo ledger query {cfg.ledger.url} "
        f"--dashboard reward_per_node_round)\n"
        f"MLflow: {uri if cfg.tracks_on_server() else f'mlflow ui --backend-store-uri {uri}'}"
    )


def swarm(
    config: SwarmFileOpt = None,
    nodes: NodesOpt = None,
    rounds: RoundsOpt = None,
    workdir: WorkdirOpt = None,
    overrides: SetOpt = None,
    force: ForceOpt = False,
    keep: KeepOpt = None,
) -> None:
    """Run a local swarm: one process per node, no barrier. Nodes share through the ledger."""
    require("flows")
    from flows.node.lifecycle import is_complete
    from flows.swarm.launcher import disk_line, run_swarm, write_resolved

    cfg = load(config, with_keep(overrides, keep), nodes, rounds, workdir)
    saved = check_resume(cfg, [spec.node_id for spec in cfg.nodes], force)
    check_no_late_nodes(cfg, saved, force)
    if force:
        os.environ[FORCE_ENV] = "1"  # the node processes it starts check again
    check_models(cfg)
    check_ledger(cfg)
    if is_complete(cfg, saved):
        final = any(c is not None and not c.resumable for c in saved.values())  # no state
        print(
            f"swarm {cfg.swarm_id}: every node has finished its {cfg.rounds} rounds; nothing "
            "to do"
            + (
                "; its nodes kept only their final models, so it cannot be continued"
                if final
                else " (--rounds N continues it)"
            )
        )
        print(where(cfg))
        return
    resolved = write_resolved(cfg)
    print(
        f"swarm {cfg.swarm_id}: {len(cfg.nodes)} nodes x {cfg.rounds} rounds; "
        f"ledger {cfg.ledger.url}; MLflow {cfg.tracking_uri()}"
    )
    failed = run_swarm(cfg, resolved, checked=saved)
    print(where(cfg))
    print(disk_line(cfg.workdir))
    if failed:
        raise fail(f"{failed} node(s) failed")


def node(
    node_id: Annotated[str, typer.Option("--node-id", help="Which node of the swarm file.")],
    config: SwarmFileOpt = None,
    rounds: Annotated[
        int | None, typer.Option(metavar="N", min=1, help="Run until this round total.")
    ] = None,
    more_rounds: Annotated[
        int | None,
        typer.Option(metavar="N", min=1, help="Run this many rounds past the checkpoint."),
    ] = None,
    workdir: WorkdirOpt = None,
    overrides: SetOpt = None,
    parent_run_id: Annotated[
        str | None, typer.Option(envvar="SAPO_PARENT_RUN_ID", help="MLflow parent run.")
    ] = None,
    force: ForceOpt = False,
) -> None:
    """Run one node against any ledger URL. A swarm can span machines sharing a bucket."""
    require("flows")
    from flows.config import ConfigError
    from flows.swarm.launcher import write_resolved

    cfg = load(config, overrides, rounds=rounds, workdir=workdir)
    try:
        cfg.node(node_id)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    from flows.node import lifecycle

    until_round = None if more_rounds else cfg.rounds  # --more-rounds may go past it
    # Decided once, here, and handed to the flow (which would otherwise decide itself).
    from flows.node.home import HomeUnreachable

    try:
        start = lifecycle.decide(
            cfg, node_id, force=force, until_round=until_round, more_rounds=more_rounds
        )
    except HomeUnreachable as exc:
        raise fail(str(exc)) from exc
    for line in start.forced:
        typer.secho(line, err=True)
    if start.refusal:
        raise fail(start.refusal)
    if start.said is not None:  # without starting Prefect (seconds) for a flow doing nothing
        print(start.said, flush=True)
        return
    if not start.checked_by_launcher:  # `sapo swarm` checked them before starting this
        check_models(cfg, [node_id])
        check_ledger(cfg)
    if os.environ.get("PREFECT_HOME"):
        Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    # What the node ran, beside its checkpoints; the flow gets the config itself (parsed
    # once), and Prefect records it as the run's parameter.
    write_resolved(cfg, cfg.workdir / "nodes" / node_id / "swarm.yaml")
    from flows.node.round import node_flow

    def run() -> None:
        node_flow(
            node_id,
            swarm=cfg,
            until_round=until_round,
            more_rounds=more_rounds,
            parent_run_id=parent_run_id,
            force=force,
            start=start,
        )

    if os.environ.get(LAUNCHED_ENV):  # its launcher stops it, and says where it resumes
        run()
        return
    from prefect.settings import PREFECT_HOME

    from flows.services.prefect_server import flows_outlive_ctrl_c
    from flows.stops import stop_signal
    from flows.swarm.stopping import SwarmStopped, stopped_lines

    try:
        with flows_outlive_ctrl_c(PREFECT_HOME.value()):  # $PREFECT_HOME, or ~/.prefect
            run()
    except BaseException as exc:  # a Ctrl-C mid-query comes as DuckDB's RuntimeError
        if (name := stop_signal(exc)) is None:
            raise
        raise SwarmStopped(name, stopped_lines(cfg.workdir, [node_id])) from None


def demo(
    workdir: WorkdirOpt = None,
    rounds: Annotated[
        int | None,
        typer.Option(metavar="N", min=1, help="Rounds per node (default: the swarm file's)."),
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(metavar="N", min=1, max=MAX_NODES, help="Nodes (default: the swarm file's)."),
    ] = None,
    synthetic: Annotated[
        bool, typer.Option(help="Only exercise the ledger with synthetic nodes (no model).")
    ] = False,
    keep: DemoKeepOpt = Keep.final_model,
) -> None:
    """The embedded CPU swarm (3 nodes, bundled model). Then its dashboards and report."""
    if synthetic:  # the ledger alone: the base install runs it
        from flows.swarm.demo import run_ledger_demo

        run_ledger_demo(
            workdir or DEFAULT_WORKDIR, nodes=max(2, nodes or 4), rounds=rounds or 5, out=print
        )
        return
    require("flows")
    import polars as pl

    import dashboards
    from ledger import Ledger

    swarm(config=None, nodes=nodes, rounds=rounds, workdir=workdir, overrides=None, keep=keep)
    cfg = load(None, with_keep(None, keep), nodes=nodes, rounds=rounds, workdir=workdir)
    with Ledger(cfg.ledger) as ledger:
        print(f"\nclaimed_reward per node and round ({cfg.swarm_id}, from the ledger):")
        frame = ledger.query(dashboards.query("reward_per_node_round"))
        print_frame(frame.filter(pl.col("swarm_id") == cfg.swarm_id), "table")
    write_demo_report(cfg)


def write_demo_report(cfg: SwarmConfig) -> None:
    """End the demo with the report of its ledger (figures and tables), when the
    dashboards extra is installed."""
    from importlib.util import find_spec

    if find_spec("matplotlib") is None:
        from flows.cli.common import install_hint

        print(f"for the report's figures: {install_hint('dashboards')}; then sapo report")
        return
    from flows.reports.report import report_ledger

    made = report_ledger(cfg.ledger.url, cfg.workdir / "report", tracking_uri=cfg.tracking_uri())
    print(f"report (figures and tables): {made.html}")
