"""What the client raises: TANK's statuses as exceptions, and the two ways a connection can fail a caller.

A request either was not written (nothing reached a broker: the client may send it elsewhere) or was written and its
answer never came. A produce in the second case raises ConnectionLost, which is both a NotConfirmed (its messages may
or may not be committed) and a ConnectionError (for callers that catch lost connections); it is never sent again.
"""

from __future__ import annotations

from tiered.protocol.codes import ConsumeStatus


class TankError(Exception):
    """A status a request could not succeed with, named as TANK names it."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class InvalidRequest(TankError):
    """Not sent: the broker would refuse it. The message says what is wrong and what is allowed."""


class NotConfirmed(TankError):
    """A produce neither acknowledged nor refused: its messages may still be committed (or not). `reason` says what
    happened: the broker's answer (its ack timeout passed, or the block could not be committed), the client's
    deadline, or the connection ending after the produce was written."""

    def __init__(self, message: str, reason: str, code: int | None = None):
        super().__init__(message, code)
        self.reason = reason


class ConnectionLost(NotConfirmed, ConnectionError):
    """A produce was written, then its connection ended before the answer came."""

    def __new__(cls, message: str, reason: str, code: int | None = None):
        return ConnectionError.__new__(cls, message)  # one argument: OSError would read two as (errno, strerror)


class Unreachable(ConnectionError):
    """No known broker could be connected to. `failures` maps each endpoint tried ("host:port") to why it failed."""

    def __init__(self, message: str, failures: dict[str, BaseException]):
        super().__init__(message)
        self.failures = failures


class UnknownTopic(TankError):
    pass


class UnknownPartition(TankError):
    pass


class BoundaryError(TankError):
    def __init__(self, message: str, first_available: int, hwmark: int):
        super().__init__(message, ConsumeStatus.BOUNDARY)
        self.first_available = first_available
        self.hwmark = hwmark
