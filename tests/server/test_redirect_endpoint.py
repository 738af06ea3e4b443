"""Which endpoint a redirect (0xfc) names (tiered.server.leaders.redirect_endpoint): the one a client on the same kind
of connection can use."""

from __future__ import annotations

import pytest

from tiered.protocol.codes import Endpoint
from tiered.server.leaders import redirect_endpoint
from tiered.tier_interface import Leader

TLS_WITH_PLAIN = Leader(1, "10.0.0.2:11011", "10.0.0.2:11012")  # TLS listener, plaintext listener on its address
TLS_WITH_LOCAL_PLAIN = Leader(1, "10.0.0.2:11011", "127.0.0.1:11012")  # plaintext listener on localhost only
SAME_HOST_LOCAL_PLAIN = Leader(1, "10.0.0.1:21011", "127.0.0.1:21012")  # another broker of this host
TLS_ONLY = Leader(1, "10.0.0.2:11011", "")  # no plaintext listener (or a broker older than migration 0008)
PLAIN_ONLY = Leader(1, "10.0.0.2:11011", "10.0.0.2:11011")  # TLS off: one plaintext listener


@pytest.mark.parametrize("leader, plaintext, expected", [
    (TLS_WITH_PLAIN, False, Endpoint("10.0.0.2", 11011)),  # a TLS client: the TLS endpoint
    (TLS_WITH_PLAIN, True, Endpoint("10.0.0.2", 11012)),  # a plaintext client: the plaintext one
    (TLS_WITH_LOCAL_PLAIN, False, Endpoint("10.0.0.2", 11011)),
    (TLS_WITH_LOCAL_PLAIN, True, Endpoint("10.0.0.2", 11011)),  # localhost of another host: not reachable
    (SAME_HOST_LOCAL_PLAIN, True, Endpoint("127.0.0.1", 21012)),  # localhost of this host: reachable
    (SAME_HOST_LOCAL_PLAIN, False, Endpoint("10.0.0.1", 21011)),
    (TLS_ONLY, True, Endpoint("10.0.0.2", 11011)),
    (TLS_ONLY, False, Endpoint("10.0.0.2", 11011)),
    (PLAIN_ONLY, True, Endpoint("10.0.0.2", 11011)),
])
def test_a_redirect_names_the_endpoint_for_the_clients_kind_of_connection(leader, plaintext, expected):
    assert redirect_endpoint(leader, plaintext, own_host="10.0.0.1") == expected
