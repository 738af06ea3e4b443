"""Two broker processes with mutual TLS, a plaintext listener on localhost and access rules, sharing one PostgreSQL
catalog and one bucket (issue 24, items 3 and 4): a redirect (0xfc) names the leader's TLS endpoint to a TLS client
and its plaintext endpoint to a plaintext one; the project's client and CLI follow it through TLS; the CLI's admin
commands go through the same listener and rules as any client; a graceful stop hands partitions over as without
TLS. With certificates that name the service (here `localhost`) and not the brokers' addresses, a redirect's broker
is verified by the name the client was given, or by --tls-server-name (tiered.client.server_name)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest

from tiered.client import CertificateRefused, Client, TankError, Unreachable
from tiered.protocol import requests as rq
from tiered.protocol.bundle import Message, encode_bundle
from tiered.protocol.codes import Endpoint
from tiered.protocol.frame import MsgType
from tiered.tls import client_context

from tests.cluster.conftest import LEASE_MS
from tests.server.rawwire import RawConnection
from tests.support.broker import BrokerProcess
from tests.support.certs import HAVE_OPENSSL, Certs
from tests.support.cli import one_line_error, tiered
from tests.support.ports import free_port

pytestmark = pytest.mark.skipif(not HAVE_OPENSSL, reason="needs the openssl command")

RULES = '''
[[rule]]
principals = ["admin"]
operations = ["*"]
topics = ["*"]

[[rule]]
principals = ["reader", "anonymous"]
operations = ["consume"]
topics = ["*"]
'''


class TLSBroker(BrokerProcess):
    """A broker process whose TANK listener speaks TLS: it is seen serving through its plaintext listener."""

    def __init__(self, data_dir, *extra: str, plain_port: int, env: dict | None = None):
        super().__init__(data_dir, *extra, "--listen-plain", f"127.0.0.1:{plain_port}", env=env)
        self.plain_port = plain_port

    def _pinged(self, timeout_s: float) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.plain_port), timeout=timeout_s) as sock:
                return len(sock.recv(5)) > 0
        except OSError:
            time.sleep(0.05)
            return False


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    c = Certs(tmp_path_factory.mktemp("certs"))
    c.issue("server")  # IP:127.0.0.1 and DNS:localhost
    c.issue("named", san="DNS:localhost")  # the service's name only, as a certificate from a Secret holds
    c.issue("admin")
    c.issue("reader")
    return c


def start(cluster, certs: Certs, broker_id: int, server: str = "server") -> TLSBroker:
    acl = cluster.root / "acl.toml"
    acl.write_text(RULES)
    flags = ("--catalog", cluster.catalog_url, "--store", cluster.store_url, "--s3-path-style", "--broker-id",
             str(broker_id), "--cluster-lease-ms", str(LEASE_MS), "--block-max-age-ms", "50",
             "--shutdown-timeout-s", "10", "--tls-cert", certs.path(f"{server}.pem"), "--tls-key",
             certs.path(f"{server}.key"), "--tls-client-ca", certs.path("ca.pem"), "--acl", str(acl))
    bp = TLSBroker(cluster.root / f"disk{broker_id}", *flags, plain_port=free_port(),
                   env={"AWS_ENDPOINT_URL": cluster.s3_endpoint})
    cluster.brokers[broker_id] = bp  # stopped by the cluster fixture
    return bp.start()


async def read_all(client: Client, topic: str, partition: int) -> list[bytes]:
    """Every message from seq 1 to the high-water mark (a consume answers one chunk: a block run, a segment)."""
    values, seq = [], 1
    while True:
        got = await client.consume(topic, partition, seq, max_wait_ms=0)
        values += [m.value for m in got.messages]
        if got.next_seq > got.hwmark:
            return values
        seq = got.next_seq


def tls(certs: Certs, name: str):
    return client_context(certs.path("ca.pem"), certs.path(f"{name}.pem"), certs.path(f"{name}.key"))


def cli_tls(certs: Certs, name: str) -> tuple[str, ...]:
    return ("--tls-ca", certs.path("ca.pem"), "--tls-cert", certs.path(f"{name}.pem"), "--tls-key",
            certs.path(f"{name}.key"))


async def test_redirects_name_the_endpoint_for_the_clients_connection_and_the_client_follows_over_tls(cluster, certs):
    b0, b1 = start(cluster, certs, 0), start(cluster, certs, 1)
    async with await Client.connect_any([f"127.0.0.1:{b0.port}"], ssl_context=tls(certs, "admin")) as admin:
        await admin.create_topic("ev", 2, {"produce.ack": "durable"})
    assert cluster.wait_for_leaders("ev", {0, 1}) == {0: 0, 1: 1}

    # The project's client, given broker 0 only, over TLS: partition 1 is redirected to broker 1's TLS listener.
    async with await Client.connect_any([f"127.0.0.1:{b0.port}"], ssl_context=tls(certs, "admin")) as admin:
        await admin.produce("ev", 1, [Message(b"one", None, 1), Message(b"two", None, 2)])
        assert admin.router.leaders[("ev", 1)] == Endpoint("127.0.0.1", b1.port)
        assert [m.value for m in (await admin.consume("ev", 1, 1)).messages] == [b"one", b"two"]

    # A plaintext client of broker 0's plaintext listener is sent to broker 1's plaintext listener: on the wire ...
    raw = await RawConnection.open(b0.plain_port)
    try:
        req = rq.ConsumeRequest(0x71, 0, 0, (rq.ConsumeTopic("ev", (rq.ConsumePartition(1, 2**64 - 1, 4096),)),))
        await raw.send(MsgType.CONSUME, rq.encode_consume_request(req))
        header = (bytes.fromhex("71000000 01 02") + b"ev" + bytes.fromhex("01 0100 fc 7f000001")
                  + struct.pack("<H", b1.plain_port))
        assert await raw.recv() == (MsgType.CONSUME, struct.pack("<I", len(header)) + header)
        # ... and a produce is refused before any redirect: anonymous may only consume.
        bundle = encode_bundle([Message(b"x")])
        req = rq.ProduceRequest(0x72, (rq.ProduceTopic("ev", (rq.ProducePartition(1, bundle),)),))
        await raw.send(MsgType.PRODUCE, rq.encode_produce_request(req))
        assert await raw.recv() == (MsgType.PRODUCE, bytes.fromhex("72000000") + b"\xfe")
    finally:
        await raw.close()
    # ... and by the project's client, which follows it without TLS.
    async with await Client.connect_any([f"127.0.0.1:{b0.plain_port}"]) as plain:
        result = await plain.consume("ev", 1, 2)
        assert [m.value for m in result.messages] == [b"two"]
        tail = await plain.consume("ev", 1, 2**64 - 1, max_wait_ms=0)
        assert tail.messages == [] and plain.router.leaders[("ev", 1)] == Endpoint("127.0.0.1", b1.plain_port)

    # Leases and failover are those of any service: broker 1 stops, its partition is handed to broker 0, and the
    # TLS client that knew broker 1 finds it there.
    async with await Client.connect_any([f"127.0.0.1:{b1.port}", f"127.0.0.1:{b0.port}"],
                                        ssl_context=tls(certs, "admin")) as admin:
        await admin.produce("ev", 1, [Message(b"three", None, 3)])
        assert await asyncio.to_thread(cluster.stop, 1) == 0
        await admin.produce("ev", 1, [Message(b"four", None, 4)])
        assert await read_all(admin, "ev", 1) == [b"one", b"two", b"three", b"four"]
    assert cluster.leaders("ev") == {0: 0, 1: 0}
    cluster.check("ev")


async def test_the_cli_through_tls_a_redirect_and_the_rules(cluster, certs):
    b0, b1 = start(cluster, certs, 0), start(cluster, certs, 1)
    first = f"127.0.0.1:{b0.port}"
    run = lambda *args, **kw: asyncio.to_thread(tiered, *args, **kw)  # noqa: E731 (the brokers are processes)

    await run("topic", "create", "ev", "2", "-b", first, *cli_tls(certs, "admin"))
    assert cluster.wait_for_leaders("ev", {0, 1}) == {0: 0, 1: 1}
    # Produce and consume partition 1 (led by broker 1) given broker 0 only: the CLI follows the redirect over TLS.
    await run("produce", "-t", "ev/1", "-b", first, *cli_tls(certs, "admin"), "hello", "world")
    out = (await run("consume", "-t", "ev/1", "-b", first, "-n", "2", *cli_tls(certs, "reader"))).stdout.decode()
    assert "hello" in out and "world" in out

    # The admin commands that speak TANK go through the same rules: reader may look, not create or produce.
    listed = (await run("topic", "list", "-b", first, *cli_tls(certs, "reader"))).stdout.decode()
    assert "ev" in listed
    await run("status", "-b", first, *cli_tls(certs, "reader"))
    refused = await run("topic", "create", "other", "1", "-b", first, *cli_tls(certs, "reader"), check=False)
    assert "access rules refuse this client" in one_line_error(refused, "topic create")
    refused = await run("produce", "-t", "ev/1", "-b", first, *cli_tls(certs, "reader"), "no", check=False)
    assert refused.returncode == 1 and refused.stderr.decode().count("\n") == 1, refused.stderr
    # Without a client certificate the handshake fails: one line, nothing done.
    refused = await run("topic", "create", "other", "1", "-b", first, "--tls-ca", certs.path("ca.pem"), check=False)
    assert refused.returncode == 1 and refused.stderr.decode().count("\n") == 1 and b"TLS" in refused.stderr
    assert "other" not in (await run("topic", "list", "-b", first, *cli_tls(certs, "admin"))).stdout.decode()
    assert "refused create on topic 'other' for principal 'reader'" in b0.output()
    cluster.check("ev")


async def test_a_redirect_is_verified_by_the_name_the_client_was_given(cluster, certs):
    # Both brokers hold a certificate naming only DNS:localhost, and advertise 127.0.0.1:<port>.
    b0, b1 = start(cluster, certs, 0, "named"), start(cluster, certs, 1, "named")
    by_name = [f"localhost:{b0.port}"]
    async with await Client.connect_any(by_name, ssl_context=tls(certs, "admin")) as admin:
        await admin.create_topic("ev", 2, {"produce.ack": "durable"})
    assert cluster.wait_for_leaders("ev", {0, 1}) == {0: 0, 1: 1}
    leader = Endpoint("127.0.0.1", b1.port)

    # The certificate does not name the address a redirect carries: verified by it (as clients did), it is refused.
    with pytest.raises(Unreachable) as refused:
        await Client.connect_any([str(leader)], ssl_context=tls(certs, "admin"))
    assert f"the certificate of the broker at {leader} was refused, verified as '127.0.0.1'" in str(refused.value)

    # Bootstrapped by localhost: partition 1 is redirected to 127.0.0.1:<b1>, which is verified as localhost.
    async with await Client.connect_any(by_name, ssl_context=tls(certs, "admin")) as admin:
        await admin.produce("ev", 1, [Message(b"one", None, 1)])
        assert admin.router.leaders[("ev", 1)] == leader
        assert (await admin.router.connection(leader)).server_name == "localhost"
        assert [m.value for m in (await admin.consume("ev", 1, 1)).messages] == [b"one"]

    # Bootstrapped by an address, with the service's name given: every broker is verified by it.
    async with await Client.connect_any([f"127.0.0.1:{b0.port}"], ssl_context=tls(certs, "admin"),
                                        tls_server_name="localhost") as admin:
        await admin.produce("ev", 1, [Message(b"two", None, 2)])
        assert admin.router.leaders[("ev", 1)] == leader
        assert (await admin.router.connection(leader)).server_name == "localhost"
        assert await read_all(admin, "ev", 1) == [b"one", b"two"]
    cluster.check("ev")


async def test_a_redirect_to_a_broker_whose_certificate_names_another_is_one_line_and_the_cli_takes_the_name(
        cluster, certs):
    # Broker 0's certificate names 127.0.0.1, broker 1's only localhost: a client given 127.0.0.1 reaches broker 0
    # and is redirected to a broker that cannot prove that address.
    b0, b1 = start(cluster, certs, 0), start(cluster, certs, 1, "named")
    first, leader = f"127.0.0.1:{b0.port}", f"127.0.0.1:{b1.port}"
    run = lambda *args, **kw: asyncio.to_thread(tiered, *args, **kw)  # noqa: E731 (the brokers are processes)
    await run("topic", "create", "ev", "2", "-b", first, *cli_tls(certs, "admin"))
    assert cluster.wait_for_leaders("ev", {0, 1}) == {0: 0, 1: 1}

    # Refused at once (the same broker would show the same certificate), naming the name checked and the address.
    said = (f"TLS handshake failed: the certificate of the broker at {leader} was refused, verified as '127.0.0.1' "
            f"(IP address mismatch, certificate is not valid for '127.0.0.1'); a certificate names the service, not "
            f"each broker's address: connect by a name it holds (-b) or give that name as --tls-server-name")
    async with await Client.connect_any([first], ssl_context=tls(certs, "admin")) as admin:
        with pytest.raises(CertificateRefused) as refused:
            await admin.produce("ev", 1, [Message(b"lost")])
        assert str(refused.value) == said
    failed = await run("produce", "-t", "ev/1", "-b", first, *cli_tls(certs, "admin"), "lost", check=False)
    assert said in one_line_error(failed, "produce")
    failed = await run("consume", "-t", "ev/1", "-b", first, "-n", "1", *cli_tls(certs, "admin"), check=False)
    assert one_line_error(failed, "consume") == f"tiered consume: {said}\n"
    failed = await run("status", "-b", leader, *cli_tls(certs, "admin"), check=False)  # a bootstrap broker alike
    assert one_line_error(failed, "status") == f"tiered status: {said}\n"

    # The CLI given the name, as a flag or from the environment, or bootstrapped by it.
    await run("produce", "-t", "ev/1", "-b", first, *cli_tls(certs, "admin"), "--tls-server-name", "localhost",
              "hello")
    await run("produce", "-t", "ev/1", "-b", first, *cli_tls(certs, "admin"), "world",
              env={"TIERED_TLS_SERVER_NAME": "localhost"})
    out = (await run("consume", "-t", "ev/1", "-b", first, "-n", "2", *cli_tls(certs, "reader"),
                     env={"TIERED_TLS_SERVER_NAME": "localhost"})).stdout.decode()
    assert out.split() == ["1", "hello", "2", "world"]  # seqs and values: the refused "lost" was never stored
    out = (await run("consume", "-t", "ev/1", "-b", f"localhost:{b0.port}", "-n", "2", "--tls-server-name",
                     "localhost", *cli_tls(certs, "reader"))).stdout.decode()
    assert out.split() == ["1", "hello", "2", "world"]
    bad = await run("status", "-b", first, *cli_tls(certs, "admin"), "--tls-server-name", "*.svc", check=False)
    assert "bad TLS server name '*.svc'" in one_line_error(bad, "status", status=2)
    cluster.check("ev")
