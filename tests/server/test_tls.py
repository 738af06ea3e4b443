"""TLS on the TANK listener: real handshakes over 127.0.0.1 with certificates made in the test by `openssl`
(tests/support/certs.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tiered.client import Client
from tiered.client.connection import reason
from tiered.protocol.bundle import Message
from tiered.server.app import App
from tiered.tls import TLSError, client_context

from tests.support.broker import REPO, local_settings
from tests.support.certs import HAVE_OPENSSL, Certs

pytestmark = pytest.mark.skipif(not HAVE_OPENSSL, reason="needs the openssl command")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    c = Certs(tmp_path_factory.mktemp("certs"))
    c.issue("server")
    c.issue("client")
    c.issue("expired", days=-1)
    return c


async def _start(tmp_path, certs: Certs, **tls) -> App:
    settings = local_settings(tmp_path / "data", tls_cert=certs.path("server.pem"), tls_key=certs.path("server.key"),
                              **tls)
    app = App(settings, local_only=True)
    await app.start()
    return app


async def _produce_consume(client: Client, topic: str) -> list[bytes]:
    await client.create_topic(topic, 1)
    await client.produce(topic, 0, [Message(b"one", None, 1), Message(b"two", None, 2)])
    return [m.value for m in (await client.consume(topic, 0, 1)).messages]


async def test_produce_and_consume_over_tls(tmp_path, certs):
    app = await _start(tmp_path, certs)
    try:
        ctx = client_context(certs.path("ca.pem"))
        async with await Client.connect("127.0.0.1", app.broker.port, ssl_context=ctx) as client:
            assert await _produce_consume(client, "secure") == [b"one", b"two"]
    finally:
        await app.stop()


async def test_a_tls_connection_has_nagle_off_underneath(tmp_path, certs):
    app = await _start(tmp_path, certs)
    try:
        ctx = client_context(certs.path("ca.pem"))
        async with await Client.connect("127.0.0.1", app.broker.port, ssl_context=ctx) as client:
            assert await _produce_consume(client, "nodelay") == [b"one", b"two"]
            flags = [c.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                     for c in app.broker.connections]
            assert flags and all(flags), flags
    finally:
        await app.stop()


async def test_mutual_tls_refuses_a_client_without_a_certificate_and_serves_one_with(tmp_path, certs):
    app = await _start(tmp_path, certs, tls_client_ca=certs.path("ca.pem"))
    try:
        with pytest.raises((ConnectionError, OSError)) as refused:
            async with await Client.connect("127.0.0.1", app.broker.port,
                                            ssl_context=client_context(certs.path("ca.pem"))) as client:
                await client.create_topic("nope", 1)  # TLS 1.3: the refusal arrives after the client's handshake
        assert "certificate" in reason(refused.value.__cause__ or refused.value) or "TLS" in str(refused.value)
        ctx = client_context(certs.path("ca.pem"), certs.path("client.pem"), certs.path("client.key"))
        async with await Client.connect("127.0.0.1", app.broker.port, ssl_context=ctx) as client:
            assert await _produce_consume(client, "mutual") == [b"one", b"two"]
    finally:
        await app.stop()


async def test_an_expired_or_wrongly_signed_broker_certificate_is_refused_by_the_client(tmp_path, certs):
    other = Certs(tmp_path / "other", "otherca")
    for cert, key in ((certs.path("expired.pem"), certs.path("expired.key")), other.issue("stranger")):
        settings = local_settings(tmp_path / f"data-{Path(cert).stem}", tls_cert=cert, tls_key=key)
        app = App(settings, local_only=True)
        await app.start()
        try:
            with pytest.raises(OSError) as refused:  # Client.connect raises asyncio's error, NotSent its cause
                await Client.connect("127.0.0.1", app.broker.port, ssl_context=client_context(certs.path("ca.pem")))
            line = reason(refused.value)
            assert "TLS handshake failed" in line and "\n" not in line
            assert ("expired" in line) == (Path(cert).stem == "expired")
        finally:
            await app.stop()


async def test_an_expired_client_certificate_is_refused_under_mutual_tls(tmp_path, certs):
    app = await _start(tmp_path, certs, tls_client_ca=certs.path("ca.pem"))
    try:
        ctx = client_context(certs.path("ca.pem"), certs.path("expired.pem"), certs.path("expired.key"))
        with pytest.raises((ConnectionError, OSError)):
            async with await Client.connect("127.0.0.1", app.broker.port, ssl_context=ctx) as client:
                await client.create_topic("nope", 1)
        assert "nope" not in app.broker.registry.topics
    finally:
        await app.stop()


async def test_a_rotated_certificate_is_used_by_new_connections_and_a_bad_file_keeps_the_old(tmp_path, certs):
    folder = tmp_path / "live"
    folder.mkdir()
    for name in ("server.pem", "server.key"):
        shutil.copy(certs.path(name), folder / name)
    settings = local_settings(tmp_path / "data", tls_cert=str(folder / "server.pem"), tls_key=str(folder / "server.key"))
    app = App(settings, local_only=True)
    await app.start()
    reloader = app.broker.tls
    try:
        other = Certs(tmp_path / "other", "otherca")
        cert, key = other.issue("rotated")
        now = reloader._checked_at
        assert not reloader.check(now + reloader.interval_s)  # nothing changed on disk
        shutil.copy(cert, folder / "server.pem")
        shutil.copy(key, folder / "server.key")
        os.utime(folder / "server.pem", ns=(1, 1))  # a new mtime even within the file system's resolution
        assert not reloader.check(now + reloader.interval_s + 0.5)  # too soon after the last look
        assert reloader.check(now + 2 * reloader.interval_s)
        async with await Client.connect("127.0.0.1", app.broker.port,
                                        ssl_context=client_context(other.path("otherca.pem"))) as client:
            assert await _produce_consume(client, "rotated") == [b"one", b"two"]
        with pytest.raises(OSError):
            await Client.connect("127.0.0.1", app.broker.port, ssl_context=client_context(certs.path("ca.pem")))
        (folder / "server.pem").write_text("not a certificate\n")
        assert not reloader.check(now + 3 * reloader.interval_s)  # kept the rotated one
        async with await Client.connect("127.0.0.1", app.broker.port,
                                        ssl_context=client_context(other.path("otherca.pem"))) as client:
            assert [m.value for m in (await client.consume("rotated", 0, 1)).messages] == [b"one", b"two"]
    finally:
        await app.stop()


async def test_a_plaintext_client_is_closed_while_a_tls_client_keeps_working(tmp_path, certs):
    from tests.support.ports import free_port

    plain_port = free_port()
    app = await _start(tmp_path, certs, listen_plain=f"127.0.0.1:{plain_port}")
    try:
        async with await Client.connect("127.0.0.1", app.broker.port,
                                        ssl_context=client_context(certs.path("ca.pem"))) as secure:
            await secure.create_topic("mixed", 1)
            reader, writer = await asyncio.open_connection("127.0.0.1", app.broker.port)
            writer.write(b"\x00" * 64)  # not a ClientHello
            await asyncio.wait_for(reader.read(), 10)  # whatever alert the broker sends, then its close
            assert reader.at_eof()
            writer.close()
            await secure.produce("mixed", 0, [Message(b"still", None, 1)])
            assert [m.value for m in (await secure.consume("mixed", 0, 1)).messages] == [b"still"]
        async with await Client.connect("127.0.0.1", plain_port) as plain:  # the plaintext listener
            assert [m.value for m in (await plain.consume("mixed", 0, 1)).messages] == [b"still"]
    finally:
        await app.stop()


def test_bad_client_tls_files_are_one_line():
    with pytest.raises(TLSError) as bad:
        client_context("/nonexistent/ca.pem")
    assert "no such file" in str(bad.value)
    with pytest.raises(TLSError):
        client_context("", "/only/a/cert.pem", "")


async def test_the_cli_produces_and_consumes_through_tls(tmp_path, certs):
    app = await _start(tmp_path, certs, tls_client_ca=certs.path("ca.pem"))
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO), "TIERED_TLS_CA": certs.path("ca.pem")}
        tls = ["--tls-cert", certs.path("client.pem"), "--tls-key", certs.path("client.key")]
        broker = f"127.0.0.1:{app.broker.port}"

        async def cli(*args: str, stdin: bytes = b"") -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tiered.cli.main", *args, env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = await proc.communicate(stdin)
            return proc.returncode, out.decode(), err.decode()

        code, out, err = await cli("topic", "create", "clitls", "1", "-b", broker, *tls)
        assert code == 0, err
        code, out, err = await cli("produce", "-t", "clitls", "-b", broker, *tls, "hello", "world")
        assert code == 0, err
        code, out, err = await cli("consume", "-t", "clitls", "-b", broker, "-n", "2", *tls, "beginning")
        assert code == 0, err
        assert "hello" in out and "world" in out
        code, out, err = await cli("topic", "create", "refused", "1", "-b", broker)  # no client certificate
        assert code == 1
        assert len(err.strip().splitlines()) == 1 and "TLS" in err
    finally:
        await app.stop()


def test_bad_tls_flags_are_one_line_for_the_cli_and_the_broker(tmp_path, certs):
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tiered.cli.main", *args], env=env, capture_output=True,
                              text=True, timeout=60)

    missing = cli("topic", "list", "-b", "127.0.0.1:1", "--tls-ca", str(tmp_path / "nope.pem"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such file" in missing.stderr
    no_key = cli("serve", "-p", str(tmp_path / "d"), "--tls-cert", certs.path("server.pem"))
    assert no_key.returncode == 2 and no_key.stderr.count("\n") == 1 and "tls_key" in no_key.stderr
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    unloadable = cli("serve", "-p", str(tmp_path / "d"), "--tls-cert", str(bad), "--tls-key", str(bad))
    assert unloadable.returncode == 2 and unloadable.stderr.count("\n") == 1 and "TLS" in unloadable.stderr


async def test_shutdown_cuts_off_a_tls_client_that_never_answers_the_close(tmp_path, certs, caplog):
    """A TLS close waits for the client's close_notify; a client that never reads again must not hold the broker's
    shutdown past its deadline (asyncio alone would wait 30 s per connection, one after another)."""
    import logging
    import socket
    import ssl

    caplog.set_level(logging.WARNING, logger="tiered.server")
    settings = local_settings(tmp_path / "data", tls_cert=certs.path("server.pem"), tls_key=certs.path("server.key"),
                              shutdown_timeout_s=0.5)
    app = App(settings, local_only=True)
    await app.start()
    ctx = client_context(certs.path("ca.pem"))

    def silent_client() -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", app.broker.port), timeout=10)
        tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        tls.recv(5)  # the broker's ping: it serves this connection; from here on nothing is read
        return tls

    silent = await asyncio.to_thread(silent_client)
    try:
        await app.stop()
        assert any("did not close by the shutdown deadline; cut off" in r.getMessage() for r in caplog.records)
        silent.settimeout(10)

        def read_to_the_end() -> bytes:
            try:
                return silent.recv(1024)  # the broker's close_notify reads as the end of the stream
            except (ConnectionError, ssl.SSLError):
                return b""  # or the connection was cut

        assert await asyncio.to_thread(read_to_the_end) == b""
    finally:
        silent.close()
