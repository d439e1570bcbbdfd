"""A new MLflow SQLite store, made once per test session and copied after that.

A new store runs MLflow's schema migrations: 5 to 7 s on 2 cores, paid by every test whose
node tracks to a fresh `mlflow.db`. The first new store of the session is made by MLflow
itself, into a template file; every later one in this process is filled page for page from it
(SQLite's backup API), which is the database MLflow's migrations produce: the stores the tests
read and write are MLflow's own. Processes a test starts (nodes) migrate as a user's do; a
test that starts `mlflow server` on a new store may hand it one made here (`new_store`): the
server then finds its schema current, as a user's server does on its second start.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

_lock = threading.Lock()


def copy_new_stores_from(template: Path) -> Callable[[], None]:
    """Make MLflow initialise new SQLite stores from `template` (made on first use); returns
    the function that undoes it. Other databases (PostgreSQL in the stack tests) migrate."""
    import mlflow.store.db.utils as db_utils

    migrate = db_utils._initialize_tables

    def initialize(engine: Any) -> None:
        if engine.dialect.name != "sqlite":
            migrate(engine)
            return
        with _lock:
            if template.exists():
                with closing(sqlite3.connect(template)) as source:
                    _with_raw(engine, lambda raw: source.backup(raw))
                return
            migrate(engine)
            partial = template.with_suffix(".partial")
            with closing(sqlite3.connect(partial)) as copy:
                _with_raw(engine, lambda raw: raw.backup(copy))
            partial.rename(template)

    db_utils._initialize_tables = initialize

    def undo() -> None:
        db_utils._initialize_tables = migrate

    return undo


def _with_raw(engine: Any, act: Callable[[sqlite3.Connection], None]) -> None:
    raw = engine.raw_connection()
    try:
        act(raw.driver_connection)
    finally:
        raw.close()


def new_store(path: Path) -> str:
    """A new MLflow SQLite store at ``path``, made by MLflow in this process (so copied from
    the session's template when there is one); its URI."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    uri = f"sqlite:///{path}"
    store = SqlAlchemyStore(uri, str(path.parent / "artifacts"))
    store.engine.dispose()
    return uri
