"""Ledger text made inert for a terminal and a spreadsheet.

Anything the CLI prints from the ledger was written by a peer. A completion holding ESC or
BEL bytes can rewrite a terminal (clear it, colour a forged line, set the clipboard with
OSC 52), and one starting with ``=`` runs as a formula where a spreadsheet opens the CSV.
Here every control character (C0, DEL, C1) and the invisible format characters that reorder
or hide text (Unicode's Cf: bidirectional overrides, zero-width characters, the tag block)
are written as escapes (``\\x1b``, ``\\n``, ``\\u202e``), and CSV cells that a spreadsheet
would run start with ``'`` (OWASP's advice for CSV injection). Backslashes are left as
they are: the output is for reading; ``--format json`` is the lossless form for programs.
"""

from __future__ import annotations

import logging
import traceback
import unicodedata
from typing import Any

import polars as pl

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
"""Unicode's control characters (C0, DEL, C1: ESC, BEL, CSI ...) and format characters (bidi
embeddings, overrides and isolates, zero-width spaces and joiners, the invisible tag block
U+E0000-E007F that can hide text for a model or a reader), and the line and paragraph
separators: by category, so no hand-made list misses one."""
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
"""First characters that make a spreadsheet read a cell as a formula (with their
full-width forms, which some spreadsheets also accept)."""


def _escaped(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def inert_text(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control and invisible format character escaped (``keep_newlines``:
    but line feeds, for a traceback's lines)."""
    if text.isprintable():  # the common case: nothing to escape (no control, format, Z*)
        return text
    return "".join(
        _escaped(c)
        if unicodedata.category(c) in UNSAFE_CATEGORIES and not (keep_newlines and c == "\n")
        else c
        for c in text
    )


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
            # A traceback's text (an exception may quote a peer's key or error): formatted
            # here, escaped but for its line breaks, so no formatter prints it raw.
            if record.exc_info and not record.exc_text:
                formatted = "".join(traceback.format_exception(*record.exc_info))
                record.exc_text = inert_text(formatted.rstrip("\n"), keep_newlines=True)
            if record.stack_info:
                record.stack_info = inert_text(record.stack_info, keep_newlines=True)
        return record

    factory.sapo_inert = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
