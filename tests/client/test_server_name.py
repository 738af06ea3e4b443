"""The name a TLS client verifies each broker by (tiered.client.server_name): the override, else the name the broker was
given by, else the service's name from the bootstrap list, else the broker's own address."""

from __future__ import annotations

import pytest

from tiered.client.errors import CertificateRefused
from tiered.client.routing import Router
from tiered.protocol.codes import Endpoint
from tiered.tls import client_context
from tiered.client.server_name import check_server_name, is_address, server_name

SERVICE = "tiered.streams.svc.cluster.local"


@pytest.mark.parametrize(("host", "bootstrap", "override", "name"), [
    # A redirect's address, for a client bootstrapped by the service's name: verified by that name.
    ("10.244.1.7", [SERVICE], "", SERVICE),
    ("127.0.0.1", ["localhost"], "", "localhost"),
    # The broker the client was given by name: by that name.
    (SERVICE, [SERVICE], "", SERVICE),
    ("tiered-0.tiered-headless", ["tiered-0.tiered-headless", SERVICE], "", "tiered-0.tiered-headless"),
    # Addresses first in the list: the first DNS name in it names the service.
    ("10.244.1.7", ["10.0.0.1", SERVICE, "other.example"], "", SERVICE),
    ("10.0.0.1", ["10.0.0.1", SERVICE], "", SERVICE),
    # Bootstrapped by addresses only: each broker by its own address, as before.
    ("10.244.1.7", ["10.0.0.1"], "", "10.244.1.7"),
    ("10.0.0.1", ["10.0.0.1", "::1"], "", "10.0.0.1"),
    # The override verifies every broker, by address or by name, bootstrap list or not.
    ("10.244.1.7", ["10.0.0.1"], SERVICE, SERVICE),
    ("10.244.1.7", ["localhost"], SERVICE, SERVICE),
    ("localhost", ["localhost"], SERVICE, SERVICE),
])
def test_the_name_each_broker_is_verified_by(host: str, bootstrap: list[str], override: str, name: str) -> None:
    assert server_name(host, bootstrap, override) == name


@pytest.mark.parametrize(("host", "address"), [
    ("127.0.0.1", True), ("::1", True), ("[::1]", True), ("10.244.1.7", True),
    ("localhost", False), (SERVICE, False), ("1.2.3.4.nip.io", False), ("tiered-0", False),
])
def test_an_address_is_told_from_a_name(host: str, address: bool) -> None:
    assert is_address(host) is address


@pytest.mark.parametrize("name", [SERVICE, "localhost", "tiered-0.tiered-headless", "a.b.", "127.0.0.1", "::1",
                                  "x" * 63 + ".example"])
def test_names_a_broker_can_be_verified_by(name: str) -> None:
    assert check_server_name(name) == name


@pytest.mark.parametrize("name", ["", "bad name", "*.tiered-headless", "-tiered.svc", "a..b", "tiered_svc",
                                  "é.example", "x" * 64 + ".example", ("a." * 127) + "bc"])
def test_names_no_certificate_can_hold_are_one_line(name: str) -> None:
    with pytest.raises(ValueError) as raised:
        check_server_name(name)
    message = str(raised.value)
    assert message.startswith(f"bad TLS server name {name!r}: want a DNS name") and "\n" not in message


def test_a_refused_certificate_names_the_name_checked_and_the_address() -> None:
    refused = CertificateRefused("127.0.0.1:11012", "127.0.0.1",
                                 "IP address mismatch, certificate is not valid for '127.0.0.1'.", mismatch=True)
    assert str(refused) == (
        "TLS handshake failed: the certificate of the broker at 127.0.0.1:11012 was refused, verified as '127.0.0.1' "
        "(IP address mismatch, certificate is not valid for '127.0.0.1'); a certificate names the service, not each broker's address: "
        "connect by a name it holds (-b) or give that name as --tls-server-name")
    expired = CertificateRefused("localhost:11011", "localhost", "certificate has expired")
    assert str(expired) == ("TLS handshake failed: the certificate of the broker at localhost:11011 was refused, "
                            "verified as 'localhost' (certificate has expired)")
    assert isinstance(refused, ConnectionError) and refused.server_name == "127.0.0.1"


def test_a_server_name_needs_tls_and_must_be_a_name() -> None:
    with pytest.raises(ValueError, match="a TLS server name needs an ssl_context"):
        Router([Endpoint("127.0.0.1", 11011)], connect_timeout_s=1, leader_wait_s=0, tls_server_name="localhost")
    with pytest.raises(ValueError, match="bad TLS server name 'a b'"):
        Router([Endpoint("127.0.0.1", 11011)], connect_timeout_s=1, leader_wait_s=0, ssl_context=client_context(),
               tls_server_name="a b")
