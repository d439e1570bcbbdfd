"""Offline, telemetry-free defaults that every entry point applies before heavy imports,
for itself and every process it starts.

(Processes sapo starts itself run with ``python -P``, and deployed runs with PYTHONSAFEPATH,
so that a folder where the user stands named like a package, such as a swarm's `ledger/`
data folder, never stands in for the installed one.)"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

OFFLINE_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "DO_NOT_TRACK": "true",  # Prefect and MLflow telemetry; MLflow accepts only "true"
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # quiet library chatter in node logs: progress bars and advisory warnings
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    # Prefect's ephemeral server gets 20 s to start by default; a busy 2-core machine
    # starting several nodes at once needs more
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
}


def apply_offline_defaults(environ: MutableMapping[str, str] | None = None) -> None:
    """Set the defaults where the user has not chosen otherwise."""
    env = os.environ if environ is None else environ
    for name, value in OFFLINE_DEFAULTS.items():
        env.setdefault(name, value)
