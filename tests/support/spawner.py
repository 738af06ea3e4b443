"""Long-running child processes (brokers) forked from one interpreter that imported their modules once.

A broker started as `python -m tiered.cli.main serve` spends most of its start-up importing (the broker, the tier,
botocore, SQLAlchemy, psycopg) before it binds its port. A Spawner is one interpreter that runs `preamble` (the
imports) once, then forks a copy of itself for each `spawn`, which runs `body` and exits; unlike ForkServer
(tests/support/forkserver.py), whose runs are one at a time and waited for, spawned children run side by side, and
the server reports each one's exit as it happens. Each child is a process of its own: its own process group (a
signal meant for it reaches it alone), its own stdin (/dev/null), stdout and stderr (its log file), environment,
working directory and argv. It inherits nothing but the imports: the server never runs a thread, a connection or an
event loop, and it is a separate interpreter from the test's, which it never sees.

`Spawned` is what the tests hold: the `subprocess.Popen` calls they use (`pid`, `poll`, `wait`, `send_signal`,
`returncode`), with the exit status as the server reaped it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from tests.support.forkserver import CHILD, end_server, kill_group

_SERVER = CHILD + textwrap.dedent("""
    import json, select, signal
    shared = {"__name__": "__forked__"}
    exec(compile(sys.argv[1], "<preamble>", "exec"), shared)
    assert threading.active_count() == 1, "the preamble started a thread: a fork would copy it half-done"
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # a child's exit wakes the select below
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children = set()

    def own(request):  # its own process group, signals as a fresh interpreter has them, log, environment and cwd
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(wake_r)
        os.close(wake_w)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdin = open(0, closefd=False)  # not the server's reader of requests
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])

    def answer(message):
        sys.stdout.write(json.dumps(message) + "\\n")
        sys.stdout.flush()

    pending = b""
    while True:
        try:
            ready, _, _ = select.select([0, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            answer({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})
        if 0 in ready:
            data = os.read(0, 65536)
            if not data:  # the test process is gone: so are its children
                for pid in children:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                os._exit(0)
            pending += data
            while b"\\n" in pending:
                line, pending = pending.split(b"\\n", 1)
                pid = os.fork()
                if pid == 0:
                    run_child(own, json.loads(line), shared)
                try:
                    os.setpgid(pid, pid)  # as the child does: whichever runs first
                except (PermissionError, ProcessLookupError):
                    pass
                children.add(pid)
                answer({"started": pid})
""")


class Spawner:
    """One interpreter with `preamble` run (cwd: `cwd`; `env` added to this process's environment); `spawn` forks it.
    Safe to use from several threads (tests start brokers side by side)."""

    def __init__(self, preamble: str, *, cwd: Path, env: dict[str, str] | None = None):
        self._err = Path(tempfile.mkstemp(prefix="tiered-spawner-", suffix=".err")[1])
        with open(self._err, "wb") as server_err:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER, textwrap.dedent(preamble)], cwd=cwd,
                env={**os.environ, **(env or {})}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=server_err,
                start_new_session=True,
            )
        self._lock = threading.Lock()  # one reader of the server's messages, one writer of requests
        self._read = b""  # what was read from the server past its last whole message
        self._exited: dict[int, int] = {}  # pid -> returncode, as the server reaped them
        self._live: set[int] = set()

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def spawn(self, body: str, argv: list[str], *, log: Path, env: dict[str, str], cwd: Path,
              timeout_s: float = 60.0) -> "Spawned":
        """Forks a child that runs `body` with sys.argv[1:] = argv, its stdout and stderr appended to `log`."""
        request = {"body": textwrap.dedent(body), "argv": [str(a) for a in argv], "log": str(log), "env": env,
                   "cwd": str(cwd)}
        with self._lock:
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except BrokenPipeError:
                raise RuntimeError(f"the spawner exited:\n{self._err.read_text(errors='replace')}") from None
            deadline = time.monotonic() + timeout_s
            while True:
                message = self._next(deadline - time.monotonic())
                if message is None:
                    raise RuntimeError(f"the spawner did not fork within {timeout_s} s (or it exited):\n"
                                       f"{self._err.read_text(errors='replace')}")
                if "started" in message:
                    self._live.add(message["started"])
                    return Spawned(self, message["started"])

    def _next(self, timeout_s: float) -> dict | None:
        """The server's next message, an exit recorded on the way; None when none came within `timeout_s`."""
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()  # read raw: a buffered reader could hold a message select() cannot see
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while b"\n" not in self._read:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0.0))
            data = os.read(fd, 65536) if ready else b""
            if not data:
                return None
            self._read += data
        line, self._read = self._read.split(b"\n", 1)
        message = json.loads(line)
        if "exited" in message:
            self._live.discard(message["exited"])
            self._exited[message["exited"]] = message["returncode"]
        return message

    def returncode(self, pid: int, timeout_s: float) -> int | None:
        """`pid`'s exit status once the server reported it, waiting up to `timeout_s` for it; None if it still runs."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while pid not in self._exited:
                if self._next(deadline - time.monotonic()) is None:
                    if not self.alive:
                        raise RuntimeError(f"the spawner exited:\n{self._err.read_text(errors='replace')}")
                    if time.monotonic() >= deadline:
                        break
            return self._exited.get(pid)

    def close(self) -> None:
        """Kills every child still running, then the server."""
        for pid in list(self._live):
            kill_group(pid)
        end_server(self._proc)
        self._err.unlink(missing_ok=True)


class Spawned:
    """A spawned child, as `subprocess.Popen` shows a child process."""

    def __init__(self, spawner: Spawner, pid: int):
        self._spawner = spawner
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._spawner.returncode(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            # In short slices: the spawner's lock is not held long while another thread may be starting a child.
            left = 0.2 if deadline is None else deadline - time.monotonic()
            self.returncode = self._spawner.returncode(self.pid, max(min(left, 0.2), 0.0))
            if self.returncode is None and deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never a signal to a pid that may have been reused
            os.kill(self.pid, sig)
