"""What a broker answers for a partition it does not lead (several brokers as one service, docs/cluster.md).

TANK's own redirect: status 0xfc followed by the leader's IPv4 endpoint (docs/protocol.md §0), in produce, consume
and DiscoverPartitions answers; TANK's clients follow it unchanged. No leader yet (a takeover or a handover under
way, or a partition still being opened here) is 0xfd: nothing was done, ask again shortly.
- produce: every partition not led here is redirected (or 0xfd); nothing is appended.
- consume: history up to the catalog's high-water mark is served by any broker; at or past it (the tail, where
  a long-poll waits) the leader answers.
- DiscoverPartitions: the leader answers (its bounds are the exact ones).

The endpoint a redirect names is one the client can use on the kind of connection it came on
(`redirect_endpoint`): a TLS client gets the leader's advertised endpoint (its TLS listener when TLS is on), a
plaintext client the leader's plaintext endpoint (its `--listen-plain` listener when TLS is on; brokers register both,
tiered.catalog.cluster). A plaintext endpoint on a loopback address is only reachable on the leader's own host, so it
is named only when the leader advertises the same host as this broker; otherwise, and when the leader has no
plaintext endpoint, the advertised one is named (the only one there is; with TLS on a plaintext client cannot use
it, and fails there rather than bouncing between brokers).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tiered.protocol.codes import Endpoint
from tiered.tier_interface import Leader


@dataclass(frozen=True, slots=True)
class LedElsewhere:
    """The answer is the leader's: redirect there (0xfc), or no leader yet (0xfd) when `leader` is None."""

    leader: Leader | None


@lru_cache(maxsize=4096)
def _endpoint(text: str) -> Endpoint:
    host, _, port = text.rpartition(":")
    return Endpoint(host, int(port))


def endpoint_of(leader: Leader) -> Endpoint:
    """The wire endpoint of a leader's advertised "a.b.c.d:port"."""
    return _endpoint(leader.endpoint)


def redirect_endpoint(leader: Leader, plaintext: bool, own_host: str) -> Endpoint:
    """Where a client redirected to `leader` goes: `plaintext` says what its connection to this broker is, and
    `own_host` is the host this broker advertises."""
    if plaintext and leader.plain_endpoint:
        plain = _endpoint(leader.plain_endpoint)
        if not plain.addr.startswith("127.") or _endpoint(leader.endpoint).addr == own_host:
            return plain
    return _endpoint(leader.endpoint)
