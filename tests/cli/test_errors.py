"""Every CLI error a user can cause is one line on stderr saying what was wrong and what is allowed: no traceback,
and the broker's refusal reasons reach the user (the client checks with the broker's own rules before sending)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.cli import REPO, one_line_error, tiered
from tests.support.broker import free_port

LONG = "a" * 300

# argv, the command as the error names it, exit status, what the line must say
WITHOUT_A_BROKER = [
    (["produce", "-t", "events/abc", "x"], "produce", 2, "bad partition 'abc' in -t events/abc: want TOPIC/PARTITION"),
    (["produce", "-t", "events", "--partition", "-1", "x"], "produce", 2, "partition -1 does not exist: partitions are numbered"),
    (["produce", "-t", "events/1", "--partition", "2", "x"], "produce", 2, "give --partition or TOPIC/PARTITION, not both"),
    (["produce", "-t", "events", "-s", "0", "x"], "produce", 2, "-s/--bundle-size must be at least 1"),
    (["produce", "-t", "events", "--timeout", "0", "x"], "produce", 2, "--timeout must be a positive number"),
    (["produce", "-t", "events"], "produce", 2, "nothing to produce: give messages as arguments or -f FILE"),
    (["consume", "-t", "events/0", "zz"], "consume", 2, "bad start 'zz': want beginning, first, end, eof or a seq"),
    (["consume", "-t", "events/0", "-F", "seq,nope"], "consume", 2, "unknown fields nope: -F takes"),
    (["status", "-b", "127.0.0.1:1"], "status", 1,
     "cannot reach a broker at 127.0.0.1:1 (from -b/--broker): connection refused; is `tiered serve` running there?"),
    (["status", "-b", "host:port"], "status", 2, "port must be a number (from -b/--broker; want [addr:]port"),
    (["serve", "-l", "abc"], "serve", 2, "flag --listen: listen: 'abc' does not name an address here"),
    (["serve", "-P", "99999"], "serve", 2, "flag --http-listen: http_listen: bad endpoint '99999': port out of range"),
    (["topic", "create", "x", "1", "-o", "novalue"], "topic create", 2, "bad option 'novalue': want KEY=VALUE"),
    (["replay", "nope", "-p", "fresh", "--parquet", "out"], "replay", 1, "no catalog at "),
    (["topic", "config", "events"], "topic config", 1, "(only `tiered serve` and `tiered db upgrade` create one)"),
    (["catalog", "check"], "catalog check", 1, "/data/.tiered/catalog.db (from the data directory "),
    (["cluster", "status"], "cluster status", 1, "no catalog at "),
    (["db", "current"], "db current", 1, "no catalog at "),
    (["topic", "config", "events", "--catalog", "bad://"], "topic config", 1,
     "--catalog 'bad://' is not a catalog URL: want sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"),
    (["cluster", "status", "--catalog", "not a url"], "cluster status", 1, "--catalog 'not a url' is not a catalog"),
    (["serve", "-p", "a-file"], "serve", 2, "data directory a-file: a-file is not a directory"),
    (["db", "upgrade", "-p", "a-file"], "db upgrade", 1, "data directory a-file: a-file is not a directory"),
    (["tier", "status", "-b", "127.0.0.1:11011"], "tier status", 2,
     "-b/--broker names a broker's TANK port, but tier status reads its HTTP endpoint"),
    (["replay", "nope", "--keep-seqs", "--parquet", "out"], "replay", 2, "--keep-seqs goes with --to-topic"),
    (["db", "current", "--catalog", "nosuch://x"], "db current", 1, "nosuch://x"),
]


@pytest.mark.parametrize("argv, command, status, says", WITHOUT_A_BROKER, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else None)
def test_a_bad_argument_is_one_line_naming_what_is_allowed(argv, command, status, says, tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    proc = tiered(*argv, check=False, cwd=tmp_path, env={"TIERED_BROKER": ""})
    assert says in one_line_error(proc, command, status)
    # Only `serve` and `db upgrade` may create a catalog, and neither did here.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_the_endpoint_named_by_the_environment_is_named_in_a_connect_error(tmp_path):
    proc = tiered("topic", "list", check=False, env={"TIERED_BROKER": "127.0.0.1:1"})
    assert "(from TIERED_BROKER)" in one_line_error(proc, "topic list")
    proc = tiered("topic", "list", check=False, env={"TIERED_BROKER": ""})
    err = one_line_error(proc, "topic list") if proc.returncode else ""
    assert not err or "(from the default; set -b/--broker or TIERED_BROKER)" in err


def test_an_unknown_flag_gets_its_commands_usage():
    proc = tiered("consume", "-t", "events", "-x", check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.startswith("usage: tiered consume") and "unrecognized arguments: -x" in err


def test_refusals_reach_the_user_with_their_reason(broker_process):
    bp = broker_process()
    b = ("-b", f"127.0.0.1:{bp.port}")
    tiered("topic", "create", *b, "events", "2")
    cases = [
        (["topic", "create", *b, "x", "70000"], "a topic has 1..4096 partitions, not 70000"),
        (["topic", "create", *b, LONG, "1"], "invalid topic name 'aaaaaaaaaa"),
        (["topic", "create", *b, "héllo", "1"], "1..64 characters of A-Z a-z 0-9 _ -"),
        (["topic", "create", *b, "ok€", "1"], "invalid topic name 'ok€'"),
        (["topic", "create", *b, "tiered", "1"], "topic name 'tiered' is reserved"),
        (["topic", "create", *b, "t", "1", "-o", "log.segment.bytes=1"],
         "invalid value '1' for 'log.segment.bytes': must be at least 64"),
        (["topic", "create", *b, "t", "1", "-o", "produce.ack=maybe"], "expected one of durable, local"),
        (["topic", "create", *b, "t", "1", "-o", "no.such.key=1"], "unknown topic config key 'no.such.key'; known keys:"),
        (["topic", "create", *b, "events", "1"], "topic events already exists"),
        (["produce", *b, "-t", "nope", "x"], "unknown topic 'nope' (`tiered topic create nope <partitions>` creates it)"),
        (["produce", *b, "-t", "events/7", "x"], "unknown partition events/7: events has partitions 0..1"),
        (["produce", *b, "-t", LONG, "x"], "invalid topic name"),
        (["consume", *b, "-t", "events/9", "-d"], "unknown partition events/9"),
        (["consume", *b, "-t", "ok€", "-d"], "invalid topic name 'ok€'"),
        (["consume", *b, "-t", "events/0", "-d", "100"], "seq 100 of events/0 is outside"),
        (["topic", "describe", *b, "nope"], "unknown topic 'nope'"),
    ]
    for argv, says in cases:
        command = " ".join(argv[:2]) if argv[0] == "topic" else argv[0]
        assert says in one_line_error(tiered(*argv, check=False), command), argv
    # Nothing refused reached the broker's disk; the unknown key in particular was not silently accepted.
    assert tiered("topic", "list", *b).stdout.decode().splitlines() == ["events\t2"]


def test_a_failed_replay_prints_only_its_error(tmp_path):
    tiered("db", "upgrade", "-p", "data", cwd=tmp_path)
    err = one_line_error(tiered("replay", "nope", "-p", "data", "--parquet", "out", check=False, cwd=tmp_path),
                         "replay")
    assert "topic 'nope' is not in the catalog" in err  # and no "replayed ... 0 messages" line before it


def test_a_tank_command_at_the_http_port_says_so_in_one_line(broker_process):
    http = free_port()
    broker_process("-P", f"127.0.0.1:{http}")
    proc = tiered("status", "-b", f"127.0.0.1:{http}", check=False)
    assert "did not answer in TANK's protocol" in one_line_error(proc, "status")
    assert "not its HTTP port" in proc.stderr.decode()


@pytest.mark.parametrize("drain", [True, False], ids=["drain", "follow"])
def test_a_consumer_whose_reader_goes_away_ends_quietly(broker_process, drain):
    """`tiered consume ... | head -1` exits 0 and prints nothing, whether it was writing (drain: far more than a
    pipe holds) or waiting at the tail (follow: it notices the closed pipe without another message arriving)."""
    bp = broker_process()
    b = ("-b", f"127.0.0.1:{bp.port}")
    tiered("topic", "create", *b, "events", "1")
    tiered("produce", *b, "-t", "events", "-f", "-", input=b"".join(b"%05d %s\n" % (i, b"x" * 100) for i in range(3000)))
    argv = [sys.executable, "-m", "tiered.cli.main", "consume", *b, "-t", "events/0", *(["-d"] if drain else [])]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    consumer = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert consumer.stdout is not None
    first = consumer.stdout.readline()
    consumer.stdout.close()  # what `head -1` does after its line
    _, err = consumer.communicate(timeout=60)
    assert first.startswith(b"1\t00000 ")
    assert (consumer.returncode, err) == (0, b"")


def test_serve_without_s3_credentials_refuses_in_one_line(tmp_path):
    env = {k: "" for k in os.environ if k.startswith("AWS_")}
    env.update({"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                "AWS_EC2_METADATA_DISABLED": "true", "TIERED_STORE_URL": "s3://bucket/prefix"})
    proc = tiered("serve", "-p", str(tmp_path / "data"), "-l", "127.0.0.1:0", "-P", "off", check=False, env=env,
                  timeout_s=60)
    err = one_line_error(proc, "serve", 1)
    assert "no S3 credentials for s3://bucket/prefix: set AWS_ACCESS_KEY_ID" in err


def test_old_flag_spellings_still_work_with_one_deprecation_line_each(broker_process, tmp_path):
    """Each letter means one thing across the CLI; the old meanings users may rely on still work, and say so."""
    bp = broker_process()
    b = ("-b", f"127.0.0.1:{bp.port}")
    tiered("topic", "create", *b, "old", "2")
    proc = tiered("produce", *b, "-t", "old", "-p", "1", "a", "b", "c")
    assert proc.stderr.decode().splitlines()[0] == ("tiered produce: -p is deprecated (-p is the data directory in "
                                                    "every other command): use -t TOPIC/PARTITION or --partition")
    proc = tiered("consume", *b, "-t", "old", "-p", "1", "-d", "-l", "2", "-s", "4096", "-F", "content")
    assert proc.stdout.decode().splitlines() == ["a", "b"]
    said = [line for line in proc.stderr.decode().splitlines() if "deprecated" in line]
    assert said == ["tiered consume: -p is deprecated (-p is the data directory in every other command): use "
                    "-t TOPIC/PARTITION or --partition",
                    "tiered consume: -l is deprecated (-l is the listen address of serve): use -n/--limit",
                    "tiered consume: -s is deprecated (-s is the bundle size of produce): use --fetch-size"]
    for command in ("produce", "consume", "replay"):
        shown = tiered(command, "--help").stdout.decode()
        assert " -p " not in shown.replace("-p DATA_DIR", "") and " -l " not in shown, shown
