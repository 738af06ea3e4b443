"""The `tiered` command line against a real broker process."""

from __future__ import annotations

from tests.support.cli import tiered


def test_topic_produce_consume_status_round_trip(broker_process):
    bp = broker_process()
    b = f"127.0.0.1:{bp.port}"
    assert "created topic orders" in tiered("topic", "create", "-b", b, "orders", "2",
                                            "-o", "log.segment.bytes=1m").stdout.decode()
    assert tiered("topic", "create", "-b", b, "orders", "2", check=False).returncode == 1
    tiered("produce", "-b", b, "-t", "orders/1", "first", "second")
    tiered("produce", "-b", b, "-t", "orders", "--partition", "1", "-f", "-", "-s", "2", input=b"third\nfourth\nfifth\n")
    out = tiered("consume", "-b", b, "-t", "orders/1", "-d", "beginning").stdout.decode()
    assert out.splitlines() == ["1\tfirst", "2\tsecond", "3\tthird", "4\tfourth", "5\tfifth"]
    out = tiered("consume", "-b", b, "-t", "orders/1", "-d", "-F", "content", "4").stdout.decode()
    assert out.splitlines() == ["fourth", "fifth"]
    out = tiered("consume", "-b", b, "-t", "orders/1", "-n", "2", "-F", "seq", "2").stdout.decode()
    assert out.splitlines() == ["2", "3"]
    assert tiered("topic", "list", "-b", b).stdout.decode().splitlines() == ["orders\t2"]
    described = tiered("topic", "describe", "-b", b, "orders").stdout.decode().splitlines()
    assert described[1:] == ["0\t0\t0", "1\t1\t5"]
    status = tiered("status", "-b", b).stdout.decode()
    assert status.startswith(f"broker {b}\n") and "topics 1" in status and "partitions 2" in status


def test_produce_with_explicit_seq_makes_sparse_bundles(broker_process):
    bp = broker_process()
    b = f"127.0.0.1:{bp.port}"
    tiered("topic", "create", "-b", b, "m", "1")
    tiered("produce", "-b", b, "-t", "m", "-S", "100", "-s", "3", "a", "b", "c")
    out = tiered("consume", "-b", b, "-t", "m", "-d").stdout.decode()
    assert out.splitlines() == ["100\ta", "101\tb", "102\tc"]


def test_unreachable_broker_is_a_clear_error():
    proc = tiered("status", "-b", "127.0.0.1:1", check=False)
    assert proc.returncode == 1 and proc.stderr.startswith(b"tiered status: cannot reach a broker at 127.0.0.1:1")


def test_help_lists_the_commands():
    out = tiered("--help").stdout.decode()
    for command in ("serve", "topic", "produce", "consume", "status", "verify"):
        assert command in out
