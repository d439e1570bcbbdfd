"""`sapo infra down --purge` deletes only what the stack made (found in review: a mistyped
--home with no stack deleted its `postgres/` and `s3/` folders, and a pointer file naming
"." would have deleted the working directory)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.services.stack_data import (
    DATABASES_MADE,
    OBJECTS,
    OBJECTS_MARK,
    PG_POINTER,
    pg_home,
    purge_data,
)

runner = CliRunner()


def test_purge_leaves_folders_the_stack_did_not_make(tmp_path: Path):
    for mine in ("postgres", "s3"):
        (tmp_path / mine).mkdir()
        (tmp_path / mine / "thesis.txt").write_text("the user's")
    out = runner.invoke(app, ["infra", "down", "--home", str(tmp_path), "--purge"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == f"no stack data at {tmp_path}"
    assert (tmp_path / "postgres" / "thesis.txt").is_file()
    assert (tmp_path / "s3" / "thesis.txt").is_file()


def test_purge_deletes_what_the_stack_made(tmp_path: Path):
    (tmp_path / "postgres").mkdir()
    (tmp_path / "postgres" / DATABASES_MADE).write_text("prefect mlflow\n")
    (tmp_path / OBJECTS).mkdir()
    (tmp_path / OBJECTS / OBJECTS_MARK).touch()
    assert purge_data(tmp_path) == [tmp_path / "postgres", tmp_path / OBJECTS]
    assert not (tmp_path / "postgres").exists() and not (tmp_path / OBJECTS).exists()


@pytest.mark.parametrize("named", ["", ".", "/home/someone", "relative/sapo-postgres-x"])
def test_a_pointer_to_a_folder_the_stack_did_not_make_is_refused(tmp_path: Path, named: str):
    (tmp_path / PG_POINTER).write_text(named)
    with pytest.raises(ValueError, match="not a folder the stack made"):
        pg_home(tmp_path)
    out = runner.invoke(app, ["infra", "down", "--home", str(tmp_path), "--purge"])
    assert out.exit_code == 2 and "not a folder the stack made" in out.output
