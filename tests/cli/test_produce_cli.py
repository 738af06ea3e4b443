"""`tiered produce` as a user meets it: a file goes in batched, pipelined bundles; an ambiguous failure says what may
be committed and where to look before retrying; progress never mixes with data."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time

from tests.support.broker import REPO
from tests.support.cli import one_line_error, tiered


def test_a_file_goes_in_batched_pipelined_bundles_in_order(broker_process, tmp_path):
    bp = broker_process()
    b = ("-b", f"127.0.0.1:{bp.port}")
    tiered("topic", "create", *b, "lines", "1")  # durable acks: each request waits for its block's commit
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"line {i}\n" for i in range(20_000)))
    proc = tiered("produce", *b, "-t", "lines", "-f", str(lines))
    summary = proc.stderr.decode()
    bundles = int(re.search(r"produced 20,000 messages to lines/0 in ([\d,]+) bundles", summary)[1].replace(",", ""))
    assert 40 <= bundles <= 200  # batched: up to 500 lines a bundle, fewer when the reader had fewer ready
    assert proc.stdout == b""
    out = tiered("consume", *b, "-t", "lines", "-d", "-F", "content").stdout.decode().splitlines()
    assert out == [f"line {i}" for i in range(20_000)]
    # -s 1 still pipelines: one message per bundle, many requests in flight.
    proc = tiered("produce", *b, "-t", "lines", "-s", "1", "-f", "-", input=b"a\nb\nc\n")
    assert "produced 3 messages to lines/0 in 3 bundles" in proc.stderr.decode()


def _break_store(objects):
    """The object store's directory replaced by a file: every PUT fails (and is retried) until it is restored."""
    objects.rename(objects.with_name("objects.away"))
    objects.write_text("not a directory")


def _restore_store(objects):
    objects.unlink()
    objects.with_name("objects.away").rename(objects)


def test_an_unconfirmed_produce_says_it_may_still_be_committed_and_where_to_check(broker_process, tmp_path):
    objects = tmp_path / "objects"
    # The broker's ack deadline (4 s, not the default 10 s) stays well past the client's own 1.5 s below.
    bp = broker_process("--store", f"file://{objects}", "--produce-ack-timeout-ms", "4000")
    b = ("-b", f"127.0.0.1:{bp.port}")
    tiered("topic", "create", *b, "t1", "1")
    tiered("produce", *b, "-t", "t1", "before")

    _break_store(objects)
    # The client's own deadline passes first.
    err = one_line_error(tiered("produce", *b, "-t", "t1", "--timeout", "1.5", "maybe", check=False), "produce")
    assert "t1/0: 1 message not confirmed: no answer within 1.5 s; they may still be committed: check from seq 2" in err
    assert "`tiered consume -t t1/0 -d 2` before retrying (0 messages confirmed" in err
    # The broker's ack deadline passes first: it answers 0x03 (appended, not committed in time), just as ambiguous.
    err = one_line_error(tiered("produce", *b, "-t", "t1", "--timeout", "60", "again", check=False), "produce")
    assert "1 message not confirmed: the broker answered ack timeout (appended, but its block was not committed" in err
    assert "check from seq 2 " in err

    _restore_store(objects)
    # As the error warned: the block kept retrying, and both messages are committed once the store is back.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = tiered("consume", *b, "-t", "t1", "-d", "2").stdout.decode().splitlines()
        if len(out) == 2:
            break
        time.sleep(0.2)
    assert out == ["2\tmaybe", "3\tagain"]


def _on_terminal(argv: list[str], *, stdout_too: bool, input: bytes | None = None) -> tuple[bytes, bytes]:
    """Runs `tiered` with stderr on a pseudo-terminal (and stdout on the same one when `stdout_too`)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal's size
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    proc = subprocess.Popen([sys.executable, "-m", "tiered.cli.main", *argv], stdin=subprocess.PIPE,
                            stdout=follower if stdout_too else subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    out = []
    reader = threading.Thread(target=lambda: out.append(b"" if stdout_too else proc.stdout.read()))
    reader.start()  # stdout is read while the terminal is, so neither pipe fills up
    if input is not None:
        proc.stdin.write(input)
    proc.stdin.close()
    terminal = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the pty closes when the process exits
            break
        if not chunk:
            break
        terminal += chunk
    assert proc.wait(60) == 0, terminal
    reader.join(60)
    os.close(leader)
    return out[0], terminal


def test_progress_goes_to_a_terminal_stderr_only_when_the_data_does_not(broker_process, tmp_path):
    bp = broker_process()
    b = ["-b", f"127.0.0.1:{bp.port}"]
    tiered("topic", "create", *b, "p", "1", "-o", "produce.ack=local")
    data = b"".join(b"m%d\n" % i for i in range(10_000))
    out, terminal = _on_terminal(["produce", *b, "-t", "p", "-f", "-", "-s", "20"], stdout_too=False, input=data)
    assert b"msg/s" in terminal and b"produced 10,000 messages" in terminal and out == b""
    # From a file of known size the bar counts its bytes, so it has a percentage and an ETA.
    source = tmp_path / "lines.txt"
    source.write_bytes(data)
    tiered("topic", "create", *b, "pf", "1", "-o", "produce.ack=local")
    out, terminal = _on_terminal(["produce", *b, "-t", "pf", "-f", str(source), "-s", "20"], stdout_too=False)
    assert b"%|" in terminal and b"B/s" in terminal and out == b""
    # Data to a pipe, stderr a terminal: the bar is drawn on stderr, stdout holds only the data.
    out, terminal = _on_terminal(["consume", *b, "-t", "p", "-d", "-F", "content", "--fetch-size", "2048"], stdout_too=False)
    assert out.splitlines() == [b"m%d" % i for i in range(10_000)]
    assert b"msg" in terminal
    # Data and stderr on the same terminal: no bar, only clean lines.
    _, terminal = _on_terminal(["consume", *b, "-t", "p", "-d", "-F", "content", "-n", "3"], stdout_too=True)
    assert terminal.replace(b"\r\n", b"\n") == b"m0\nm1\nm2\n"
