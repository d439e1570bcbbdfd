"""`sapo deploy --nodes N --rounds R` sizes the deployed swarm as `sapo swarm` does (issue 61:
a user copied and edited the swarm file to deploy 2 nodes x 2 rounds)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_deploy_takes_nodes_and_rounds_as_swarm_does(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    swarm = tmp_path / "swarm.yaml"
    swarm.write_text(yaml.safe_dump({"swarm_id": "sized", "node_count": 3, "rounds": 5}))
    done = CliRunner().invoke(
        app,
        ["deploy", "-c", str(swarm), "--work-pool", "sized-pool", "--interval", "600",
         "--nodes", "2", "--rounds", "2", "--workdir", str(tmp_path / "work"),
         "--set", f"prefect.api_url={api}"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "registered 2 deployments" in done.output

    with get_client(sync_client=True) as client:
        found = client.read_deployments()
    mine = {d.name: d for d in found if d.name.startswith("sized-")}
    assert sorted(mine) == ["sized-node-0", "sized-node-1"]
    for deployment in mine.values():
        params = deployment.parameters
        assert params["until_round"] == 2
        carried = yaml.safe_load(params["swarm_text"])
        assert carried["rounds"] == 2 and len(carried["nodes"]) == 2
