"""The `sapo` command line: a thin layer over the ledger and (later) the flows.

Heavy libraries are imported inside the commands, so `sapo --help` stays quick.
"""

from __future__ import annotations

import os
import sys
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flows.env import apply_offline_defaults

if TYPE_CHECKING:
    import polars as pl

    from ledger import Ledger

app = typer.Typer(
    help="SAPO (Swarm sAmpling Policy Optimization): RL post-training across a swarm of nodes "
    "that share rollouts through an object store.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
ledger_app = typer.Typer(
    help="Query, sample, validate and compact a rollout ledger.", no_args_is_help=True
)
app.add_typer(ledger_app, name="ledger")

_STRING_OPTIONS = {"key", "secret", "token", "endpoint_url", "region", "url_style"}

UrlArg = Annotated[str, typer.Argument(help="Ledger root: a local path, file:// or s3://bkt/p.")]
StorageOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        "-o",
        help="key=value for the store (s3: key, secret, endpoint_url, region, url_style). "
        "Defaults come from the standard AWS_* environment variables.",
    ),
]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="table, csv or json.")]


def parse_storage_options(pairs: list[str] | None) -> dict[str, Any]:
    import yaml

    options: dict[str, Any] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"expected key=value, got {pair!r}", param_hint="-o")
        # Credentials stay strings ("0123" is not a number); other values get YAML types.
        options[name] = value if name in _STRING_OPTIONS else yaml.safe_load(value)
    return options


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(2)


def _open(url: str, storage_options: list[str] | None) -> Ledger:
    from ledger import Ledger

    try:
        return Ledger(url, parse_storage_options(storage_options))
    except (ValueError, RuntimeError) as exc:
        raise _fail(str(exc)) from exc


def print_frame(frame: pl.DataFrame, fmt: str) -> None:
    import polars as pl

    if fmt == "csv":
        sys.stdout.write(frame.write_csv())
    elif fmt == "json":
        sys.stdout.write(frame.write_json() + "\n")
    elif fmt == "table":
        with pl.Config(tbl_rows=200, tbl_cols=-1, fmt_str_lengths=60, tbl_width_chars=200):
            print(frame)
    else:
        raise _fail(f"unknown format {fmt!r}: use table, csv or json")


def _guarded(action: Any) -> Any:
    """Run ``action``, turning expected failures into a one-line error and exit code 2."""
    import duckdb

    from ledger import RecordError, StorageError

    try:
        return action()
    except (RecordError, StorageError, ValueError, duckdb.Error) as exc:
        raise _fail(str(exc).strip().splitlines()[0]) from exc


@ledger_app.command("query")
def ledger_query(
    url: UrlArg,
    sql: Annotated[
        str | None, typer.Argument(help="SQL over rollouts, groups, samples, ledger_files.")
    ] = None,
    dashboard: Annotated[
        str | None, typer.Option(help="Run a shipped query from dashboards/sql by name.")
    ] = None,
    fmt: FormatOpt = "table",
    storage_option: StorageOpt = None,
) -> None:
    """Run SQL over the ledger's views: rollouts, groups, samples, ledger_files."""
    import dashboards

    if (sql is None) == (dashboard is None):
        raise _fail(f"give SQL or --dashboard (one of: {', '.join(dashboards.names())})")
    text = dashboards.query(dashboard) if dashboard else str(sql)
    if text.startswith("@"):
        text = Path(text[1:]).read_text()
    with _open(url, storage_option) as led:
        print_frame(_guarded(lambda: led.query(text)), fmt)


@ledger_app.command("sample")
def ledger_sample(
    url: UrlArg,
    node_id: Annotated[str, typer.Option(help="The receiving node (never sampled from).")],
    groups: Annotated[int, typer.Option(help="How many peer groups (J).", min=0)],
    policy: Annotated[str, typer.Option(help="paper or reward_filtered.")] = "paper",
    seed: Annotated[int, typer.Option(help="Seed of the draw (replayable).")] = 0,
    swarm_id: Annotated[str | None, typer.Option(help="Only this swarm's groups.")] = None,
    min_mean_reward: Annotated[float | None, typer.Option(help="reward_filtered")] = None,
    max_mean_reward: Annotated[float | None, typer.Option(help="reward_filtered")] = None,
    max_age_s: Annotated[float | None, typer.Option(help="reward_filtered: recency")] = None,
    max_per_peer: Annotated[int | None, typer.Option(help="reward_filtered: cap")] = None,
    keep_zero_variance: Annotated[
        bool, typer.Option(help="reward_filtered: keep groups whose rewards all agree")
    ] = False,
    show_sql: Annotated[bool, typer.Option(help="Print the policy's SQL and stop.")] = False,
    fmt: FormatOpt = "table",
    storage_option: StorageOpt = None,
) -> None:
    """Draw whole peer groups for a node with a sampling policy written in SQL."""
    from pydantic import ValidationError

    from ledger import parse_policy

    spec: dict[str, Any] = {"kind": policy}
    extra = {
        "min_mean_reward": min_mean_reward,
        "max_mean_reward": max_mean_reward,
        "max_age_s": max_age_s,
        "max_per_peer": max_per_peer,
    }
    spec.update({k: val for k, val in extra.items() if val is not None})
    if keep_zero_variance:
        spec["require_variance"] = False
    try:
        chosen = parse_policy(spec)
    except ValidationError as exc:
        raise _fail(f"bad sampling policy: {exc.errors()[0]['msg']} ({spec})") from exc
    if show_sql:
        print(chosen.sql)
        return
    with _open(url, storage_option) as led:
        frame = _guarded(lambda: led.sample(node_id, groups, chosen, seed, swarm_id=swarm_id))
        print_frame(frame, fmt)


@ledger_app.command("validate")
def ledger_validate(
    url: UrlArg,
    strict: Annotated[bool, typer.Option(help="Exit 1 when anything was skipped.")] = False,
    storage_option: StorageOpt = None,
) -> None:
    """Read every object and report what a reader skips, and why."""
    with _open(url, storage_option) as led:
        report = _guarded(led.validate)
    print(f"ledger   {led.url}")
    print(f"files    {report.files} ({report.ok_files} readable)")
    print(f"rows     {report.rows} read, {report.valid_rows} valid in {report.groups} groups")
    for key, status, detail in report.bad_files:
        print(f"  skipped file {key}: {status}: {detail}")
    for reason, count in sorted(report.skipped.items()):
        print(f"  skipped {count:>8} x {reason}")
    if report.clean:
        print("clean: nothing skipped")
    elif strict:
        raise typer.Exit(1)


@ledger_app.command("compact")
def ledger_compact(
    url: UrlArg,
    node_id: Annotated[
        list[str] | None, typer.Option(help="Compact this node's partitions (repeatable).")
    ] = None,
    all_nodes: Annotated[bool, typer.Option(help="Rewrite every node's partitions.")] = False,
    swarm_id: Annotated[str | None, typer.Option(help="Only this swarm.")] = None,
    before: Annotated[
        str | None, typer.Option(help="Only days before this date (default: today, UTC).")
    ] = None,
    all_days: Annotated[bool, typer.Option(help="Include today's partitions.")] = False,
    min_files: Annotated[int, typer.Option(min=2)] = 2,
    target_rows: Annotated[int, typer.Option(min=1)] = 1_000_000,
    storage_option: StorageOpt = None,
) -> None:
    """Merge the small files of older partitions into few large ones."""
    if not node_id and not all_nodes:
        raise _fail("name the nodes to compact with --node-id, or pass --all-nodes")
    cutoff = date.max if all_days else (date.fromisoformat(before) if before else None)
    with _open(url, storage_option) as led:
        report = _guarded(
            lambda: led.compact(
                node_id,
                swarm_id=swarm_id,
                all_nodes=all_nodes,
                before=cutoff,
                min_files=min_files,
                target_rows=target_rows,
            )
        )
    print(
        f"compacted {report.files_in} files into {report.files_out} "
        f"({report.rows} rows, {report.jobs} partitions)"
    )
    for partition in report.skipped_partitions:
        print(f"  skipped {partition} (changed while compacting; run again)")


SwarmFileOpt = Annotated[
    Path | None,
    typer.Option("-c", "--config", help="Swarm YAML (default: the embedded CPU swarm)."),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override any key: --set defaults.grpo.learning_rate=1e-5"),
]
WorkdirOpt = Annotated[
    Path | None, typer.Option(help="Working directory (ledger, MLflow store, checkpoints).")
]


def _resolve(
    config: Path | None,
    overrides: list[str] | None,
    nodes: int | None = None,
    rounds: int | None = None,
    workdir: Path | None = None,
) -> Any:
    from pydantic import ValidationError

    from flows.swarm import resolve_swarm

    try:
        return resolve_swarm(config, overrides or [], nodes=nodes, rounds=rounds, workdir=workdir)
    except (ValidationError, ValueError, OSError) as exc:
        raise _fail(f"bad swarm configuration: {exc}") from exc


def _check_ledger(swarm: Any) -> None:
    from ledger import Ledger
    from ledger.storage import StorageError

    try:
        with Ledger.from_config(swarm.ledger_config()) as ledger:
            ledger.refresh()
    except (StorageError, OSError) as exc:
        raise _fail(f"ledger unreachable at {swarm.ledger_config().url}: {exc}") from exc


@app.command()
def swarm(
    config: SwarmFileOpt = None,
    nodes: Annotated[int | None, typer.Option(min=1, max=256, help="Number of nodes.")] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Rounds per node (total).")] = None,
    workdir: WorkdirOpt = None,
    overrides: SetOpt = None,
) -> None:
    """Run a local swarm: one process per node, no barrier, sharing through the ledger."""
    from flows.swarm import run_swarm, write_resolved

    cfg, data = _resolve(config, overrides, nodes, rounds, workdir)
    _check_ledger(cfg)
    resolved = write_resolved(cfg, data)
    specs = cfg.node_specs()
    print(
        f"swarm {cfg.swarm_id}: {len(specs)} nodes x {cfg.rounds} rounds; "
        f"ledger {cfg.ledger_config().url}; MLflow {cfg.tracking_uri()}"
    )
    failed = run_swarm(cfg, resolved)
    print(_where(cfg))
    if failed:
        raise _fail(f"{failed} node(s) failed")


@app.command()
def node(
    node_id: Annotated[str, typer.Option("--node-id", help="Which node of the swarm file.")],
    config: SwarmFileOpt = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Run until this round total.")] = None,
    more_rounds: Annotated[
        int | None, typer.Option(min=1, help="Run this many rounds past the checkpoint.")
    ] = None,
    workdir: WorkdirOpt = None,
    overrides: SetOpt = None,
    parent_run_id: Annotated[
        str | None, typer.Option(envvar="SAPO_PARENT_RUN_ID", help="MLflow parent run.")
    ] = None,
) -> None:
    """Run one node against any ledger URL (a swarm can span machines sharing a bucket)."""
    from flows.swarm import write_resolved

    cfg, data = _resolve(config, overrides, rounds=rounds, workdir=workdir)
    try:
        cfg.node_spec(node_id)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    _check_ledger(cfg)
    if os.environ.get("PREFECT_HOME"):
        Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    # The flow gets the resolved file, so a Prefect run records exactly what it ran.
    path = write_resolved(cfg, data, cfg.workdir_path() / "nodes" / node_id / "swarm.yaml")
    from flows.round import node_flow

    node_flow(
        node_id,
        swarm_file=str(path),
        until_round=cfg.rounds,
        more_rounds=more_rounds,
        parent_run_id=parent_run_id,
    )


@app.command()
def deploy(
    config: SwarmFileOpt = None,
    cron: Annotated[str | None, typer.Option(help="Cron schedule, e.g. '*/10 * * * *'.")] = None,
    interval: Annotated[
        float | None, typer.Option(min=1, help="Interval schedule in seconds.")
    ] = None,
    rounds_per_run: Annotated[int, typer.Option(min=1, help="Rounds each run adds.")] = 1,
    work_pool: Annotated[
        str | None, typer.Option(help="Register with this work pool (workers run them).")
    ] = None,
    serve: Annotated[
        bool, typer.Option(help="Run the schedules in this process until stopped.")
    ] = False,
    workdir: WorkdirOpt = None,
    overrides: SetOpt = None,
) -> None:
    """One Prefect deployment per node, on a cron or interval schedule."""
    from flows import deploy as deploying

    cfg, data = _resolve(config, overrides, workdir=workdir)
    if (cron is None) == (interval is None):
        raise _fail("give exactly one of --cron or --interval")
    if serve == (work_pool is not None):
        raise _fail("give exactly one of --serve or --work-pool NAME")
    if work_pool is not None:
        if not os.environ.get("PREFECT_API_URL"):
            raise _fail("--work-pool needs a Prefect server: set PREFECT_API_URL")
        ids = deploying.register_with_pool(
            cfg, data, work_pool=work_pool, cron=cron, interval_s=interval,
            rounds_per_run=rounds_per_run,
        )  # fmt: skip
        print(f"registered {len(ids)} deployments with work pool {work_pool!r}; run workers "
              f"with: prefect worker start --pool {work_pool}")  # fmt: skip
        return
    from prefect import serve as prefect_serve

    made = deploying.deployments(
        cfg, data, cron=cron, interval_s=interval, rounds_per_run=rounds_per_run
    )
    print(f"serving {len(made)} deployments of swarm {cfg.swarm_id}; Ctrl-C stops")
    prefect_serve(*made)


@app.command()
def experiment(
    config: Annotated[Path, typer.Option("-c", "--config", help="Experiment YAML (a sweep).")],
    dry_run: Annotated[
        bool, typer.Option(help="Validate the sweep and print its plan; train nothing.")
    ] = False,
    report_dir: Annotated[
        Path | None,
        typer.Option(help="Where the report goes (default <workdir>/reports/<experiment>)."),
    ] = None,
    overrides: SetOpt = None,
) -> None:
    """Run a sweep of sharing configurations (same seeds, tasks, models), then its report."""
    from pydantic import ValidationError

    from flows.experiment import format_plan, load_experiment

    try:
        exp = load_experiment(config, overrides or [])
    except (ValidationError, ValueError, OSError) as exc:
        raise _fail(f"bad experiment configuration: {exc}") from exc
    print(format_plan(exp))
    if dry_run:
        return
    if not os.environ.get("PREFECT_API_URL"):
        # The sweep's own ephemeral Prefect; each node process gets its own (flows/swarm.py).
        home = exp.workdir_path() / "prefect" / "experiment"
        home.mkdir(parents=True, exist_ok=True)
        os.environ["PREFECT_HOME"] = str(home)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from flows.experiment_flow import experiment_flow

    result = experiment_flow(
        str(config.resolve()),
        exp.experiment,
        overrides or [],
        str(report_dir.resolve()) if report_dir else None,
    )
    print(f"report: {result['report']}")
    if result["failed"]:
        raise _fail(f"{result['failed']} node(s) failed")


@app.command()
def report(
    ledger: Annotated[str, typer.Option(help="Ledger root: a path, file:// or s3://bkt/p.")],
    out: Annotated[Path, typer.Option(help="Folder for report.html, figures and report.json.")],
    mlflow: Annotated[
        str | None, typer.Option(help="MLflow tracking URI to cross-check against.")
    ] = None,
    experiment_name: Annotated[
        str | None, typer.Option("--experiment", help="Only this experiment's swarms.")
    ] = None,
    storage_option: StorageOpt = None,
) -> None:
    """Report a sharing sweep from its ledger: HTML page, PNG figures, summary table."""
    from flows.reporting import write_report

    made = _guarded(
        lambda: write_report(
            ledger,
            out,
            tracking_uri=mlflow,
            experiment=experiment_name,
            storage_options=parse_storage_options(storage_option),
        )
    )
    print(made.markdown)
    if made.check is not None:
        print(
            f"MLflow cross-check: {'consistent' if made.check.consistent else 'INCONSISTENT'} "
            f"({made.check.matched} node-rounds, max difference {made.check.max_abs_diff:.1e})"
        )
    print(f"report: {made.html}")


def _where(cfg: Any) -> str:
    return (
        f"ledger: {cfg.ledger_config().url}  (sapo ledger query {cfg.ledger_config().url} "
        f"--dashboard reward_per_node_round)\n"
        f"MLflow: mlflow ui --backend-store-uri {cfg.tracking_uri()}"
    )


@app.command()
def demo(
    workdir: WorkdirOpt = None,
    rounds: Annotated[int | None, typer.Option(min=1)] = None,
    nodes: Annotated[int | None, typer.Option(min=1, max=64)] = None,
    synthetic: Annotated[
        bool, typer.Option(help="Only exercise the ledger with synthetic nodes (no model).")
    ] = False,
) -> None:
    """The embedded CPU swarm (3 nodes, bundled model), then the ledger's dashboards."""
    if synthetic:
        from flows.demo import run_ledger_demo

        run_ledger_demo(
            workdir or Path("sapo-work"), nodes=max(2, nodes or 4), rounds=rounds or 5, out=print
        )
        return
    import polars as pl

    import dashboards
    from ledger import Ledger

    swarm(config=None, nodes=nodes, rounds=rounds, workdir=workdir, overrides=None)
    cfg, _ = _resolve(None, None, nodes=nodes, rounds=rounds, workdir=workdir)
    with Ledger.from_config(cfg.ledger_config()) as ledger:
        print(f"\nreward per node and round ({cfg.swarm_id}, claimed by each publisher):")
        frame = ledger.query(dashboards.query("reward_per_node_round"))
        print_frame(frame.filter(pl.col("swarm_id") == cfg.swarm_id), "table")


def main() -> None:
    apply_offline_defaults()
    app()


if __name__ == "__main__":
    main()
