"""Ledger text as the CLI prints it: inert in a terminal and a spreadsheet (issue 43)."""

from __future__ import annotations

import logging

import polars as pl

from flows.cli.inert import inert_cell, inert_frame, inert_logs, inert_text


def test_control_and_invisible_format_characters_are_escaped() -> None:
    assert inert_text("a\x1b[2Jb\x07") == "a\\x1b[2Jb\\x07"
    assert inert_text("line\nnext\ttab\r") == "line\\nnext\\ttab\\r"
    assert inert_text("\x9b31m\x7f") == "\\x9b31m\\x7f"  # C1's CSI, DEL
    assert inert_text("abc\u202edcba\u200b") == "abc\\u202edcba\\u200b"  # bidi override, ZWSP
    hidden = "ok\U000e0041\U000e0042\u0600\u2028"  # the tag block's invisible text, Cf, Zl
    assert inert_text(hidden) == "ok\\U000e0041\\U000e0042\\u0600\\u2028"
    honest = "Let me think: 3 + 4 = 7, so \\frac{1}{2} ≈ 0.5 — <answer>7</answer> ✓"
    assert inert_text(honest) == honest


def test_cells_a_spreadsheet_would_run_start_with_a_quote() -> None:
    for formula in ("=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", "\uff1d1"):
        assert inert_cell(formula).startswith("'"), formula
    assert inert_cell("\t=1") == "'\\t=1"
    assert inert_cell("1 = 1") == "1 = 1"


def test_a_frame_keeps_its_numbers_and_makes_every_text_inert() -> None:
    frame = pl.DataFrame(
        {
            "text": ["=cmd|' /C calc'!A0", "\x1b]52;c;eA==\x07", None],
            "reward": [-1.0, 0.5, None],
            "texts": [["\x1b[2J"], [], None],
            "\x1b[31mname": [1, 2, 3],
        }
    )
    csv = inert_frame(frame, for_csv=True)
    assert csv.columns == ["text", "reward", "texts", "\\x1b[31mname"]
    assert csv["text"].to_list() == ["'=cmd|' /C calc'!A0", "\\x1b]52;c;eA==\\x07", None]
    assert csv["reward"].to_list() == [-1.0, 0.5, None]
    assert "\x1b" not in "".join(v for v in csv["texts"].to_list() if v)
    table = inert_frame(frame, for_csv=False)
    assert table["text"].to_list()[0] == "=cmd|' /C calc'!A0"  # no quote outside CSV
    assert table["reward"].dtype == pl.Float64


def test_log_records_of_our_loggers_are_inert(caplog) -> None:
    before = logging.getLogRecordFactory()
    try:
        inert_logs()
        inert_logs()  # idempotent
        with caplog.at_level(logging.WARNING):
            logging.getLogger("ledger.catalog").warning("skipping %s", "k\x1b[2Jey")
            logging.getLogger("somebody.else").warning("left %s", "as\x07is")
            try:
                raise ValueError("bad key \x1b]52;c;eA==\x07")
            except ValueError:
                logging.getLogger("sapo_core.rebuild").exception("failed")
        ours, theirs, failed = caplog.records
        assert ours.getMessage() == "skipping k\\x1b[2Jey"
        assert theirs.getMessage() == "left as\x07is"
        shown = logging.Formatter().format(failed)
        assert "\x1b" not in shown and "\x07" not in shown
        assert "bad key \\x1b]52;c;eA==\\x07" in shown and "Traceback" in shown.splitlines()[1]
    finally:
        logging.setLogRecordFactory(before)
