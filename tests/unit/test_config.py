from __future__ import annotations

import pytest
from pydantic import ValidationError

from ledger import Ledger, LedgerConfig, RowLimits
from tests.factories import round_rows


def test_ledger_config_loads_from_yaml_and_rejects_unknown_keys(tmp_path):
    good = tmp_path / "ledger.yaml"
    good.write_text(
        "url: s3://bkt/ledger\n"
        "storage_options: {endpoint_url: 'http://127.0.0.1:9000'}\n"
        "limits: {max_completion_chars: 1000}\n"
        "max_staleness_s: 5\n"
    )
    cfg = LedgerConfig.from_yaml(good)
    assert cfg.limits.max_completion_chars == 1000 and cfg.max_staleness_s == 5
    assert cfg.limits.max_question_chars == RowLimits().max_question_chars
    typo = tmp_path / "typo.yaml"
    typo.write_text("url: x\nlimits: {max_completion_char: 10}\n")
    with pytest.raises(ValidationError, match="max_completion_char"):
        LedgerConfig.from_yaml(typo)
    with pytest.raises(ValidationError):
        RowLimits(max_group_size=0)


def test_staleness_reuses_a_listing_until_asked_to_refresh(tmp_path):
    url = str(tmp_path / "ledger")
    writer = Ledger.open(url)
    reader = Ledger(LedgerConfig(url=url, max_staleness_s=3600))
    writer.publish(round_rows("a", 0, [[1, 0]]))
    assert reader.query("SELECT count(*) FROM rollouts").item() == 2
    writer.publish(round_rows("a", 1, [[1, 0]]))
    assert reader.query("SELECT count(*) FROM rollouts").item() == 2  # listing reused
    reader.refresh()
    assert reader.query("SELECT count(*) FROM rollouts").item() == 4


def test_a_handle_reads_its_own_writes_however_recent_its_listing(tmp_path):
    """A node's ledger reuses listings for a few seconds (a swarm's default): what it wrote
    itself, an evaluation it must not run twice, is in its very next read."""
    url = str(tmp_path / "ledger")
    node = Ledger(LedgerConfig(url=url, max_staleness_s=3600))
    node.publish(round_rows("a", 0, [[1, 0]]))
    assert node.query("SELECT count(*) FROM rollouts").item() == 2
    node.publish(round_rows("a", 1, [[1, 0]]))
    assert node.query("SELECT count(*) FROM rollouts").item() == 4  # its own: listed again
    evaluation = {
        "task": "chain_sum", "questions": 4, "completions": 4, "correct": 1.0,
        "accuracy": 0.25, "policy_version": 2, "eval_seed": 7,
    }  # fmt: skip
    node.write_evaluation("sw", "a", 2, [evaluation])
    assert node.evaluated_nodes("sw", 2) == {"a"}
