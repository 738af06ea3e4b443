"""The test port helper: no two live processes are handed the same port, even when their blocks overlap."""

from __future__ import annotations

import socket
import subprocess
import sys

import tests.support.ports as ports


def test_a_port_handed_out_is_free_and_never_handed_out_again():
    taken = [ports.free_port() for _ in range(20)]
    assert len(set(taken)) == 20
    for port in taken:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_two_processes_in_the_same_block_are_handed_different_ports():
    # Process ids 44 blocks apart start in the same block: forced here by giving the child this process's start.
    mine = {ports.free_port() for _ in range(30)}
    child = (
        "import tests.support.ports as p\n"
        f"p._start = {ports._start}\n"
        "print(' '.join(str(p.free_port()) for _ in range(30)))\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True, timeout=60)
    theirs = {int(port) for port in out.stdout.split()}
    assert len(theirs) == 30
    assert not mine & theirs
