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


class CertificateRefused(ConnectionError):
    """A broker's certificate did not verify as `server_name` (tiered.client.server_name chose it) when connecting to
    `endpoint`. Trying again cannot help, so a request that needs that broker fails at once."""

    def __new__(cls, endpoint: str, server_name: str, why: str, mismatch: bool = False):
        # One argument: OSError would read several as (errno, strerror, ...).
        hint = ("; a certificate names the service, not each broker's address: connect by a name it holds (-b) or "
                "give that name as --tls-server-name" if mismatch else "")
        return ConnectionError.__new__(cls, f"TLS handshake failed: the certificate of the broker at {endpoint} was "
                                            f"refused, verified as {server_name!r} ({why.rstrip('.')}){hint}")

    def __init__(self, endpoint: str, server_name: str, why: str, mismatch: bool = False):
        self.endpoint = endpoint
        self.server_name = server_name


class UnknownTopic(TankError):
    pass


class UnknownPartition(TankError):
    pass


class BoundaryError(TankError):
    def __init__(self, message: str, first_available: int, hwmark: int):
        super().__init__(message, ConsumeStatus.BOUNDARY)
        self.first_available = first_available
        self.hwmark = hwmark
