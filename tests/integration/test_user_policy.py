"""A user's SQL file as a swarm's sampling policy (issue 61: `sampling.kind` was a closed set;
only an undocumented Python subclass could add one). The docs' example runs as written; the
shipped guarantees hold whatever the user's SQL says; a file that does not fit is one line
when the swarm loads."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from flows.config import ConfigError, load_swarm, swarm_yaml
from ledger import Ledger
from ledger.policies import PaperPolicy, SqlPolicy, parse_policy
from tests.factories import T0, round_rows

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ledger.md"


def docs_example(kind: str) -> str:
    """The block after ``<!-- user-policy:KIND -->`` in docs/ledger.md, as written there."""
    found = re.search(rf"<!-- user-policy:{kind} -->\n```\w+\n(.*?)```", DOCS.read_text(), re.S)
    assert found, f"docs/ledger.md has no user-policy:{kind} block"
    return found.group(1)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    """Peers' groups of every kind: solved, hopeless and half-right ones, from four peers
    and the receiver itself, one peer's on a task the receiver does not judge, and stale."""
    led = Ledger.open(str(tmp_path / "ledger"))
    half = [[1, 0, 1, 0], [1, 1, 1, 0], [0, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    for peer in ("me", "p1", "p2", "p3"):
        led.publish(round_rows(peer, 0, half))
    led.publish(round_rows("p4", 0, half, task="leg_counting"))
    led.publish(round_rows("p5", 0, half, published_at=T0 - timedelta(hours=12)))
    return led


def test_the_docs_example_loads_carries_its_text_and_draws(tmp_path: Path, ledger: Ledger):
    (tmp_path / "half_right.sql").write_text(docs_example("sql"))
    data = yaml.safe_load(docs_example("yaml"))
    data["workdir"] = str(tmp_path / "work")
    swarm = tmp_path / "my-swarm.yaml"
    swarm.write_text(yaml.safe_dump(data))
    cfg = load_swarm(swarm)  # the file is read beside the swarm file, from anywhere
    policy = cfg.node("node-0").sampling
    assert isinstance(policy, SqlPolicy) and policy.query == docs_example("sql")
    # A deployment's worker gets the resolved swarm as text, without the file.
    (tmp_path / "half_right.sql").unlink()
    carried = load_swarm(None, text=swarm_yaml(cfg)).node("node-0").sampling
    assert carried == policy

    now = T0 + timedelta(hours=1)
    drawn = ledger.sample_group_ids(
        "me", 8, policy=policy, seed=0, now=now, exclude_nodes=["p3"],
        tasks=["basic_arithmetic"],
    )  # fmt: skip
    peers = [g.split(".")[1] for g in drawn]
    slots = {g.rsplit(".", 1)[1] for g in drawn}
    # Its own choice: half-right groups (means 0.5, 0.75, 0.25), recent ones, 2 a peer at
    # most; the sampler's: never the receiver's, an excluded peer's or an unjudged task's.
    assert slots <= {"g0", "g1", "g2"} and len(drawn) == 4
    assert sorted(set(peers)) == ["p1", "p2"] and all(peers.count(p) <= 2 for p in peers)
    again = ledger.sample_group_ids(
        "me", 8, policy=policy, seed=0, now=now, exclude_nodes=["p3"],
        tasks=["basic_arithmetic"],
    )  # fmt: skip
    assert again == drawn


def test_the_samplers_guarantees_hold_whatever_the_sql_says(ledger: Ledger):
    """A policy that asks for every group, the receiver's and every task's included, in an
    order a publisher sets, draws what the paper's policy draws over the same candidates:
    the same groups, in the same keyed order, under the same caps."""
    steered = parse_policy(
        {
            "kind": "sql",
            "query": "WITH candidates AS (\n"
            "    SELECT group_id, published_at AS draw FROM drawable\n"
            "    WHERE reward_max > reward_min ORDER BY published_at DESC\n)",
        }
    )
    for seed in range(3):
        for tasks in (None, ["basic_arithmetic"]):
            options = {"seed": seed, "tasks": tasks, "exclude_nodes": ["p2"]}
            mine = ledger.sample_group_ids("me", 6, policy=steered, **options)
            paper = ledger.sample_group_ids("me", 6, policy=PaperPolicy(), **options)
            assert mine == paper and mine
            assert not any(g.split(".")[1] in ("me", "p2") for g in mine)


def test_names_of_the_users_sql_cannot_shadow_what_the_guard_reads(ledger: Ledger):
    """A CTE called `drawable` whose `u` puts p1's groups first and whose `node_id` hides the
    receiver's own changes nothing: the user's SQL is a subquery of its own (found in review)."""
    shadowing = parse_policy(
        {
            "kind": "sql",
            "query": "WITH drawable AS (\n"
            "    SELECT group_id, reward_max, reward_min, 'p9' AS node_id,\n"
            "        CASE WHEN group_id LIKE '%.p1.%' THEN 0.0 ELSE 1.0 END AS u FROM groups\n"
            "),\n"
            "candidates AS (\n"
            "    SELECT group_id, u AS draw FROM drawable WHERE reward_max > reward_min\n"
            ") -- a comment after candidates is fine",
        }
    )
    options = {"seed": 1, "exclude_nodes": ["p2"]}
    mine = ledger.sample_group_ids("me", 6, policy=shadowing, **options)
    assert mine == ledger.sample_group_ids("me", 6, policy=PaperPolicy(), **options)


@pytest.mark.parametrize(
    ("text", "params", "said"),
    [
        (
            "WITH a AS (SELECT 1) SELECT 1; COPY (SELECT 1) TO 'x.csv';\n"
            "WITH candidates AS (SELECT group_id FROM drawable)",
            {},
            "does not parse",
        ),
        ("SELECT group_id FROM drawable", {}, "must begin with WITH"),
        ("WITH c AS (SELECT group_id FROM drawable)", {}, "must end with the common table"),
        ("WITH candidates AS (SELECT group_id FROM drawable WHERE size > $n)", {}, "uses $n"),
        ("WITH candidates AS (SELECT nope FROM drawable)", {}, 'column "nope" not found'),
        ("WITH candidates AS (SELECT group_id FROM drawable)", {"node_id": "x"}, "binds these"),
    ],
)
def test_a_policy_that_does_not_fit_is_one_line_when_the_swarm_loads(
    tmp_path: Path, text: str, params: dict[str, str], said: str
) -> None:
    (tmp_path / "p.sql").write_text(text)
    swarm = tmp_path / "swarm.yaml"
    sampling = {"kind": "sql", "file": "p.sql", "params": params}
    swarm.write_text(yaml.safe_dump({"swarm_id": "s", "sampling": sampling}))
    with pytest.raises(ConfigError) as refused:
        load_swarm(swarm)
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and said in message, message
    assert "sampling" in message
