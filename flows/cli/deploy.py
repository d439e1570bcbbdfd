"""`sapo deploy` (one Prefect deployment per node, on a schedule) and `sapo deployments`
(how far each deployed node is): flows/services/deploy.py does the work."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli.common import SetOpt, SwarmFileOpt, WorkdirOpt, fail, guarded, print_frame, require
from flows.cli.swarm import NodesOpt, RoundsOpt, load

if TYPE_CHECKING:
    from flows.config import SwarmConfig

FINISHED_POLL_S = 5.0
"""How often `--serve` looks whether every node has finished."""


def deploy(
    config: SwarmFileOpt = None,
    cron: Annotated[str | None, typer.Option(help="Cron schedule, e.g. '*/10 * * * *'.")] = None,
    interval: Annotated[
        float | None, typer.Option(metavar="SECONDS", min=1, help="Interval schedule in seconds.")
    ] = None,
    rounds_per_run: Annotated[
        int, typer.Option(metavar="N", min=1, help="Rounds each run adds.")
    ] = 1,
    work_pool: Annotated[
        str | None, typer.Option(help="Register with this work pool (workers run them).")
    ] = None,
    serve: Annotated[
        bool, typer.Option(help="Run the schedules in this process until stopped.")
    ] = False,
    pin: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NODE=QUEUE",
            help="The node's runs go to that work queue, which one machine's "
            "worker polls (--work-pool only; repeatable).",
        ),
    ] = None,
    nodes: NodesOpt = None,
    rounds: RoundsOpt = None,
    workdir: WorkdirOpt = None,
    overrides: SetOpt = None,
) -> None:
    """One Prefect deployment per node, on a schedule. Give it --cron or --interval.
    --nodes and --rounds size the swarm as they do for `sapo swarm`."""
    require("flows")
    from flows.services import deploy as deploying
    from ledger.storage import is_local_url

    cfg = load(config, overrides, nodes, rounds, workdir)
    if (cron is None) == (interval is None):
        raise fail("give exactly one of --cron or --interval")
    if serve == (work_pool is not None):
        raise fail("give exactly one of --serve or --work-pool NAME")
    if work_pool is not None:
        server = cfg.prefect_api_url()
        if not server:
            raise fail("--work-pool needs a Prefect server: set PREFECT_API_URL or prefect.api_url")
        os.environ["PREFECT_API_URL"] = server  # before Prefect is imported
        queues = pinned_queues(pin)
        ids = guarded(
            lambda: deploying.register_with_pool(
                cfg,
                work_pool=work_pool,
                cron=cron,
                interval_s=interval,
                rounds_per_run=rounds_per_run,
                queues=queues,
            )
        )
        print(
            f"registered {len(ids)} deployments with work pool {work_pool!r}; on each machine "
            f"run a worker: SAPO_WORKDIR=<its folder> prefect worker start --pool {work_pool}"
            + (" --work-queue QUEUE" if queues else "")
        )
        if is_local_url(cfg.ledger.url):
            typer.secho(
                f"note: the ledger is a local folder ({cfg.ledger.url}): only workers on this "
                "machine share it; give other machines a bucket (ledger.url=s3://...)",
                err=True,
            )
        if cfg.tracking.enabled and not cfg.tracks_on_server():
            typer.secho(
                "note: MLflow is a local file here: each machine tracks in its own unless "
                "its worker exports MLFLOW_TRACKING_URI (or set tracking.uri=http://...)",
                err=True,
            )
        return
    if pin:
        raise fail("--pin goes with --work-pool")
    api = cfg.prefect_api_url()
    if api:
        os.environ["PREFECT_API_URL"] = api  # before Prefect is imported
        serve_deployments(cfg, cron, interval, rounds_per_run, api)
        return
    # Schedules need a server: Prefect's ephemeral mode creates no scheduled runs.
    from flows.services.prefect_server import local_prefect_server

    with local_prefect_server(deploying.local_server_home(cfg)) as api:
        os.environ["PREFECT_API_URL"] = api  # before Prefect is imported
        print(f"started a Prefect server for these schedules at {api.removesuffix('/api')}")
        serve_deployments(cfg, cron, interval, rounds_per_run, api)


def pinned_queues(pins: list[str] | None) -> dict[str, str]:
    """``--pin NODE=QUEUE`` options as node id -> work queue."""
    out = {}
    for pin in pins or []:
        node, sep, queue = pin.partition("=")
        if not (sep and node and queue):
            raise fail(f"--pin takes NODE=QUEUE, got {pin!r}")
        out[node] = queue
    return out


def serve_deployments(
    cfg: SwarmConfig, cron: str | None, interval: float | None, rounds_per_run: int, api: str
) -> None:
    """Serve the swarm's deployments in this process until every node has finished (each
    node's last run pauses its schedule; then this returns) or Ctrl-C. Ctrl-C stops as
    SIGTERM does, also with a round in flight: that run is cancelled, and the node's next
    run resumes from its checkpoint."""
    from prefect.runner import Runner

    from flows.services import deploy as deploying

    made = deploying.deployments(cfg, cron=cron, interval_s=interval, rounds_per_run=rounds_per_run)
    # The runs this process starts are tagged sapo like a work pool's: they must beat as
    # often, or a server with `ensure_crash_detection` would crash them.
    os.environ.update(deploying.HEARTBEAT_ENV)
    runner = Runner(pause_on_shutdown=True)
    for deployment in made:
        runner.add_deployment(deployment)
    first = f"sapo-node/{cfg.swarm_id}-{cfg.nodes[0].node_id}"
    print(
        f"serving {len(made)} deployments of swarm {cfg.swarm_id}; Ctrl-C stops. A run now, "
        f"from another terminal: PREFECT_API_URL={api} prefect deployment run '{first}'",
        flush=True,
    )
    # Prefect's serve left SIGINT to asyncio, whose cancellation waited for the round in
    # flight to end: Ctrl-C seemed to do nothing. SIGTERM's handler stops at once.
    signal.signal(signal.SIGINT, runner.handle_sigterm)
    done = threading.Event()
    # The runs keep their nodes' state where $SAPO_WORKDIR says, when it is set (node_flow).
    from flows.config import WORKDIR_ENV

    here = os.environ.get(WORKDIR_ENV)
    watched = cfg.model_copy(update={"workdir": Path(here).resolve()}) if here else cfg
    watcher = threading.Thread(
        target=_stop_when_finished, args=(watched, runner, done), name="sapo-finished",
        daemon=True,
    )  # fmt: skip
    watcher.start()
    try:
        asyncio.run(runner.start())
    finally:
        done.set()
    if deploying.swarm_finished(watched):
        print(f"every node of swarm {cfg.swarm_id} has finished its {cfg.rounds} rounds")


def _stop_when_finished(cfg: SwarmConfig, runner: object, done: threading.Event) -> None:
    """Stop serving once every node has finished and no run of theirs is in flight."""
    from flows.services import deploy as deploying

    quiet = 0  # polls in a row that found every node finished and no run in flight
    while not done.wait(FINISHED_POLL_S):
        try:
            finished = deploying.swarm_finished(cfg) and not deploying.runs_in_flight(cfg)
        except Exception:  # the server away a moment: ask again at the next poll
            continue
        quiet = quiet + 1 if finished else 0
        # Twice in a row: a run reports Completed before its process exits, and stopping
        # the runner then would cancel that run (seen: the finishing run marked Cancelled).
        if quiet >= 2:
            os.kill(os.getpid(), signal.SIGTERM)
            return


def deployments(
    config: SwarmFileOpt = None,
    nodes: NodesOpt = None,
    rounds: RoundsOpt = None,
    workdir: WorkdirOpt = None,
    overrides: SetOpt = None,
) -> None:
    """How far each deployed node is, and its schedule.

    Its schedule (active or paused), the rounds its ledger rows show, its last run and its
    next one. The Prefect server is PREFECT_API_URL, prefect.api_url, or the one `sapo deploy
    --serve` started for this swarm."""
    require("flows")
    from flows.services.deploy import served_api

    cfg = load(config, overrides, nodes, rounds, workdir)
    api = cfg.prefect_api_url() or served_api(cfg)
    if not api:
        raise fail(
            "no Prefect server: set PREFECT_API_URL (or prefect.api_url), or run "
            "`sapo deploy --serve` for this swarm"
        )
    os.environ["PREFECT_API_URL"] = api  # before Prefect is imported
    from flows.services import deploy as deploying

    frame = guarded(lambda: deploying.progress(cfg))
    print_frame(frame, "table", cell_width=0)
