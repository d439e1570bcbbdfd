"""What a swarm's working directory holds, printed at the end of `sapo swarm`."""

from __future__ import annotations

import os
from pathlib import Path

from flows.swarm.launcher import disk_line, disk_usage


def test_disk_usage_per_top_level_entry_counts_linked_files_once(tmp_path: Path) -> None:
    (tmp_path / "nodes" / "node-0").mkdir(parents=True)
    (tmp_path / "nodes" / "node-0" / "model.safetensors").write_bytes(b"x" * 3000)
    (tmp_path / "mlartifacts").mkdir()
    os.link(tmp_path / "nodes" / "node-0" / "model.safetensors", tmp_path / "mlartifacts" / "m")
    (tmp_path / "mlflow.db").write_bytes(b"y" * 500)
    usage = disk_usage(tmp_path)
    assert sum(usage.values()) == 3500 and usage["mlflow.db"] == 500
    assert {usage["nodes"], usage["mlartifacts"]} == {0, 3000}  # the linked file, once
    assert disk_line(tmp_path).startswith(f"disk: {tmp_path} holds 0.00 GB (")
    assert disk_usage(tmp_path / "missing") == {}
