"""The process defaults every entry point applies (flows/env.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flows.env import OFFLINE_DEFAULTS, apply_offline_defaults, release_freed_memory

# Frees 64 blocks of 8 MiB while a small block allocated after them holds the heap's top,
# after one 16 MiB block raised glibc's moving threshold: what is left resident?
FRAGMENT = """
import os, sys
from flows.env import release_freed_memory
release_freed_memory(sys.argv[1])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
bytearray(16 << 20)  # allocated by mmap, then freed: glibc's threshold rises to 16 MiB
blocks = [bytearray(8 << 20) for _ in range(64)]
pin = bytearray(1024)
before = rss()
del blocks
print((before - rss()) >> 20)
"""


def test_defaults_fill_only_what_the_user_left_unset() -> None:
    env = {"HF_HUB_OFFLINE": "0", "SAPO_MMAP_THRESHOLD": "glibc"}
    apply_offline_defaults(env)
    assert env["HF_HUB_OFFLINE"] == "0" and env["SAPO_MMAP_THRESHOLD"] == "glibc"
    assert env["DO_NOT_TRACK"] == "true"
    assert OFFLINE_DEFAULTS["SAPO_MMAP_THRESHOLD"] == "131072"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_fixed_mmap_threshold_gives_freed_blocks_back() -> None:
    def released_mib(threshold: str) -> int:
        run = [sys.executable, "-c", FRAGMENT, threshold]
        return int(subprocess.run(run, capture_output=True, text=True, check=True).stdout)

    assert released_mib("131072") >= 500  # of 512 MiB freed
    assert released_mib("glibc") < 64  # kept in the heap below the pinned block


def test_a_threshold_that_is_no_number_is_a_clear_error() -> None:
    assert not release_freed_memory("glibc")
    with pytest.raises(ValueError, match="SAPO_MMAP_THRESHOLD is '128k'"):
        release_freed_memory("128k")


def test_mlflow_and_prefect_info_lines_stay_out_of_normal_output(tmp_path) -> None:
    """Issue 47: MLflow's "Creating initial MLflow database tables..." and Prefect's INFO
    lines appeared among sapo's own. A new store made under the defaults says nothing, nor
    does an artifact read back from it (a resumed node's round drew three "Downloading
    artifacts" bars among its lines)."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from flows.env import apply_offline_defaults\n"
        "apply_offline_defaults()\n"
        "from flows.tracking import open_tracker\n"
        "tracker = open_tracker(sys.argv[1], 'quiet', sys.argv[2])\n"
        "run = tracker.run('a run', {})\n"
        "Path(sys.argv[2]).mkdir(exist_ok=True)\n"
        "Path(sys.argv[2], 'table.json').write_text('{}')\n"
        "tracker.client.log_artifact(run, str(Path(sys.argv[2], 'table.json')))\n"
        "tracker.client.download_artifacts(run, 'table.json', sys.argv[2])\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if "LOGGING_LEVEL" not in k and k != "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    }
    done = subprocess.run(
        [sys.executable, "-c", code, f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert (tmp_path / "mlflow.db").exists()
    assert " INFO " not in done.stdout + done.stderr, done.stderr
    assert "Downloading artifacts" not in done.stderr, done.stderr
