"""Ledger text made inert for a terminal and a spreadsheet.

Anything the CLI prints from the ledger was written by a peer. A completion holding ESC or
BEL bytes can rewrite a terminal (clear it, colour a forged line, set the clipboard with
OSC 52), and one starting with ``=`` runs as a formula where a spreadsheet opens the CSV.
Here every control character (C0, DEL, C1) and the invisible format characters that reorder
or hide text (bidirectional overrides, zero-width characters) are written as escapes
(``\\x1b``, ``\\n``, ``\\u202e``), and CSV cells that a spreadsheet would run start with
``'`` (OWASP's advice for CSV injection). Backslashes are left as they are: the output is
for reading; ``--format json`` is the lossless form for programs.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import polars as pl

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f"  # C0, DEL, C1 (ESC, BEL, CSI ...)
    "\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb]"
)
"""Control characters, and the format characters that move, hide or join text (bidi
embeddings, overrides and isolates, zero-width spaces and joiners, line and paragraph
separators)."""
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
"""First characters that make a spreadsheet read a cell as a formula (with their
full-width forms, which some spreadsheets also accept)."""


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def inert_text(text: str) -> str:
    """``text`` with every control and invisible format character escaped."""
    return _UNSAFE.sub(_escape, text)


def inert_cell(text: str) -> str:
    """A CSV cell: escaped, and prefixed with ``'`` if a spreadsheet would run it."""
    return ("'" if text.startswith(FORMULA_STARTS) else "") + inert_text(text)


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def inert_frame(frame: pl.DataFrame, *, for_csv: bool) -> pl.DataFrame:
    """``frame`` with every text value (strings, and lists, structs or bytes shown as text)
    made inert; numbers, booleans and times are kept as they are. Column names too: a
    PIVOT makes values into names."""
    clean = inert_cell if for_csv else inert_text
    columns = []
    for series in frame.get_columns():
        dtype = series.dtype
        if dtype.is_nested() or dtype in (pl.String, pl.Categorical, pl.Enum, pl.Binary, pl.Object):
            values = [_as_text(v) for v in series.to_list()]
            series = pl.Series(
                series.name, [None if v is None else clean(v) for v in values], dtype=pl.String
            )
        columns.append(series)
    out = pl.DataFrame(columns)
    names = [clean(name) for name in out.columns]
    if len(set(names)) < len(names):
        return out  # two names alike once escaped: keep them as they were told apart
    return out.rename(dict(zip(out.columns, names, strict=True)))


OWN_LOGGERS = ("ledger", "sapo_core", "flows", "dashboards")
"""Loggers whose messages may quote a peer's text (a key, a task's error, a skipped file's
detail): the node's terminal shows them."""


def inert_logs() -> None:
    """Make every log record of sapo's own loggers inert before any handler sees it (the
    terminal, Prefect's console, a log file alike). Idempotent; `sapo`'s entry point calls it,
    so every node process has it."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "sapo_inert", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if record.name.split(".")[0] in OWN_LOGGERS:
            try:
                message = record.getMessage()
            except Exception:  # a malformed call: logging reports it as it would have
                return record
            record.msg, record.args = inert_text(message), None
        return record

    factory.sapo_inert = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
