"""Node self-reports (evaluations, trainings) beside the sample log, on disk and on S3."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ledger import node_logs
from ledger.records import to_table
from tests.factories import T0, round_rows
from tests.integration.test_ledger_contract import plain_duckdb

EVAL_COLUMNS = (
    "swarm_id, node_id, node_round, task, questions, completions, correct, accuracy, "
    "policy_version, eval_seed, evaluated_at, source_file"
)
TRAIN_COLUMNS = (
    "swarm_id, node_id, node_round, group_id, origin, peer_node_id, task, completions, "
    "reward_mean, informative, trained, recorded_at, source_file"
)


def evaluation(task: str, questions: int, completions: int, correct: float, version: int):
    return {
        "task": task,
        "questions": questions,
        "completions": completions,
        "correct": correct,
        "accuracy": correct / completions,
        "policy_version": version,
        "eval_seed": 4242,
    }


def training(group_id: str, origin: str, peer: str, reward_mean: float, trained: bool):
    return {
        "group_id": group_id,
        "origin": origin,
        "peer_node_id": peer,
        "task": "basic_arithmetic",
        "completions": 4,
        "reward_mean": reward_mean,
        "informative": 0.0 < reward_mean < 1.0,
        "trained": trained,
    }


def write_two_nodes(led) -> dict[str, str]:
    """Evaluations and trainings of n1 (rounds 0 and 2) and n2 (round 1); their keys."""
    return {
        "e-n1-0": led.write_evaluation(
            "sw",
            "n1",
            0,
            [evaluation("basic_arithmetic", 2, 8, 2.0, 0), evaluation("chain_sum", 2, 8, 6.0, 0)],
            now=T0,
        ),
        "e-n1-2": led.write_evaluation(
            "sw", "n1", 2, [evaluation("basic_arithmetic", 2, 8, 5.0, 4)], now=T0 + timedelta(1)
        ),
        "e-n2-1": led.write_evaluation(
            "sw", "n2", 1, [evaluation("chain_sum", 2, 4, 1.0, 1)], now=T0 + timedelta(hours=1)
        ),
        "t-n1-0": led.write_training(
            "sw",
            "n1",
            0,
            [
                training("sw.n1.r0.g0", "local", "n1", 0.5, True),
                training("sw.n2.r0.g1", "external", "n2", 1.0, False),
            ],
            now=T0,
        ),
        "t-n2-1": led.write_training(
            "sw", "n2", 1, [training("sw.n2.r1.g0", "local", "n2", 0.25, True)], now=T0
        ),
    }


def root_of(site) -> str:
    return site.url if site.kind == "s3" else Path(site.url).as_posix()


def test_evaluations_and_trainings_read_back_exactly(site):
    led = site.open()
    led.publish(round_rows("n1", 0, [[1, 0], [0, 0, 1]]))
    led.publish(round_rows("n2", 0, [[1, 0]]))
    drawn = led.sample("n1", 1, seed=0, swarm_id="sw")
    led.write_sample("sw", "n1", 0, drawn, policy="paper", seed=0, now=T0)
    keys = write_two_nodes(led)
    assert keys["e-n1-0"].startswith(
        "_evaluations/swarm_id=sw/node_id=n1/day=2026-03-01/e00000000-"
    )
    assert keys["e-n1-2"].startswith(
        "_evaluations/swarm_id=sw/node_id=n1/day=2026-03-02/e00000002-"
    )
    assert keys["t-n2-1"].startswith("_trainings/swarm_id=sw/node_id=n2/day=2026-03-01/t00000001-")
    assert all(k.endswith(".jsonl") for k in keys.values())

    reader = site.open()
    path = {name: reader.store.reader_path(key) for name, key in keys.items()}
    evaluations = reader.query(f"SELECT {EVAL_COLUMNS} FROM evaluations ORDER BY ALL").rows()
    assert evaluations == [
        ("sw", "n1", 0, "basic_arithmetic", 2, 8, 2.0, 0.25, 0, 4242, T0, path["e-n1-0"]),
        ("sw", "n1", 0, "chain_sum", 2, 8, 6.0, 0.75, 0, 4242, T0, path["e-n1-0"]),
        ("sw", "n1", 2, "basic_arithmetic", 2, 8, 5.0, 0.625, 4, 4242, T0 + timedelta(1),
         path["e-n1-2"]),
        ("sw", "n2", 1, "chain_sum", 2, 4, 1.0, 0.25, 1, 4242, T0 + timedelta(hours=1),
         path["e-n2-1"]),
    ]  # fmt: skip
    trainings = reader.query(f"SELECT {TRAIN_COLUMNS} FROM trainings ORDER BY ALL").rows()
    assert trainings == [
        ("sw", "n1", 0, "sw.n1.r0.g0", "local", "n1", "basic_arithmetic", 4, 0.5, True, True,
         T0, path["t-n1-0"]),
        ("sw", "n1", 0, "sw.n2.r0.g1", "external", "n2", "basic_arithmetic", 4, 1.0, False,
         False, T0, path["t-n1-0"]),
        ("sw", "n2", 1, "sw.n2.r1.g0", "local", "n2", "basic_arithmetic", 4, 0.25, True, True,
         T0, path["t-n2-1"]),
    ]  # fmt: skip
    assert reader.query("SELECT count(*) FROM samples").item() == 1
    joined = reader.query(
        "SELECT t.node_id, sum(e.accuracy) FROM trainings t JOIN evaluations e "
        "USING (swarm_id, node_id, node_round) GROUP BY 1 ORDER BY 1"
    ).rows()
    assert joined == [("n1", 2.0), ("n2", 0.25)]  # n1: 2 groups x 2 tasks
    assert reader.validate().clean

    # Plain DuckDB over every Parquet file still sees the rollouts, and only them.
    rows = (
        plain_duckdb(site)
        .sql(
            f"SELECT node_id, count(*) FROM read_parquet('{root_of(site)}/**/*.parquet', "
            "hive_partitioning=true) GROUP BY 1 ORDER BY 1"
        )
        .fetchall()
    )
    assert rows == [("n1", 5), ("n2", 2)]


def test_a_second_write_of_the_same_round_is_a_noop(site):
    led = site.open()
    keys = write_two_nodes(led)
    before = {o.key: led.store.read(o.key) for o in led.store.list()}
    again = [evaluation("basic_arithmetic", 2, 8, 8.0, 9)]
    assert led.write_evaluation("sw", "n1", 0, again, now=T0) == keys["e-n1-0"]
    # a round retried after midnight: same round, another day, still nothing new
    later = T0 + timedelta(days=3)
    assert led.write_evaluation("sw", "n1", 0, again, now=later) == keys["e-n1-0"]
    retrain = [training("sw.n1.r0.g9", "local", "n1", 0.0, False)]
    assert led.write_training("sw", "n1", 0, retrain, now=later) == keys["t-n1-0"]
    assert {o.key: led.store.read(o.key) for o in led.store.list()} == before
    accuracy = site.open().query(
        "SELECT accuracy FROM evaluations WHERE node_id = 'n1' AND node_round = 0 "
        "AND task = 'basic_arithmetic'"
    )
    assert accuracy.rows() == [(0.25,)]


def test_writers_refuse_rows_that_readers_would_skip(local_site):
    led = local_site.open()
    good_eval = evaluation("basic_arithmetic", 2, 8, 2.0, 0)
    good_train = training("sw.n1.r0.g0", "local", "n1", 0.5, True)
    bad_evals = {
        "accuracy": {**good_eval, "accuracy": 1.5},
        "must be an int": {**good_eval, "completions": "8"},
        "must be an int, got bool": {**good_eval, "questions": True},
        "finite": {**good_eval, "correct": float("nan")},
        "is missing": {k: v for k, v in good_eval.items() if k != "eval_seed"},
        "unknown fields": {**good_eval, "swarm_id": "other"},
        "stamped by the writer": {**good_eval, "evaluated_at": T0},
        "node_round 1 is not 0": {**good_eval, "node_round": 1},
    }
    for message, row in bad_evals.items():
        with pytest.raises(ValueError, match=message):
            led.write_evaluation("sw", "n1", 0, [good_eval, row], now=T0)
    with pytest.raises(ValueError, match="task repeated"):
        led.write_evaluation("sw", "n1", 0, [good_eval, good_eval], now=T0)
    bad_trains = {
        "origin must be one of": {**good_train, "origin": "peer"},
        "peer_node_id": {**good_train, "peer_node_id": "../n2"},
        "reward_mean must be <= 1": {**good_train, "reward_mean": 2.0},
        "must be a bool": {**good_train, "trained": 1},
        "1 to 1024 characters": {**good_train, "group_id": ""},
    }
    for message, row in bad_trains.items():
        with pytest.raises(ValueError, match=message):
            led.write_training("sw", "n1", 0, [row], now=T0)
    with pytest.raises(ValueError, match="node_round must be an int >= 0"):
        led.write_training("sw", "n1", -1, [good_train], now=T0)
    with pytest.raises(ValueError, match="invalid node_id"):
        led.write_training("sw", "n/1", 0, [good_train], now=T0)
    assert led.write_evaluation("sw", "n1", 0, [], now=T0) == ""
    assert led.write_training("sw", "n1", 0, [], now=T0) == ""
    assert led.store.list() == []


def bad_lines(node_log: node_logs.NodeLog, good: dict) -> bytes:
    """One good line among every kind of bad one a peer might write."""
    first = node_log.columns[1].name  # task / group_id: a required VARCHAR
    lines = [
        json.dumps({**good, "swarm_id": "other", "node_id": "victim"}).encode(),  # kept, as evil
        b"{not json",
        b"[1, 2, 3]",
        b"42",
        b"null",
        json.dumps({**good, "node_round": "7"}).encode(),  # wrong types
        json.dumps({**good, first: {"nested": True}}).encode(),
        json.dumps({**good, first: "x" * 100_000}).encode(),  # huge value
        json.dumps({**good, first: None}).encode(),  # missing required value
        json.dumps({k: v for k, v in good.items() if k != "node_round"}).encode(),
        json.dumps({**good, "node_round": 2**70}).encode(),  # does not fit
        b'{"node_round": 1, "' + first.encode() + b'": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        b'{"node_round": 1, "' + first.encode() + b'": "a", "extra": ' + b'{"a":' * 100_000
        + b"1" + b"}" * 100_000 + b"}",  # deep, in a field no column reads: still kept
        b"\xff\xfe\x00 binary",
        json.dumps({**good, "node_round": -1}).encode(),
        json.dumps({**good, node_log.stamp: "not a time"}).encode(),
        b'{"node_round": 1e999, "' + first.encode() + b'": "b"}',
    ]  # fmt: skip
    if node_log is node_logs.EVALUATIONS:
        lines.append(json.dumps({**good, "accuracy": 3.0}).encode())
        lines.append(b'{"node_round": 1, "task": "t", "correct": 1e999}')
    else:
        lines.append(json.dumps({**good, "origin": "elsewhere"}).encode())
        lines.append(json.dumps({**good, "trained": "yes"}).encode())
    return b"\n".join(lines) + b"\n"


EVIL = "swarm_id=sw/node_id=evil/day=2026-03-01"


def test_garbage_files_and_malformed_lines_are_skipped(site):
    led = site.open()
    led.publish(round_rows("n1", 0, [[1, 0]]))
    write_two_nodes(led)
    good_eval = {"node_round": 1, **evaluation("basic_arithmetic", 1, 2, 1.0, 1)}
    good_train = {"node_round": 1, **training("sw.evil.r1.g0", "local", "evil", 0.5, True)}
    planted = []
    for node_log, good in ((node_logs.EVALUATIONS, good_eval), (node_logs.TRAININGS, good_train)):
        prefix = f"{node_log.prefix}{EVIL}/"
        for name, data in [
            (f"{node_log.letter}00000001-garbage.jsonl", b"{{{ not json\n\x00\xff\x00"),
            (f"{node_log.letter}00000002-empty.jsonl", b""),
            (f"{node_log.letter}00000003-lines.jsonl", bad_lines(node_log, good)),
            ("a-rollout-lookalike.parquet", _parquet()),
        ]:
            assert led.store.put_new(prefix + name, data)
            planted.append(prefix + name)
        # outside the layout: ignored
        assert led.store.put_new(f"{node_log.prefix}stray.jsonl", json.dumps(good).encode())

    reader = site.open()
    evil_evals = reader.query(
        "SELECT swarm_id, node_id, node_round, task, accuracy, source_file FROM evaluations "
        "WHERE node_id NOT IN ('n1', 'n2') ORDER BY ALL"
    ).rows()
    evil_path = reader.store.reader_path(f"_evaluations/{EVIL}/e00000003-lines.jsonl")
    assert evil_evals == [
        ("sw", "evil", 1, "a", None, evil_path),
        ("sw", "evil", 1, "basic_arithmetic", 0.5, evil_path),
    ]
    evil_trains = reader.query(
        "SELECT node_id, group_id, origin, trained FROM trainings WHERE node_id = 'evil' "
        "ORDER BY ALL"
    ).rows()
    assert evil_trains == [("evil", "a", None, None), ("evil", "sw.evil.r1.g0", "local", True)]
    # the honest rows are all there
    assert reader.query("SELECT count(*) FROM evaluations").item() == 4 + 2
    assert reader.query("SELECT count(*) FROM trainings").item() == 3 + 2
    assert reader.query("SELECT count(*) FROM rollouts").item() == 2
    files = reader.query("SELECT key FROM ledger_files").to_series().to_list()
    assert len(files) == 1 and not files[0].startswith("_")  # no log file is a rollout file
    report = reader.validate()
    assert report.files == 1 and report.bad_files == []
    n_bad = bad_lines(node_logs.EVALUATIONS, good_eval).count(b"\n") - 2
    assert report.skipped[node_logs.INVALID_LINE] == 2 * 2 + 2 * n_bad  # garbage: 2 lines
    # what a reader already holds survives a refresh, and a second reader agrees
    assert reader.query("SELECT count(*) FROM evaluations").item() == 6
    assert site.open().query("SELECT count(*) FROM trainings").item() == 5


def _parquet() -> bytes:
    buffer = io.BytesIO()
    pq.write_table(to_table(round_rows("evil", 9, [[1, 0]])), buffer)
    return buffer.getvalue()


def test_an_oversized_log_is_skipped_whole(local_site):
    led = local_site.open()
    line = json.dumps({"node_round": 1, "task": "t", "pad": "x" * 1000}).encode() + b"\n"
    big = line * (node_logs.EVALUATIONS.max_bytes // len(line) + 1)
    key = f"_evaluations/{EVIL}/e00000001-big.jsonl"
    assert led.store.put_new(key, big)
    assert led.query("SELECT count(*) FROM evaluations").item() == 0
    report = led.validate()
    assert [(k, r) for k, r, _ in report.bad_files] == [(key, node_logs.OVERSIZED)]


def test_a_removed_files_rows_disappear_after_refresh(local_site):
    led = local_site.open()
    keys = write_two_nodes(led)
    led.store.put_new(f"_trainings/{EVIL}/t00000001-junk.jsonl", b"junk\n")
    assert led.query("SELECT count(*) FROM evaluations").item() == 4
    assert led.query("SELECT count(*) FROM trainings").item() == 3
    assert led.validate().skipped[node_logs.INVALID_LINE] == 1
    led.store.delete([keys["e-n1-0"], keys["t-n2-1"], f"_trainings/{EVIL}/t00000001-junk.jsonl"])
    led.refresh()
    assert led.query("SELECT node_id, node_round, task FROM evaluations ORDER BY ALL").rows() == [
        ("n1", 2, "basic_arithmetic"),
        ("n2", 1, "chain_sum"),
    ]
    assert led.query("SELECT DISTINCT node_id FROM trainings").rows() == [("n1",)]
    assert led.validate().clean
    # written again (a node rerunning a round whose file was removed): read again
    rewrite = [evaluation("chain_sum", 2, 8, 4.0, 0)]
    assert led.write_evaluation("sw", "n1", 0, rewrite, now=T0) == keys["e-n1-0"]
    assert led.query("SELECT count(*) FROM evaluations").item() == 3


def test_the_documented_plain_duckdb_recipe_survives_a_peers_deep_line(tmp_path: Path) -> None:
    """ledger/node_logs.py tells a user how to read the logs in plain DuckDB. Without named
    columns that query crashed the whole process (SIGSEGV) on one peer's line nested 100,000
    deep in a field no one asked for; the recipe now names its columns. Run in a child, so
    a crash is a failed test and not a dead test run."""
    import subprocess
    import sys

    recipe = (node_logs.__doc__ or "").split("::")[-1].strip()
    assert recipe.startswith("SELECT") and "columns = {" in recipe
    folder = tmp_path / f"_evaluations/{EVIL}"
    folder.mkdir(parents=True)
    honest = json.dumps({"node_round": 1, "task": "gcd", "accuracy": 0.5})
    deep = '{"node_round": 2, "task": "gcd", "accuracy": 1.0, "x": ' + "[" * 100_000
    deep += "]" * 100_000 + "}"
    (folder / "e00000001-deep.jsonl").write_text(honest + "\n" + deep + "\n")
    sql = recipe.replace("<root>", str(tmp_path))
    code = f"import duckdb; print(sorted(duckdb.sql({sql!r}).fetchall()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    # both lines: the deep field is one no column reads, as in sapo's own reader
    assert done.stdout.strip() == (
        "[(1, 'gcd', 0.5, datetime.date(2026, 3, 1), 'evil', 'sw'), "
        "(2, 'gcd', 1.0, datetime.date(2026, 3, 1), 'evil', 'sw')]"
    )
