"""What a stop signal looks like by the time it reaches sapo's code: Ctrl-C is a
KeyboardInterrupt, SIGTERM inside a Prefect flow is Prefect's TerminationSignal, and either
may come wrapped in another library's error (a shared module: the node, the launcher and
the commands all ask; flows/swarm/stopping.py stops a swarm)."""

from __future__ import annotations

import signal
import sys


def stop_signal(exc: BaseException) -> str | None:
    """The name of the stop signal behind ``exc`` (``SIGINT``, ``SIGTERM``), or None when a
    stop signal had no part in it. A stop is the KeyboardInterrupt (Ctrl-C) or Prefect
    TerminationSignal (SIGTERM, which carries the number) that ``exc`` is, or that it was
    raised from or while handling: DuckDB, for one, answers a Ctrl-C mid-query with
    ``RuntimeError('Query interrupted')`` raised from the KeyboardInterrupt."""
    kinds: tuple[type[BaseException], ...] = (KeyboardInterrupt,)
    # Only a loaded Prefect raises its TerminationSignal: no import (seconds) to find out.
    if (prefect_exceptions := sys.modules.get("prefect.exceptions")) is not None:
        kinds += (prefect_exceptions.TerminationSignal,)
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        if isinstance(found, kinds):
            number = getattr(found, "signal", None)  # TerminationSignal's
            return signal.Signals(number).name if isinstance(number, int) else "SIGINT"
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return None


__all__ = ["stop_signal"]
