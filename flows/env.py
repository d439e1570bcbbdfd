"""Offline, telemetry-free defaults that every entry point applies before heavy imports,
for itself and every process it starts, and how the process returns freed memory.

(Processes sapo starts itself run with ``python -P``, and deployed runs with PYTHONSAFEPATH,
so that a folder where the user stands named like a package, such as a swarm's `ledger/`
data folder, never stands in for the installed one.)"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import MutableMapping

OFFLINE_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "DO_NOT_TRACK": "true",  # Prefect and MLflow telemetry; MLflow accepts only "true"
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # quiet library chatter in node logs: progress bars and advisory warnings
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # three bars a resumed node's round
    "TRANSFORMERS_VERBOSITY": "error",
    # and MLflow's and Prefect's INFO lines ("Creating initial MLflow database tables...",
    # a temporary server stopping) among sapo's own: warnings and errors still show
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    # Prefect's ephemeral server gets 20 s to start by default; a busy 2-core machine
    # starting several nodes at once needs more
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
    # bytes from which glibc serves an allocation by mmap (release_freed_memory); "glibc":
    # leave glibc's own, moving threshold
    "SAPO_MMAP_THRESHOLD": str(128 * 1024),
}

FORCE_ENV = "SAPO_RESUME_FORCE"
"""Set (to 1) to resume nodes whose configuration changed since their checkpoint: what
`--force` sets for the node processes `sapo swarm` starts, and what a deployment's worker
may set (flows/node/lifecycle.py)."""
CHECKED_ENV = "SAPO_RESUME_CHECKED"
"""Set by a launcher for each node process it starts: the checkpoint at which it checked
that node's resume, models and ledger (flows/node/lifecycle.py `checked_marker`)."""

LAUNCHED_ENV = "SAPO_LAUNCHED"
"""Set (to 1) by a launcher for each node process it starts: the launcher stops the node's
process group, Prefect's ephemeral server in it included, and hides what the node prints
once it stops it. A node started by hand runs its flow on a server a Ctrl-C leaves up
(flows/services/prefect_server.py `flows_outlive_ctrl_c`), and says where it resumes."""

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def apply_offline_defaults(environ: MutableMapping[str, str] | None = None) -> None:
    """Set the defaults where the user has not chosen otherwise."""
    env = os.environ if environ is None else environ
    for name, value in OFFLINE_DEFAULTS.items():
        env.setdefault(name, value)
    if environ is None:
        release_freed_memory(env["SAPO_MMAP_THRESHOLD"])


@functools.cache  # once a process: every entry point, and each flow run, applies it
def release_freed_memory(threshold: str) -> bool:
    """Have glibc serve every allocation of ``threshold`` bytes or more by mmap, so that a
    freed tensor goes back to the OS; whether it was set.

    glibc's threshold starts at 128 KiB but rises to the size of each mmapped block freed
    (up to 32 MiB); from then on freed tensors stay in the heap, which grows with the
    largest activations seen. A node's peak memory crept up round by round that way
    (a LoRA node on a bf16 base: 1.79 GB after round 1, 2.31 GB after round 7; with a
    fixed threshold, 1.16 -> 1.34 GB; benchmarks/README.md). Setting it fixes it, at a
    cost in page faults: 7% a round for full fine-tuning, 44% for that LoRA node.
    """
    if threshold == "glibc":
        return False
    if not threshold.isdigit():
        raise ValueError(f"SAPO_MMAP_THRESHOLD is {threshold!r}: a number of bytes, or glibc")
    try:
        process = ctypes.CDLL(None)  # the symbols already loaded, the C library's among them
        return bool(process.mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError, TypeError):  # not glibc: nothing to set
        return False
