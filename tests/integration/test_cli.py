"""The `sapo` command line, run as users run it."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import flows.cli as cli
from flows.cli import app, parse_storage_options
from ledger import Ledger
from tests.factories import open_ledger, round_rows

runner = CliRunner()


@pytest.fixture
def filled(site):
    led = site.open()
    led.publish(round_rows("me", 0, [[1, 0]]))
    led.publish(round_rows("p1", 0, [[1, 0], [1, 1]]))
    led.publish(round_rows("p2", 0, [[0, 1, 1]]))
    return site


def args_for(site, *args):
    opts = [f"--storage-option={k}={v}" for k, v in site.storage_options.items()]
    return [*args[:2], site.url, *args[2:], *opts]


def test_query_formats(filled):
    sql = "SELECT node_id, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1"
    out = runner.invoke(app, args_for(filled, "ledger", "query", sql, "--format", "json"))
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == [
        {"node_id": "me", "n": 2},
        {"node_id": "p1", "n": 4},
        {"node_id": "p2", "n": 3},
    ]
    out = runner.invoke(app, args_for(filled, "ledger", "query", sql, "-f", "csv"))
    assert out.output.splitlines() == ["node_id,n", "me,2", "p1,4", "p2,3"]
    out = runner.invoke(app, args_for(filled, "ledger", "query", sql))
    assert "p2" in out.output and "│" in out.output


def test_a_table_shows_long_text_whole_when_asked(filled):
    """Issue 61: a table cut every long cell at its first 60 characters, so completions that
    begin alike could not be told apart; `--cell-width 0` shows them whole (wrapped)."""
    long = "x" * 55 + "-the-end-that-differs"
    sql = f"SELECT '{long}' AS completion"
    cut = runner.invoke(app, args_for(filled, "ledger", "query", sql))
    assert cut.exit_code == 0 and "the-end-that-differs" not in cut.output, cut.output
    whole = runner.invoke(app, args_for(filled, "ledger", "query", sql, "--cell-width", "0"))
    assert whole.exit_code == 0, whole.output
    shown = "".join(c for c in whole.output if c not in "│ \n")
    assert "the-end-that-differs" in shown, whole.output


def test_query_binds_named_parameters(filled):
    """Issue 61: the docs' SQL uses `$name` parameters, which `sapo ledger query` could not
    bind. `--param name=value` binds text, numbers, null and lists (read as YAML)."""
    sql = (
        "SELECT node_id, count(*) AS n FROM rollouts WHERE node_id <> $me "
        "AND list_contains($peers::VARCHAR[], node_id) AND reward >= $floor "
        "AND ($swarm IS NULL OR swarm_id = $swarm) GROUP BY 1 ORDER BY 1"
    )
    binds = ["--param", "me=me", "-p", "peers=[p1, p2]", "-p", "floor=1", "-p", "swarm=null"]
    out = runner.invoke(app, args_for(filled, "ledger", "query", sql, "-f", "json", *binds))
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == [{"node_id": "p1", "n": 3}, {"node_id": "p2", "n": 2}]
    missing = runner.invoke(app, args_for(filled, "ledger", "query", sql, "-p", "me=me"))
    assert missing.exit_code == 2 and len(missing.output.strip().splitlines()) == 1
    assert "peers" in missing.output, missing.output
    bad = runner.invoke(app, args_for(filled, "ledger", "query", sql, "-p", "no value"))
    assert bad.exit_code == 2 and "expected key=value" in bad.output


def test_a_policys_whole_sql_runs_by_hand_as_docs_ledger_md_says(filled, tmp_path):
    """Issue 61: `--show-sql` printed what a draw runs (`drawable` built, then the policy),
    which `sapo ledger query` could not run (parameters of several statements). Run by hand
    with the sampler's parameters ($pool and $cut NULL), it draws what `sample` draws."""
    from ledger.draws import public_draw_key

    shown = runner.invoke(app, args_for(filled, "ledger", "sample", "--node-id", "me",
                                        "--groups", "2", "--show-sql"))  # fmt: skip
    assert shown.exit_code == 0, shown.output
    (tmp_path / "draw.sql").write_text(shown.output)
    params = {
        "node_id": "me", "swarm_id": "null", "draw_key": public_draw_key("me", 0),
        "rows_per_group": "null", "remember": "false", "n_groups": "2", "excluded": "[]",
        "known": "null", "node_round": "null", "tasks": "null", "standing": "null",
        "standing_rows": "null", "max_per_peer": "2", "peer_share_cap": "1",
        "unknown_cap": "1", "pool": "null", "cut": "null",
    }  # fmt: skip
    binds = [arg for k, v in params.items() for arg in ("-p", f"{k}={v}")]
    out = runner.invoke(app, args_for(filled, "ledger", "query", f"@{tmp_path / 'draw.sql'}",
                                      "-f", "json", *binds))  # fmt: skip
    assert out.exit_code == 0, out.output
    with filled.open() as led:
        drawn = led.sample_group_ids("me", 2, seed=0)
    assert [row["group_id"] for row in json.loads(out.output)] == drawn and drawn


OSC52 = "\x1b]52;c;c3VkbyBybSAtcmYgfg==\x07"  # sets the terminal's clipboard
FORGED = "\x1b[2J\x1b[31mFORGED: node-1 reward 1.0\x1b[0m"  # clears the screen, red text


def test_query_output_is_inert_in_a_terminal_and_a_spreadsheet(site):
    # Issue 43: a peer's completion and model id wrote ESC and BEL bytes to the terminal of
    # whoever ran `sapo ledger query`, and a CSV cell ran as a spreadsheet formula.
    led = site.open()
    formula = '=HYPERLINK("http://evil.example","x")'
    led.publish(round_rows("p1", 0, [[1, 0]], completion=OSC52 + FORGED, model_id=OSC52))
    led.publish(round_rows("p2", 0, [[1, 0]], completion=formula))
    sql = "SELECT node_id, model_id, completion, reward FROM rollouts ORDER BY rollout_id"
    outputs = {}
    for fmt in ("table", "csv"):
        out = runner.invoke(app, args_for(site, "ledger", "query", sql, "-f", fmt))
        assert out.exit_code == 0, out.output
        outputs[fmt] = out.output
        assert not any(ord(c) < 0x20 and c != "\n" for c in out.output), fmt
        assert "\x7f" not in out.output and "\x9b" not in out.output
        assert "\\x1b]52;c;" in out.output  # shown, escaped, not run
    header, *cells = csv.reader(io.StringIO(outputs["csv"]))
    assert header == ["node_id", "model_id", "completion", "reward"]
    assert [c[2] for c in cells if "HYPERLINK" in c[2]] == ["'" + formula] * 2
    assert all(not c[2].startswith(("=", "+", "-", "@")) for c in cells)
    assert [c[3] for c in cells] == ["1.0", "0.0"] * 2  # numbers stay numbers
    # JSON is the lossless form: the text as the peer wrote it, escaped by JSON itself.
    out = runner.invoke(app, args_for(site, "ledger", "query", sql, "-f", "json"))
    assert json.loads(out.output)[0]["completion"] == OSC52 + FORGED
    assert "\x1b" not in out.output


def test_query_runs_the_shipped_dashboards(filled):
    for name in (
        "reward_per_node_round",
        "cumulative_reward",
        "swarm_totals",
        "zero_variance_groups",
        "most_sampled_peers",
    ):
        out = runner.invoke(app, args_for(filled, "ledger", "query", "--dashboard", name))
        assert out.exit_code == 0, (name, out.output)
    out = runner.invoke(
        app, args_for(filled, "ledger", "query", "--dashboard", "swarm_totals", "-f", "json")
    )
    assert json.loads(out.output) == [
        {"swarm_id": "sw", "nodes": 3, "rounds": 1, "cumulative_claimed_reward": 0.5 + 0.75 + 2 / 3}
    ]


def test_sample_replays_a_nodes_keyed_draw(filled, tmp_path):
    """A node's draws are keyed by its secret: with its key, `sapo ledger sample` replays
    the draw it made in a round; without --round (or --swarm-id) it says what is missing."""
    from ledger import NodeKey
    from ledger.draws import round_draw_key

    pem = tmp_path / "me.pem"
    key = NodeKey.load_or_create(pem, "sw", "me")
    led = filled.open()
    for n in range(2, 8):
        led.publish(round_rows(f"p{n}", 1, [[1, 0], [0, 1]]))
    draws = set()
    for r in range(4):
        secret_key = round_draw_key(key.draw_secret(), "sw", "me", r)
        expected = led.sample_group_ids("me", 3, swarm_id="sw", for_round=r, draw_key=secret_key)
        out = runner.invoke(app, args_for(filled, "ledger", "sample", "--node-id", "me",
                                          "--groups", "3", "--swarm-id", "sw", "--round", str(r),
                                          "--key", str(pem), "-f", "json"))  # fmt: skip
        assert out.exit_code == 0, out.output
        got = list(dict.fromkeys(row["group_id"] for row in json.loads(out.output)))
        assert got == expected
        draws.add(tuple(got))
    assert len(draws) > 1  # a new key each round
    out = runner.invoke(app, args_for(filled, "ledger", "sample", "--node-id", "me", "--groups",
                                      "3", "--key", str(pem)))  # fmt: skip
    assert out.exit_code == 2 and "--swarm-id and --round" in out.output


def test_sample_command(filled):
    out = runner.invoke(
        app,
        args_for(filled, "ledger", "sample", "--node-id", "me", "--groups", "5", "-f", "json"),
    )
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert {r["group_id"] for r in rows} == {"sw.p1.r0.g0", "sw.p2.r0.g0"}
    out = runner.invoke(
        app,
        args_for(
            filled,
            "ledger",
            "sample",
            "--node-id",
            "me",
            "--groups",
            "5",
            "--policy",
            "reward_filtered",
            "-p",
            "max_mean_reward=0.6",
            "-f",
            "json",
        ),
    )
    assert {r["group_id"] for r in json.loads(out.output)} == {"sw.p1.r0.g0"}
    shown = runner.invoke(
        app,
        [
            "ledger",
            "sample",
            "x",
            "--node-id",
            "a",
            "--groups",
            "1",
            "--policy",
            "reward_filtered",
            "--show-sql",
        ],
    )
    assert "max_per_peer" in shown.output


def test_validate_and_compact_commands(filled):
    led = filled.open()
    led.store.put_new("swarm_id=sw/node_id=bad/day=2026-03-01/r1-x.parquet", b"junk")
    out = runner.invoke(app, args_for(filled, "ledger", "validate"))
    assert out.exit_code == 0
    assert "files    4 (3 readable)" in out.output and "corrupt" in out.output
    strict = runner.invoke(app, args_for(filled, "ledger", "validate", "--strict"))
    assert strict.exit_code == 1
    led.publish(round_rows("p1", 1, [[0, 1]]))
    out = runner.invoke(app, args_for(filled, "ledger", "compact", "--node-id", "p1"))
    assert out.exit_code == 0 and "compacted 2 files into 1" in out.output
    refused = runner.invoke(app, args_for(filled, "ledger", "compact"))
    assert refused.exit_code == 2 and "--all-nodes" in refused.output


def test_errors_are_one_clear_line(local_site):
    Ledger.open(local_site.url).publish(round_rows("a", 0, [[1, 0]]))
    bad_sql = runner.invoke(app, ["ledger", "query", local_site.url, "SELECT * FROM nope"])
    assert bad_sql.exit_code == 2 and "error: Catalog Error" in bad_sql.output
    bad_policy = runner.invoke(
        app,
        [
            "ledger",
            "sample",
            local_site.url,
            "--node-id",
            "a",
            "--groups",
            "1",
            "--policy",
            "bogus",
        ],
    )
    assert bad_policy.exit_code == 2 and "bad sampling policy" in bad_policy.output
    bad_url = runner.invoke(app, ["ledger", "query", "ftp://x/y", "SELECT 1"])
    assert bad_url.exit_code == 2 and "unsupported ledger URL" in bad_url.output


def test_storage_options_keep_credentials_as_strings():
    opts = parse_storage_options(["key=0123", "secret=true", "max_concurrency=4", "anon=false"])
    assert opts == {"key": "0123", "secret": "true", "max_concurrency": 4, "anon": False}


def test_the_installed_command_runs_the_demo(tmp_path):
    help_out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("ledger", "demo", "swarm", "node", "deploy"):
        assert command in help_out.stdout
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "demo",
            "--synthetic",
            "--workdir",
            str(tmp_path),
            "--rounds",
            "2",
            "--nodes",
            "3",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert "round 1: 12 groups published" in run.stdout
    assert not (tmp_path / "ledger").exists()  # the real demo's ledger stays its own
    led = Ledger.open(str(tmp_path / "synthetic-ledger"))
    assert led.query("SELECT count(*) FROM rollouts").item() == 3 * 2 * 4 * 8
    assert led.validate().clean


@pytest.mark.s3
def test_s3_settings_come_from_the_standard_aws_variables(s3_server, monkeypatch):
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ledger"
    open_ledger(url, s3_server.storage_options).publish(round_rows("a", 0, [[1, 0]]))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    out = runner.invoke(
        app, ["ledger", "query", url, "SELECT count(*) AS n FROM rollouts", "-f", "json"]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == [{"n": 2}]


def test_a_ledger_that_does_not_exist_is_an_error_for_readers(tmp_path):
    missing = str(tmp_path / "mistyped")
    for args in (
        ["ledger", "query", missing, "SELECT count(*) FROM rollouts"],
        ["ledger", "validate", missing],
        ["ledger", "sample", missing, "--node-id", "a", "--groups", "1"],
        ["ledger", "compact", missing, "--node-id", "a"],
        ["report", "--ledger", missing, "--out", str(tmp_path / "report")],
    ):
        out = runner.invoke(app, args)
        assert out.exit_code == 2, (args, out.output)
        assert out.output.strip() == f"error: no ledger at {missing}: the folder does not exist"
    (tmp_path / "empty").mkdir()  # an empty ledger that exists is just empty
    empty = runner.invoke(app, ["ledger", "validate", str(tmp_path / "empty")])
    assert empty.exit_code == 0 and "files    0" in empty.output


@pytest.mark.s3
def test_a_missing_bucket_is_an_error_for_readers(s3_server):
    opts = [f"--storage-option={k}={v}" for k, v in s3_server.storage_options.items()]
    out = runner.invoke(app, ["ledger", "validate", "s3://no-such-bucket/ledger", *opts])
    assert out.exit_code == 2 and "bucket 'no-such-bucket' does not exist" in out.output


@pytest.mark.s3
def test_a_mistyped_s3_prefix_is_an_error_for_readers_as_a_mistyped_folder_is(s3_server):
    """Issue 61: `sapo ledger query s3://bucket/typo` printed 0 and exited 0. A prefix
    exists only once something is written under it, so nothing under it is no ledger; one
    whose entries are not a ledger's (a folder above it, say) is refused too."""
    from tests.factories import open_ledger, round_rows

    bucket = s3_server.new_bucket()
    opts = [f"--storage-option={k}={v}" for k, v in s3_server.storage_options.items()]
    with open_ledger(f"s3://{bucket}/runs/ledger", s3_server.storage_options) as led:
        led.publish(round_rows("a", 0, [[1, 0]]))
    query = ["ledger", "query", "SELECT count(*) AS n FROM rollouts", "-f", "json", *opts]
    typo = runner.invoke(app, [*query[:2], f"s3://{bucket}/runs/ledgr", *query[2:]])
    assert typo.exit_code == 2, typo.output
    assert typo.output.strip() == (
        f"error: no ledger at s3://{bucket}/runs/ledgr: nothing is stored under that prefix"
    )
    above = runner.invoke(app, [*query[:2], f"s3://{bucket}/runs", *query[2:]])
    assert above.exit_code == 2, above.output
    assert f"s3://{bucket}/runs is not a ledger" in above.output and "ledger" in above.output
    right = runner.invoke(app, [*query[:2], f"s3://{bucket}/runs/ledger", *query[2:]])
    assert right.exit_code == 0 and json.loads(right.output) == [{"n": 2}], right.output
    # a bucket named alone may be empty: a ledger no one wrote yet
    empty = runner.invoke(app, ["ledger", "validate", f"s3://{s3_server.new_bucket()}", *opts])
    assert empty.exit_code == 0 and "files    0" in empty.output, empty.output


def test_version_and_unexpected_errors(monkeypatch, capsys):
    from importlib.metadata import version

    import flows.cli as cli
    import flows.cli.ledger as ledger_cli

    shown = runner.invoke(app, ["--version"])
    assert shown.exit_code == 0 and shown.output == f"sapo {version('sapo-swarm')}\n"

    def broken(*args, **kwargs):
        raise KeyError("a bug no command anticipated")

    monkeypatch.setattr(ledger_cli, "open_ledger", broken)
    monkeypatch.setenv(cli.DEBUG_ENV, "")  # off; and --debug's setting is undone after
    monkeypatch.setattr(sys, "argv", ["sapo", "ledger", "validate", "anywhere"])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "error: KeyError: 'a bug no command anticipated' "
        "(rerun as `sapo --debug ...` for the traceback)"
    )
    monkeypatch.setattr(sys, "argv", ["sapo", "--debug", "ledger", "validate", "anywhere"])
    with pytest.raises(KeyError):
        cli.main()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["demo", "--keep", "nonsense"], "Invalid value for '--keep': 'nonsense' is not one of "
         "'resume', 'final-model', 'nothing'. (see `sapo demo --help`)"),
        (["node"], "Missing option '--node-id'. (see `sapo node --help`)"),
        (["swarm", "--rounds", "0"], "Invalid value for '--rounds': "),
        (["ledger", "qurey", "x"], "No such command 'qurey'."),
    ],
)  # fmt: skip
def test_usage_errors_are_one_line_with_exit_2(monkeypatch, capsys, argv, said) -> None:
    monkeypatch.setattr(sys, "argv", ["sapo", *argv])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"error: {said}"), line
    assert captured.out == ""


def test_main_exits_with_the_command_status(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["sapo", "ledger"])
    with pytest.raises(SystemExit) as helped:
        cli.main()
    captured = capsys.readouterr()
    assert helped.value.code == 0 and "compact" in captured.out and captured.err == ""
    monkeypatch.setattr(sys, "argv", ["sapo", "--version"])
    with pytest.raises(SystemExit) as done:
        cli.main()
    assert done.value.code == 0 and capsys.readouterr().out.startswith("sapo ")
    monkeypatch.setattr(sys, "argv", ["sapo", "ledger", "query", "/no/such/ledger", "SELECT 1"])
    with pytest.raises(SystemExit) as failed:
        cli.main()
    assert failed.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: no ledger at /no/such/ledger: the folder does not exist"
    )


@pytest.mark.s3
def test_a_swarm_on_a_missing_bucket_stops_before_any_model_loads(s3_server, tmp_path):
    sets = [f"ledger.storage_options.{k}={v}" for k, v in s3_server.storage_options.items()]
    args = ["swarm", "--workdir", str(tmp_path), "--set", "ledger.url=s3://no-such-bucket/l"]
    for item in sets:
        args += ["--set", item]
    started = time.monotonic()
    out = runner.invoke(app, args)
    assert out.exit_code == 2, out.output
    assert out.output.strip().splitlines() == [
        "error: cannot use the ledger at s3://no-such-bucket/l: bucket 'no-such-bucket' does not "
        "exist (s3://no-such-bucket/l)"
    ]
    assert time.monotonic() - started < 30 and not (tmp_path / "nodes").exists()


def test_config_and_query_file_errors_say_what_and_where(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1\n")
    out = runner.invoke(app, ["swarm", "-c", str(bad)])
    assert out.exit_code == 2
    assert out.output.strip() == (
        f"error: bad swarm configuration: {bad}: not valid YAML: expected ',' or ']', but "
        "got '<stream end>' at line 2, column 1"
    )
    (tmp_path / "ledger").mkdir()
    missing = runner.invoke(app, ["ledger", "query", str(tmp_path / "ledger"), "@nope.sql"])
    assert missing.exit_code == 2
    assert (
        missing.output.strip()
        == "error: cannot read the query file nope.sql: No such file or directory"
    )


def test_compact_of_a_signed_swarm_says_it_needs_the_node_key_and_works_with_it(tmp_path):
    from ledger import NodeKey

    root = tmp_path / "ledger"
    key_file = tmp_path / "keys" / "sw" / "a.pem"
    key = NodeKey.load_or_create(key_file, "sw", "a")
    with open_ledger(str(root), signer=key) as led:
        assert led.declare_swarm("sw", "required") == "required"
        led.register_key(key)
        for node_round in (0, 1):
            led.publish(round_rows("a", node_round, [[1, 0]]))
    base = ["ledger", "compact", str(root), "--node-id", "a", "--all-days"]
    stranger = runner.invoke(app, base)
    # Issue 47: the skip was said twice (a log line and the report) and the exit was 0.
    assert stranger.exit_code == 1, stranger.output
    assert stranger.output.startswith("compacted 0 files into 0")
    assert stranger.output.count("its node signs its files") == 1
    assert "so only it can compact them (--key" in stranger.output
    assert "changed while compacting" not in stranger.output
    lacking = runner.invoke(app, [*base, "--key", str(key_file)])
    assert lacking.exit_code == 2
    assert lacking.output.strip() == (
        "error: --key signs for one node: give --swarm-id and exactly one --node-id"
    )
    missing = runner.invoke(app, [*base, "--swarm-id", "sw", "--key", str(tmp_path / "no.pem")])
    assert missing.exit_code == 2 and "cannot read a private key from" in missing.output
    own = runner.invoke(app, [*base, "--swarm-id", "sw", "--key", str(key_file)])
    assert own.exit_code == 0, own.output
    assert own.output.strip().startswith("compacted 2 files into 1 (4 rows, 1 partitions)")
    with Ledger.open(str(root)) as reader:
        assert reader.validate().clean
        assert reader.query("SELECT count(*) FROM rollouts").item() == 4


@pytest.mark.parametrize("command", [["swarm"], ["node", "--node-id", "node-0"]])
def test_a_model_that_cannot_load_offline_stops_before_anything_is_created(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: a mistyped hub id took 28 s and 78 lines (a Prefect traceback, "couldn't
    connect to huggingface.co") and left a work folder with a key, rules and stores."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    work = tmp_path / "work"
    for model in ("nosuchorg/nosuchmodel", str(tmp_path / "no-such-folder")):
        args = [*command, "--workdir", str(work), "--set", f"defaults.model={model}"]
        out = runner.invoke(app, args)
        assert out.exit_code == 2, out.output
        assert out.output.strip().splitlines() == [
            f"error: node-0: model {model!r} is not a folder here, not a bundled model and "
            "not in the Hugging Face cache, and downloads are off (HF_HUB_OFFLINE=1): give a "
            "model folder, a bundled:<name>, or run once with HF_HUB_OFFLINE=0 to download it"
        ]
        assert not work.exists()


def test_a_folder_that_is_not_a_ledger_is_refused_saying_where_the_ledger_is(tmp_path):
    """Issue 47: `sapo ledger query` of a swarm's work folder (not its ledger) gave 0 rows
    and exit 0, and `ledger validate` of it passed."""
    work = tmp_path / "sapo-mixed"
    with Ledger.open(str(work / "ledger")) as led:
        led.publish(round_rows("a", 0, [[1, 0]]))
    (work / "nodes").mkdir()
    (work / "mlflow.db").write_bytes(b"")
    for args in (
        ["ledger", "query", str(work), "SELECT count(*) FROM rollouts"],
        ["ledger", "validate", str(work)],
        ["report", "--ledger", str(work), "--out", str(tmp_path / "r")],
    ):
        out = runner.invoke(app, args)
        assert out.exit_code == 2, (args, out.output)
        assert out.output.strip() == (
            f"error: {work} is not a ledger (none of its entries is a ledger's); the ledger "
            f"is at {work / 'ledger'}"
        )
    other = tmp_path / "elsewhere"
    (other / "photos").mkdir(parents=True)
    out = runner.invoke(app, ["ledger", "query", str(other), "SELECT 1"])
    assert out.exit_code == 2
    assert (
        out.output.strip() == f"error: {other} is not a ledger (none of its entries is a ledger's)"
    )
    # The ledger itself reads; a file of the user's beside its entries does not change that.
    (work / "ledger" / "NOTES.md").write_text("mine")
    out = runner.invoke(
        app,
        [
            "ledger",
            "query",
            str(work / "ledger"),
            "SELECT count(*) AS n FROM rollouts",
            "-f",
            "json",
        ],
    )
    assert out.exit_code == 0 and json.loads(out.output) == [{"n": 2}]


@pytest.mark.parametrize("where", ["python", "duckdb"])
def test_ctrl_c_outside_a_swarm_is_one_line_and_status_130(tmp_path, where):
    """Ctrl-C in Python code (here: reading the query from a pipe) reached `sapo` as typer's
    silent Exit(130), and one in a query DuckDB runs as a single long task waited for its end
    (this one: 52 s of CPU). Both end at once in "aborted", status 130."""
    import errno
    import os
    import signal

    ledger_dir = tmp_path / "ledger"
    ledger_dir.mkdir()
    fifo = tmp_path / "query.sql"
    os.mkfifo(fifo)
    command = ["ledger", "query", str(ledger_dir), f"@{fifo}"]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from flows.cli import main; main()", *command],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # the reader has the pipe open once a non-blocking writer may open it
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                assert exc.errno == errno.ENXIO and time.monotonic() < deadline
                assert proc.poll() is None
                time.sleep(0.05)
        if where == "duckdb":  # minutes of work for DuckDB, interrupted while it runs
            os.write(writer, b"SELECT sum(hash(range)) FROM range(3000000000)")
            os.close(writer)
            time.sleep(3)
        else:  # sapo blocks in read() while the write end stays open with nothing written
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        if where == "python":
            os.close(writer)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert (proc.returncode, err) == (130, "aborted\n")
