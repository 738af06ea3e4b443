"""Ports for servers a test starts and for addresses nothing listens on: the one port helper of the suite.

A port from `bind(0)` comes from the kernel's ephemeral range, which is also where every outgoing connection's
local port comes from: once released, it can be taken by another test's connection (or, under pytest-xdist, by
another worker's `bind(0)`) before the child process that was told to listen on it binds it. So a test port comes
instead from below the ephemeral range, from a block of this process's own: its offset follows the process id,
so the workers of one run, and the runs of other checkouts on the same machine, usually start in different blocks;
each port is checked free by binding it before it is handed out, and none is handed out twice on the machine while
the process that took it lives: a port is taken by an exclusive `flock` on a file named after it, held until the
process exits (the kernel drops the lock with the process, so a killed run leaves nothing held). Two processes
whose blocks overlap (process ids 44 blocks apart) therefore skip each other's ports instead of sharing them.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import socket
import threading
import tempfile
from pathlib import Path

# Below the kernel's ephemeral range (32768-60999 by default), above the well-known and most registered services.
_LOW, _HIGH = 10_000, 32_000
_BLOCK = 500


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


_HIGH = min(_HIGH, _ephemeral_low())
_lock = threading.Lock()
_start = _LOW + (os.getpid() * _BLOCK) % (_HIGH - _LOW)
_next = itertools.count()
_TAKEN = Path(tempfile.gettempdir()) / "tiered-test-ports"
_held: list[int] = []  # the locked files' descriptors, open for the life of the process


def _take(port: int) -> bool:
    """Whether this process now holds `port` machine-wide (or no other process could hold it: the lock directory
    cannot be written, and the bind check alone decides)."""
    try:
        _TAKEN.mkdir(exist_ok=True)
        fd = os.open(_TAKEN / str(port), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _held.append(fd)
    return True


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now and that this process has not handed out before: for a
    server the test starts, or for an address whose connections are refused."""
    with _lock:
        for _ in range(_HIGH - _LOW):
            port = _LOW + (_start - _LOW + next(_next)) % (_HIGH - _LOW)
            if _bindable(port) and _take(port):
                return port
    raise RuntimeError(f"no free port on 127.0.0.1 between {_LOW} and {_HIGH}")
