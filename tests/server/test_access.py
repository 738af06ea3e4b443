"""The access rules on a live broker (docs/operations.md, "Access rules"): mutual TLS names the principal, the rules
file allows and refuses per topic and prefix for produce, consume, create and reload, the plaintext listener's
clients are `anonymous`, a refusal is answered with TANK's nearest code, logged with the principal and counted in
`tiered_requests_refused_total{op}`, and the file is reloaded when it changes. The decision itself is table-tested
in tests/server/test_acl.py."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys

import pytest

from tiered.acl import RulesError
from tiered.client import Client, TankError, UnknownTopic
from tiered.protocol.bundle import Message
from tiered.protocol.codes import CreateTopicStatus, ReloadConfStatus
from tiered.server.app import App
from tiered.tls import client_context

from tests.support.broker import REPO, local_settings
from tests.support.certs import HAVE_OPENSSL, Certs
from tests.support.clock import ManualClock
from tests.support.ports import free_port

pytestmark = pytest.mark.skipif(not HAVE_OPENSSL, reason="needs the openssl command")

RULES = '''
[[rule]]
principals = ["billing"]
operations = ["produce", "consume"]
topics = ["billing-*"]

[[rule]]
principals = ["*"]
operations = ["consume"]
topics = ["public"]

[[rule]]
principals = ["anonymous"]
operations = ["consume"]
topics = ["local-*"]

[[rule]]
principals = ["ops"]
operations = ["create", "reload"]
topics = ["billing-*", "public", "local-*"]
'''


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    c = Certs(tmp_path_factory.mktemp("certs"))
    c.issue("server")
    c.issue("billing")
    c.issue("ops")
    c.issue("stranger")
    c.issue("spiffe", cn="", san="URI:spiffe://acme/billing")  # no CN: its URI SAN is the principal
    return c


class Broker:
    """A local broker with mutual TLS, a plaintext listener and the rules file `acl.toml`, on a manual clock."""

    def __init__(self, tmp_path, certs: Certs, rules: str = RULES):
        self.certs = certs
        self.acl = tmp_path / "acl.toml"
        self.acl.write_text(rules)
        self.plain_port = free_port()
        self.clock = ManualClock()
        settings = local_settings(tmp_path / "data", tls_cert=certs.path("server.pem"),
                                  tls_key=certs.path("server.key"), tls_client_ca=certs.path("ca.pem"),
                                  listen_plain=f"127.0.0.1:{self.plain_port}", acl=str(self.acl))
        self.app = App(settings, local_only=True, clock=self.clock)

    async def client(self, name: str | None) -> Client:
        """A client with `name`'s certificate over TLS; None: a plaintext client of the plaintext listener."""
        if name is None:
            return await Client.connect("127.0.0.1", self.plain_port)
        ctx = client_context(self.certs.path("ca.pem"), self.certs.path(f"{name}.pem"), self.certs.path(f"{name}.key"))
        return await Client.connect("127.0.0.1", self.app.broker.port, ssl_context=ctx)

    def refused(self) -> dict[str, float]:
        text = self.app.metrics.render()
        return {op: float(n) for op, n in re.findall(r'^tiered_requests_refused_total\{op="(\w+)"\} (\S+)$', text, re.M)}


@pytest.fixture
async def broker(tmp_path, certs):
    b = Broker(tmp_path, certs)
    await b.app.start()
    try:
        yield b
    finally:
        await b.app.stop()


async def test_rules_allow_and_refuse_per_topic_and_prefix(broker, caplog):
    caplog.set_level(logging.WARNING, logger="tiered.server")
    assert broker.refused() == {"produce": 0, "consume": 0, "create": 0, "reload": 0}  # exported from the start
    async with await broker.client("ops") as ops:
        for topic in ("billing-eu", "public", "local-x"):
            assert await ops.create_topic(topic, 1) == CreateTopicStatus.OK
        with pytest.raises(TankError) as refused:
            await ops.create_topic("other", 1)
        assert refused.value.code == CreateTopicStatus.READ_ONLY and "access rules" in str(refused.value)
        with pytest.raises(TankError):  # ops may create, not produce
            await ops.produce("billing-eu", 0, [Message(b"no", None, 1)])
    async with await broker.client("billing") as billing:
        await billing.produce("billing-eu", 0, [Message(b"paid", None, 1)])
        assert [m.value for m in (await billing.consume("billing-eu", 0, 1)).messages] == [b"paid"]
        with pytest.raises(TankError) as refused:
            await billing.produce("public", 0, [Message(b"no", None, 1)])
        assert refused.value.code == 0xFE  # read-only: TANK's nearest refusal of a produce
        assert (await billing.consume("public", 0, 1)).messages == []  # "*": any principal with a certificate
        with pytest.raises(TankError):
            await billing.create_topic("billing-new", 1)
    async with await broker.client("stranger") as stranger:
        with pytest.raises(UnknownTopic):  # a consume refused is answered as an unknown topic
            await stranger.consume("billing-eu", 0, 1)
        assert (await stranger.consume("public", 0, 1)).messages == []
    async with await broker.client("spiffe") as spiffe:  # principal "spiffe://acme/billing": not "billing"
        with pytest.raises(UnknownTopic):
            await spiffe.consume("billing-eu", 0, 1)
    assert "billing-new" not in broker.app.broker.registry.topics and "other" not in broker.app.broker.registry.topics
    assert broker.refused() == {"produce": 2, "consume": 2, "create": 2, "reload": 0}
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any("refused produce on topic 'public' for principal 'billing'" in line for line in lines)
    assert any("refused consume on topic 'billing-eu' for principal 'spiffe://acme/billing'" in line for line in lines)
    assert any("refused create on topic 'other' for principal 'ops'" in line for line in lines)


async def test_reload_conf_is_allowed_or_refused_by_the_rules(broker):
    async with await broker.client("ops") as ops:
        await ops.create_topic("billing-eu", 1)
    config = broker.app.settings.data_dir / "billing-eu" / "0" / "config"
    config.write_text("retention.segments.count=5\n")
    async with await broker.client("ops") as ops:
        assert await ops.reload_conf("billing-eu", 0) == ReloadConfStatus.OK
    async with await broker.client("billing") as billing:
        assert await billing.reload_conf("billing-eu", 0) == ReloadConfStatus.UNKNOWN_TOPIC
    assert broker.refused()["reload"] == 1


async def test_the_plaintext_listener_is_anonymous(broker):
    async with await broker.client("ops") as ops:
        await ops.create_topic("local-x", 1)
        await ops.create_topic("billing-eu", 1)
    async with await broker.client("billing") as billing:
        await billing.produce("billing-eu", 0, [Message(b"paid", None, 1)])
    async with await broker.client(None) as anonymous:
        assert (await anonymous.consume("local-x", 0, 1)).messages == []
        with pytest.raises(UnknownTopic):
            await anonymous.consume("billing-eu", 0, 1)
        with pytest.raises(TankError):
            await anonymous.produce("local-x", 0, [Message(b"no", None, 1)])
        with pytest.raises(TankError):
            await anonymous.create_topic("local-y", 1)
        # Metadata is not checked: names, counts and bounds, never messages.
        assert {t.name for t in await anonymous.discover_topics()} == {"local-x", "billing-eu"}


async def test_a_certificate_of_another_ca_is_refused_before_any_rule(broker, tmp_path):
    other = Certs(tmp_path / "other", "otherca")
    cert, key = other.issue("billing")  # the right name, the wrong CA
    ctx = client_context(broker.certs.path("ca.pem"), cert, key)
    with pytest.raises((ConnectionError, OSError)):
        async with await Client.connect("127.0.0.1", broker.app.broker.port, ssl_context=ctx) as client:
            await client.create_topic("billing-x", 1)
    assert "billing-x" not in broker.app.broker.registry.topics
    assert broker.refused() == {"produce": 0, "consume": 0, "create": 0, "reload": 0}


async def test_the_rules_file_is_reloaded_when_it_changes_and_a_bad_one_keeps_the_rules(broker, caplog):
    caplog.set_level(logging.INFO, logger="tiered.server")
    async with await broker.client("ops") as ops:
        await ops.create_topic("public", 1)
    async with await broker.client(None) as anonymous:
        with pytest.raises(UnknownTopic):
            await anonymous.consume("public", 0, 1)
        broker.acl.write_text(RULES.replace('topics = ["local-*"]', 'topics = ["local-*", "public"]'))
        os.utime(broker.acl, ns=(1, 1))  # a new mtime whatever the file system's resolution
        broker.clock.advance(5.0)  # the broker's reload timer (tiered.acl.RELOAD_INTERVAL_S)
        await broker.clock.settle()
        assert (await anonymous.consume("public", 0, 1)).messages == []  # the open connection follows the new rules
        broker.acl.write_text("[[rule]]\nprincipals = 1\n")
        os.utime(broker.acl, ns=(2, 2))
        broker.clock.advance(5.0)
        await broker.clock.settle()
        assert (await anonymous.consume("public", 0, 1)).messages == []  # kept
    messages = [r.getMessage() for r in caplog.records]
    assert any("access rules reloaded" in m for m in messages)
    bad = [m for m in messages if "principals must be" in m]
    assert len(bad) == 1 and "keeping the rules in force" in bad[0] and "\n" not in bad[0]


async def test_a_refusal_in_a_loop_is_logged_once_per_window(broker, caplog):
    caplog.set_level(logging.WARNING, logger="tiered.server")
    async with await broker.client("ops") as ops:
        await ops.create_topic("public", 1)
    async with await broker.client("stranger") as stranger:
        for _ in range(50):
            with pytest.raises(TankError):
                await stranger.produce("public", 0, [Message(b"no", None, 1)])
    assert broker.refused()["produce"] == 50
    assert sum("refused produce" in r.getMessage() for r in caplog.records) == 1


async def test_a_malformed_rules_file_does_not_start_the_broker(tmp_path, certs):
    bad = tmp_path / "acl.toml"
    bad.write_text("[[rule]]\nprincipals = [\"a\"]\noperations = [\"write\"]\ntopics = [\"t\"]\n")
    with pytest.raises(RulesError, match="unknown operation 'write'"):
        App(local_settings(tmp_path / "data", acl=str(bad)), local_only=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for path in (str(bad), str(tmp_path / "missing.toml")):
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "tiered.cli.main", "serve", "-p", str(tmp_path / "d"), "--acl",
                             path], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("tiered serve: access rules") and path in done.stderr


def test_the_rules_file_is_a_setting_like_any_other(tmp_path):
    from tiered.config import load_settings

    config = tmp_path / "tiered.toml"
    config.write_text(f'data_dir = "{tmp_path / "d"}"\nacl = "/etc/tiered/from-file.toml"\n')
    assert load_settings({"config": str(config)}, environ={}).acl == "/etc/tiered/from-file.toml"
    environ = {"TIERED_CONFIG": str(config), "TIERED_ACL": "/etc/tiered/from-env.toml"}
    assert load_settings({}, environ=environ).acl == "/etc/tiered/from-env.toml"
    assert load_settings({"acl": "/etc/tiered/from-flag.toml"}, environ=environ).acl == "/etc/tiered/from-flag.toml"
