"""A small asyncio TANK client: `from tiered.client import Client`."""

from tiered.client.client import (
    BoundaryError,
    Client,
    ConsumeResult,
    InvalidRequest,
    NotConfirmed,
    TankError,
    UnknownPartition,
    UnknownTopic,
    as_messages,
)

__all__ = ['BoundaryError', 'Client', 'ConsumeResult', 'InvalidRequest', 'NotConfirmed', 'TankError',
           'UnknownPartition', 'UnknownTopic', 'as_messages']
