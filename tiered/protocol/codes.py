"""TANK's status codes and flags (docs/protocol.md §8, TANK v4 `common.h`), and the IPv4 endpoint they carry.

Endpoint layout (docs/protocol.md §0; follows the codes 0xfc "other leader" in produce, consume and discover responses):

    addr4   4 bytes   the octets a.b.c.d in order (TANK copies a network-order in_addr raw)
    port    u16       little-endian (a host-order uint16_t copied raw)
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag

UINT64_MAX = 0xFFFF_FFFF_FFFF_FFFF

ENDPOINT = struct.Struct("<4sH")  # addr4 octets, port


class ProduceStatus(IntEnum):
    """One byte per partition in a produce response; READ_ONLY and UNKNOWN_TOPIC stand alone for a whole topic."""

    OK = 0
    UNKNOWN_PARTITION = 1
    SYSTEM = 2
    ACK_TIMEOUT = 3
    INSUFFICIENT_REPLICAS = 4
    INVALID_SEQNUMS = 0x0A
    OTHER_LEADER = 0xFC  # followed by an endpoint
    NO_LEADER = 0xFD
    READ_ONLY = 0xFE  # topic-level
    UNKNOWN_TOPIC = 0xFF  # topic-level


PRODUCE_TOPIC_STATUSES = frozenset({ProduceStatus.READ_ONLY, ProduceStatus.UNKNOWN_TOPIC})
PRODUCE_PARTITION_STATUSES = frozenset(ProduceStatus) - PRODUCE_TOPIC_STATUSES


class ConsumeStatus(IntEnum):
    """`err_flags` of one partition in a consume response. TANK's client aborts on anything else."""

    OK = 0  # base_seq, hwmark, chunk_len
    BOUNDARY = 1  # base_seq (0), hwmark, chunk_len (0), first_available
    SYSTEM = 0xFB
    OTHER_LEADER = 0xFC  # endpoint
    NO_LEADER = 0xFD
    SPARSE = 0xFE  # hwmark, chunk_len: the chunk's first bundle is sparse and carries its own base
    UNKNOWN_PARTITION = 0xFF


class ConsumeFlags(IntFlag):
    """`op_flags` of a consume request (only on the wire when client_version >= 3)."""

    PREFER_LOCAL = 1


class CreateTopicStatus(IntEnum):
    OK = 0
    EXISTS = 1
    SYSTEM = 2
    BAD_CONFIG = 4
    READ_ONLY = 5
    INVALID = 10  # zero partitions or an invalid topic name
    UNSUPPORTED = 11  # understood by TANK's client (cluster mode); never sent by a standalone broker


class ReloadConfStatus(IntEnum):
    OK = 0
    IO = 2  # no partition config file, or it could not be read
    PARSE = 3
    UNKNOWN_PARTITION = 10
    UNKNOWN_TOPIC = 11
    CLUSTER_AWARE = 12


class DiscoverReason(IntEnum):
    """Why a DiscoverPartitions entry is (UINT64_MAX, UINT64_MAX)."""

    SYSTEM = 0xFB
    OTHER_LEADER = 0xFC  # followed by an endpoint
    NO_LEADER = 0xFD


class NodeFlags(IntFlag):
    """Flags of one DiscoverTopology node; HAS_ENDPOINT says whether an endpoint follows on the wire."""

    HAS_ENDPOINT = 1
    AVAILABLE = 2
    BLOCKED = 4


@dataclass(frozen=True, slots=True)
class Endpoint:
    addr: str  # dotted quad "a.b.c.d"
    port: int

    def __str__(self) -> str:
        return f"{self.addr}:{self.port}"


def encode_endpoint(endpoint: Endpoint) -> bytes:
    try:
        octets = ipaddress.IPv4Address(endpoint.addr).packed
    except ValueError:
        raise ValueError(f"endpoint address is not a dotted IPv4 quad: {endpoint.addr!r}") from None
    if not 0 <= endpoint.port <= 0xFFFF:
        raise ValueError(f"endpoint port out of range: {endpoint.port}")
    return ENDPOINT.pack(octets, endpoint.port)


def decode_endpoint(octets: bytes, port: int) -> Endpoint:
    return Endpoint(str(ipaddress.IPv4Address(octets)), port)
