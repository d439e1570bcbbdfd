"""`sapo ledger ...`: query, sample, validate and compact a rollout ledger, collect markers.

Needs only the base install (DuckDB, pyarrow, polars, s3fs): no torch, Prefect or MLflow.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from ledger import NodeKey

from flows.cli.common import (
    CELL_WIDTH,
    Format,
    FormatOpt,
    StorageOpt,
    UrlArg,
    fail,
    guarded,
    interruptible,
    key_values,
    open_ledger,
    print_frame,
)
from flows.cli.inert import inert_text

app = typer.Typer(
    help="Query, sample, validate and compact a rollout ledger.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help: read at 80 columns without cut options
)


def _dashboard_help() -> str:
    """The shipped queries by name (dashboards/sql), read from the package."""
    import dashboards

    return "Run a shipped query (dashboards/sql) by name: " + ", ".join(dashboards.names()) + "."


def _policy_help() -> str:
    """Each policy kind with its parameters, read from the policy models themselves."""
    from typing import get_args

    from ledger.policies import AnyPolicy

    kinds = []
    for model in get_args(AnyPolicy):  # every kind the ledger knows, fresh included
        fields = [name for name in model.model_fields if name != "kind"]
        kind = model.model_fields["kind"].default
        kinds.append(f"{kind} ({', '.join(fields) or 'no parameters'})")
    return "Policy kind: " + "; ".join(kinds) + "."


@app.command("query")
def query(
    url: UrlArg,
    sql: Annotated[
        str | None,
        typer.Argument(help="SQL over the views (see above); @FILE reads it from a file."),
    ] = None,
    dashboard: Annotated[str | None, typer.Option(metavar="NAME", help=_dashboard_help())] = None,
    fmt: FormatOpt = Format.table,
    storage_option: StorageOpt = None,
    cell_width: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=0,
            help="A table's text cells are cut at N characters; 0 shows them whole, wrapped.",
        ),
    ] = CELL_WIDTH,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-p",
            metavar="NAME=VALUE",
            help="Bind $NAME in the SQL (repeatable). VALUE is read as YAML: numbers, true, "
            "null, [a, b]; else text.",
        ),
    ] = None,
) -> None:
    """SQL over the ledger. Its views: rollouts, groups, samples, manifests, evaluations,
    trainings, ledger_files. `$name` parameters are bound with --param name=value."""
    import dashboards

    if (sql is None) == (dashboard is None):
        raise fail(f"give SQL or --dashboard (one of: {', '.join(dashboards.names())})")
    if dashboard is not None:
        if dashboard not in dashboards.names():
            raise fail(f"no dashboard {dashboard!r}; one of: {', '.join(dashboards.names())}")
        text = dashboards.runnable(dashboard)  # with the tables it reads from other queries
    else:
        text = str(sql)
    with open_ledger(url, storage_option) as led:
        if text.startswith("@"):
            try:
                text = Path(text[1:]).read_text()
            except OSError as exc:
                raise fail(f"cannot read the query file {text[1:]}: {exc.strerror or exc}") from exc
        params = query_params(param)
        with interruptible(led.con):  # a user's SQL may run for minutes
            frame = guarded(lambda: led.query(text, params or None))
        print_frame(frame, fmt, cell_width)


def query_params(pairs: list[str] | None) -> dict[str, Any]:
    """``--param NAME=VALUE`` options as DuckDB's named parameters, each value read as YAML
    as `sapo ledger sample -p` reads them (``3``, ``null``, ``[a, b]``; else the text)."""
    return {
        name.removeprefix("$"): value for name, value in key_values(pairs, hint="--param").items()
    }


@app.command("sample")
def sample(
    url: UrlArg,
    node_id: Annotated[str, typer.Option(help="The receiving node (never sampled from).")],
    groups: Annotated[int, typer.Option(metavar="N", help="How many peer groups (J).", min=0)],
    policy: Annotated[str, typer.Option(help=_policy_help())] = "paper",
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-p",
            metavar="KEY=VALUE",
            help="A policy parameter as key=value (repeatable), e.g. -p max_per_peer=1 "
            "-p min_std=0.1; checked by the policy's model.",
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of a public draw (replayable by anyone); see --key.")
    ] = 0,
    swarm_id: Annotated[str | None, typer.Option(help="Only this swarm's groups.")] = None,
    key: Annotated[
        Path | None,
        typer.Option(
            metavar="PEM",
            help="The node's key (<workdir>/keys/SWARM/NODE.pem, with --swarm-id and --round): "
            "replay the draw the node made that round, keyed by its secret.",
        ),
    ] = None,
    node_round: Annotated[
        int | None,
        typer.Option(
            "--round", min=0, metavar="R", help="The node's round the draw is for (with --key)."
        ),
    ] = None,
    rows_per_group: Annotated[
        int | None,
        typer.Option(min=2, metavar="G", help="At most G rows of each group, as the node keeps."),
    ] = None,
    show_sql: Annotated[bool, typer.Option(help="Print the policy's SQL and stop.")] = False,
    fmt: FormatOpt = Format.table,
    storage_option: StorageOpt = None,
) -> None:
    """Draw peer groups for a node.

    As the node would train on them: none of its own completions, at most G rows a group.
    Each sampling policy is written in SQL. A node's own draws are keyed by a secret only it
    holds: --key replays one."""
    from pydantic import ValidationError

    from ledger import parse_policy

    spec = {**key_values(param, hint="--param"), "kind": policy}
    try:
        chosen = parse_policy(spec)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"][1:]) or "kind"
        raise fail(f"bad sampling policy {policy!r}: {where}: {error['msg']}") from exc
    if show_sql:
        print(chosen.full_sql)
        return
    draw_key = None
    if key is not None:
        if swarm_id is None or node_round is None:
            raise fail("--key replays a node's draw: give --swarm-id and --round too")
        from ledger import IdentityError, NodeKey
        from ledger.draws import round_draw_key

        try:
            secret = NodeKey.load(key, swarm_id, node_id).draw_secret()
        except (IdentityError, ValueError) as exc:
            raise fail(str(exc)) from exc
        draw_key = round_draw_key(secret, swarm_id, node_id, node_round)
    with open_ledger(url, storage_option) as led:
        frame = guarded(
            lambda: led.sample(
                node_id,
                groups,
                chosen,
                seed,
                swarm_id=swarm_id,
                for_round=node_round,
                draw_key=draw_key,
                rows_per_group=rows_per_group,
            )
        )
        print_frame(frame, fmt)


@app.command("validate")
def validate(
    url: UrlArg,
    strict: Annotated[bool, typer.Option(help="Exit 1 when anything was skipped.")] = False,
    storage_option: StorageOpt = None,
) -> None:
    """Read every object; report what a reader skips, and why."""
    with open_ledger(url, storage_option) as led:
        report = guarded(led.validate)
    print(f"ledger   {led.url}")
    print(f"files    {report.files} ({report.ok_files} readable)")
    print(f"rows     {report.rows} read, {report.valid_rows} valid in {report.groups} groups")
    for key, status, detail in report.bad_files:
        print(inert_text(f"  skipped file {key}: {status}: {detail}"))
    for reason, count in sorted(report.skipped.items()):
        print(f"  skipped {count:>8} x {reason}")
    if report.clean:
        print("clean: nothing skipped")
    elif strict:
        raise typer.Exit(1)


@app.command("credentials")
def credentials(
    url: Annotated[str, typer.Argument(metavar="URL", help="The ledger: s3://bucket/prefix.")],
    swarm_id: Annotated[str, typer.Option("--swarm-id", help="The node's swarm.")],
    node_id: Annotated[str, typer.Option("--node-id", help="The node.")],
    alias: Annotated[str, typer.Option(help="The mc alias of the MinIO server.")] = "sapo",
    policy_only: Annotated[bool, typer.Option(help="Print only the IAM policy JSON.")] = False,
) -> None:
    """Print one node's write policy (its own prefixes only). Then the mc commands that
    make a MinIO user with it (infra/README.md)."""
    import json
    from urllib.parse import urlparse

    from ledger.credentials import minio_commands, node_policy

    parsed = urlparse(url)
    if parsed.scheme not in ("s3", "s3a") or not parsed.netloc:
        fail(f"credentials are for s3:// ledgers, not {url!r}")
    try:
        if policy_only:
            print(json.dumps(node_policy(parsed.netloc, parsed.path, swarm_id, node_id), indent=2))
        else:
            print(minio_commands(alias, parsed.netloc, parsed.path, swarm_id, node_id))
    except ValueError as exc:
        fail(str(exc))


@app.command("compact")
def compact(
    url: UrlArg,
    node_id: Annotated[
        list[str] | None,
        typer.Option(metavar="NODE_ID", help="Compact this node's partitions (repeatable)."),
    ] = None,
    all_nodes: Annotated[bool, typer.Option(help="Rewrite every node's partitions.")] = False,
    swarm_id: Annotated[str | None, typer.Option(help="Only this swarm.")] = None,
    before: Annotated[
        str | None, typer.Option(help="Only days before this date, YYYY-MM-DD (default: today).")
    ] = None,
    all_days: Annotated[bool, typer.Option(help="Include today's partitions.")] = False,
    min_files: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=2,
            help="Merge a partition only when it holds at least this many files.",
        ),
    ] = 2,
    target_rows: Annotated[
        int, typer.Option(metavar="N", min=1, help="Rows a merged file holds at most.")
    ] = 1_000_000,
    key: Annotated[
        Path | None,
        typer.Option(
            help="The node's signing key (<workdir>/keys/<swarm>/<node>.pem), with --swarm-id "
            "and one --node-id: a swarm that requires signatures is compacted by its nodes only."
        ),
    ] = None,
    storage_option: StorageOpt = None,
) -> None:
    """Merge older partitions' small files into large ones."""
    if not node_id and not all_nodes:
        raise fail("name the nodes to compact with --node-id, or pass --all-nodes")
    signer = _signer(key, swarm_id, node_id) if key is not None else None
    cutoff = date.max if all_days else (_day(before) if before else None)
    with open_ledger(url, storage_option, signer) as led:
        report = guarded(
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
    for partition in report.unsigned_partitions:
        print(
            f"  skipped {partition}: its node signs its files (its swarm's rules, or its "
            "registered key), so only it can compact them "
            "(--key <workdir>/keys/<swarm>/<node>.pem --swarm-id ... --node-id ...)"
        )
    if report.unsigned_partitions:  # what was asked was not done
        raise typer.Exit(1)


@app.command("collect-markers")
def collect_markers(url: UrlArg, storage_option: StorageOpt = None) -> None:
    """Delete change-log markers no reader needs any more. Every node's markers older than
    twice the full-listing period: nodes collect their own once an hour; this is the
    operator's sweep, e.g. after nodes have left."""
    with open_ledger(url, storage_option) as led:
        collected = guarded(led.collect_markers)
    print(f"collected {collected} change-log markers")


def _signer(key: Path, swarm_id: str | None, node_ids: list[str] | None) -> NodeKey:
    """The node key --key names, for the one swarm and node it signs for."""
    from ledger import IdentityError, NodeKey

    if swarm_id is None or not node_ids or len(node_ids) != 1:
        raise fail("--key signs for one node: give --swarm-id and exactly one --node-id")
    try:
        return NodeKey.load(key, swarm_id, node_ids[0])
    except IdentityError as exc:
        raise fail(str(exc)) from exc


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError as exc:
        raise fail(f"--before {text!r} is not a date (YYYY-MM-DD)") from exc
