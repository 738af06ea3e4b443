"""A small asyncio TANK client: `from tiered.client import Client` (one broker: Client.connect; a service of several
brokers: Client.connect_any). It follows TANK's leader redirects; see tiered.client.client."""

from tiered.client.client import ChunkResult, Client, ConsumeResult, as_messages
from tiered.client.errors import (
    BoundaryError,
    CertificateRefused,
    ConnectionLost,
    InvalidRequest,
    NotConfirmed,
    TankError,
    UnknownPartition,
    UnknownTopic,
    Unreachable,
)

__all__ = ['BoundaryError', 'CertificateRefused', 'ChunkResult', 'Client', 'ConnectionLost', 'ConsumeResult',
           'InvalidRequest', 'NotConfirmed', 'TankError', 'UnknownPartition', 'UnknownTopic', 'Unreachable', 'as_messages']
