"""The name a TLS client verifies each broker's certificate by (its TLS server_hostname, also sent as SNI).

A redirect (0xfc) says where a partition's leader is as an IPv4 address and a port (TANK's wire format has no room
for a name), and a service's certificate cannot name the addresses its brokers get (pod IPs are assigned as each pod
starts). The address says where to connect; the certificate says who answers, and every broker of the service holds
one for the service's name, signed by the CA the client trusts. So a broker is verified by:

    1. the override (--tls-server-name, TIERED_TLS_SERVER_NAME) when one is given: every broker by that name;
    2. else, for a broker the client was given by a DNS name (-b tiered.streams.svc:11011), that name;
    3. else (a broker known by an address: a redirect's, or a bootstrap address) the service's name: the first
       bootstrap host that is a DNS name;
    4. else (the client was given addresses only) its own address.

This is as safe as verifying each broker by its address: a redirect, which could already send the client anywhere,
sends it only to a host that proves, with the trusted CA's signature, the name the user gave. The name verified
must be the user's (a flag, a bootstrap host), never one a broker names: the client would then trust whatever the
broker chose.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Sequence

# A host name as TLS checks it against a certificate: dot-separated labels of letters, digits and hyphens.
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def is_address(host: str) -> bool:
    """Whether `host` is an IP address (v4 or v6, brackets stripped) rather than a DNS name."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def check_server_name(name: str) -> str:
    """`name` if a broker can be verified by it (a DNS name or an IP address); else ValueError saying why."""
    if is_address(name):
        return name.strip("[]")
    labels = name[:-1].split(".") if name.endswith(".") else name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"bad TLS server name {name!r}: want a DNS name such as tiered.streams.svc.cluster.local "
                         "(letters, digits, hyphens and dots) or an IP address")
    return name


def server_name(host: str, bootstrap: Sequence[str], override: str = "") -> str:
    """The name the broker at `host` (a bootstrap host, or a redirect's address) is verified by, for a client given
    the `bootstrap` hosts and the `override` ("" for none): the module's rules 1 to 4."""
    if override:
        return override
    if not is_address(host):
        return host
    return next((given for given in bootstrap if not is_address(given)), host)
