"""What every command group shares: option types, output formats, one-line errors."""

from __future__ import annotations

import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from ledger import Ledger, NodeKey

T = TypeVar("T")

# Credentials stay strings ("0123" is not a number); other storage values get YAML types.
_STRING_OPTIONS = frozenset({"key", "secret", "token", "endpoint_url", "region", "url_style"})

UrlArg = Annotated[
    str, typer.Argument(metavar="URL", help="Ledger root: a local path, file:// or s3://bkt/p.")
]
StorageOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        "-o",
        metavar="KEY=VALUE",
        help="key=value for the store (s3: key, secret, endpoint_url, region, url_style). "
        "Defaults come from the standard AWS_* environment variables.",
    ),
]


class Format(StrEnum):
    """How a command prints a table."""

    table = "table"
    csv = "csv"
    json = "json"


FormatOpt = Annotated[
    Format,
    typer.Option(
        "--format",
        "-f",
        help="Table and CSV escape control characters and neutralise "
        "spreadsheet formulas (peers wrote the text); JSON is the lossless form.",
    ),
]
SwarmFileOpt = Annotated[
    Path | None,
    typer.Option("-c", "--config", help="Swarm YAML (default: the embedded CPU swarm)."),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override any key of the swarm file (repeatable): --set "
        "defaults.grpo.learning_rate=1e-5",
    ),
]
WorkdirOpt = Annotated[
    Path | None, typer.Option(help="Working directory (ledger, MLflow store, checkpoints).")
]


# What each extra brings that commands beyond `sapo ledger` import (pyproject.toml).
EXTRAS = {
    "flows": ("torch", "transformers", "reasoning_gym", "prefect", "mlflow", "rich"),
    "dashboards": ("matplotlib",),
    "infra": ("prefect", "mlflow", "psycopg", "moto"),
}


def require(extra: str, *modules: str) -> None:
    """Stop with one line naming the extra to install when its packages are missing."""
    from importlib.util import find_spec

    missing = [m for m in modules or EXTRAS[extra] if find_spec(m) is None]
    if missing:
        raise fail(
            f"this command needs the {extra!r} extra ({', '.join(missing)} not installed): "
            f"{install_hint(extra)}"
        )


def install_hint(extra: str) -> str:
    """The pip command that adds ``extra`` to this install (sapo is not on the package
    index): from the checkout it runs from, else from where pip installed it from."""
    import json
    from importlib.metadata import PackageNotFoundError, distribution

    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():  # running from a checkout (an editable install)
        return f"pip install -e '{root}[{extra}]'"
    try:
        dist = distribution("sapo-swarm")
    except PackageNotFoundError:  # neither a checkout nor installed: the wheel, unversioned
        return hint_from_direct_url(None, extra, "<version>")
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:  # pip's record unreadable: the wheel of this version
        direct = None
    return hint_from_direct_url(direct, extra, dist.version)


def hint_from_direct_url(direct: dict[str, Any] | None, extra: str, version: str) -> str:
    """The pip command for ``extra`` given what pip recorded of the install's origin
    (PEP 610's direct_url.json: a folder, editable or not, an archive such as a wheel, or
    a repository), else the wheel by name."""
    from shlex import quote
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    direct = direct or {}
    url = str(direct.get("url", ""))
    if url.startswith("file:"):
        where = url2pathname(urlparse(url).path)
        if "dir_info" in direct:
            editable = "-e " if direct["dir_info"].get("editable") else ""
            origin = "the checkout this was installed from"
            return f"pip install {editable}{quote(f'{where}[{extra}]')} ({origin})"
        return f"pip install {quote(f'{where}[{extra}]')} (the file this was installed from)"
    vcs = direct.get("vcs_info")
    if vcs:
        pinned = f"{vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id', '')}".rstrip("@")
        origin = "the repository this was installed from"
        return f"pip install {quote(f'sapo-swarm[{extra}] @ {pinned}')} ({origin})"
    return (
        f"pip install 'sapo_swarm-{version}-py3-none-any.whl[{extra}]' (the wheel this was "
        "installed from; `pip wheel --no-deps -w dist .` in a checkout builds it)"
    )


def fail(message: str) -> typer.Exit:
    """Print `error: <message>` (one line, made inert: it may quote a peer's text) and give
    the exit to raise (status 2)."""
    from flows.cli.inert import inert_text

    typer.secho(f"error: {inert_text(message)}", fg=typer.colors.RED, err=True)
    return typer.Exit(2)


def key_values(
    pairs: list[str] | None, *, hint: str, strings: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """`key=value` pairs; values parsed as YAML (numbers, booleans, null) except `strings`."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"expected key=value, got {pair!r}", param_hint=hint)
        try:
            out[name] = value if name in strings else yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise typer.BadParameter(f"{pair!r}: the value is not YAML", param_hint=hint) from exc
    return out


def parse_storage_options(pairs: list[str] | None) -> dict[str, Any]:
    return key_values(pairs, hint="-o", strings=_STRING_OPTIONS)


def open_ledger(
    url: str, storage_options: list[str] | None, signer: NodeKey | None = None
) -> Ledger:
    """An existing ledger to read: a path or bucket that does not exist is an error here, not
    an empty ledger (only writers create one). A ``signer`` signs what it writes (compaction)."""
    from ledger import Ledger, LedgerConfig
    from ledger.retrying import first_line

    try:
        config = LedgerConfig.model_validate(
            {"url": url, "storage_options": parse_storage_options(storage_options)}
        )
        led = Ledger(config, signer=signer)
    except (ValueError, RuntimeError) as exc:
        raise fail(str(exc)) from exc
    try:
        led.store.check_exists()
    except (ValueError, RuntimeError) as exc:
        led.close()
        raise fail(first_line(exc)) from exc
    return led


CELL_WIDTH = 60
"""Characters of a text cell a table shows; the rest is cut (`--cell-width`)."""


def print_frame(frame: pl.DataFrame, fmt: str, cell_width: int = CELL_WIDTH) -> None:
    """Print a frame of ledger values: table and CSV made inert (flows/cli/inert.py: no
    control character reaches the terminal, no cell runs as a spreadsheet formula); JSON
    escapes by itself. A table cuts text cells at ``cell_width`` characters; 0 shows them
    whole, wrapped within their column to the terminal's width."""
    import shutil

    import polars as pl

    from flows.cli.inert import inert_frame

    if fmt == "csv":
        sys.stdout.write(inert_frame(frame, for_csv=True).write_csv())
    elif fmt == "json":
        sys.stdout.write(frame.write_json() + "\n")
    elif fmt == "table":
        if cell_width:
            lengths, width = cell_width, 200
        else:  # whole cells, wrapped in their columns
            lengths, width = 1_000_000, shutil.get_terminal_size((200, 50)).columns
        with pl.Config(tbl_rows=200, tbl_cols=-1, fmt_str_lengths=lengths, tbl_width_chars=width):
            print(inert_frame(frame, for_csv=False))
    else:
        raise fail(f"unknown format {fmt!r}: use table, csv or json")


def guarded(action: Callable[[], T]) -> T:
    """Run `action`, turning expected failures into a one-line error and exit code 2."""
    import duckdb

    from ledger import RecordError, StorageError

    try:
        return action()
    except (RecordError, StorageError, ValueError, OSError, duckdb.Error) as exc:
        raise fail(str(exc).strip().splitlines()[0]) from exc


@contextmanager
def interruptible(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Ctrl-C stops the connection's query at once. DuckDB's Python client looks for a signal
    only between its tasks, and one task of a large scan can run for minutes (a Ctrl-C
    during `SELECT sum(hash(range)) FROM range(3000000000)` waited for the end). The signal's
    wakeup fd wakes a thread at the signal itself, which interrupts the connection (DuckDB
    checks that flag as it goes); Python's handler then raises the KeyboardInterrupt as the
    query returns. Only in the main thread, and only while SIGINT has Python's handler."""
    if threading.current_thread() is not threading.main_thread() or not callable(
        signal.getsignal(signal.SIGINT)
    ):
        yield
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)  # the wakeup fd must never block the signal's delivery

    def watch() -> None:
        while data := reader.recv(64):  # b"" once the writer is closed
            if signal.SIGINT in data:
                con.interrupt()

    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    watcher = threading.Thread(target=watch, name="sapo-duckdb-interrupt", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        writer.close()
        watcher.join()
        reader.close()
