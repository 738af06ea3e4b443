"""Ports for servers a test starts and for addresses nothing listens on: the one port helper of the suite.

A port from `bind(0)` comes from the kernel's ephemeral range, which is also where every outgoing connection's
local port comes from: once released, it can be taken by another test's connection (or, under pytest-xdist, by
another worker's `bind(0)`) before the child process that was told to listen on it binds it. So a test port comes
instead from below the ephemeral range, from a block of this process's own: its offset follows the process id,
so the workers of one run, and the runs of other checkouts on the same machine, start in different blocks; each
port is checked free by binding it before it is handed out, and none is handed out twice by one process.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
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
            if _bindable(port):
                return port
    raise RuntimeError(f"no free port on 127.0.0.1 between {_LOW} and {_HIGH}")
