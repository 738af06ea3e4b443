"""Every CLI error a user can cause is one line on stderr saying what was wrong and what is allowed: no traceback,
and the broker's refusal reasons reach the user (the client checks with the broker's own rules before sending)."""

from __future__ import annotations

import pytest

from tests.support.cli import one_line_error, tiered

LONG = "a" * 300

# argv, the command as the error names it, exit status, what the line must say
WITHOUT_A_BROKER = [
    (["produce", "-t", "events/abc", "x"], "produce", 2, "bad partition 'abc' in -t events/abc: want TOPIC/PARTITION"),
    (["produce", "-t", "events", "-p", "-1", "x"], "produce", 2, "partition -1 does not exist: partitions are numbered"),
    (["produce", "-t", "events/1", "-p", "2", "x"], "produce", 2, "give -p or TOPIC/PARTITION, not both"),
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
    (["replay", "nope", "-p", "fresh", "--parquet", "out"], "replay", 1,
     "the catalog cannot be read: no such table: topics"),
    (["replay", "nope", "--keep-seqs", "--parquet", "out"], "replay", 2, "--keep-seqs goes with --to-topic"),
    (["db", "current", "--catalog", "nosuch://x"], "db current", 1, "nosuch://x"),
]


@pytest.mark.parametrize("argv, command, status, says", WITHOUT_A_BROKER, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else None)
def test_a_bad_argument_is_one_line_naming_what_is_allowed(argv, command, status, says, tmp_path):
    proc = tiered(*argv, check=False, cwd=tmp_path, env={"TIERED_BROKER": ""})
    assert says in one_line_error(proc, command, status)


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
