"""Child processes for kill -9 tests, without paying Python's start-up and imports for each one.

A kill-at-every-step test runs one child per step, each killed with SIGKILL at its step: dozens of children, and a
fresh interpreter importing the broker, boto3 and SQLAlchemy costs 1-2 s each, most of such a test. A ForkServer
is one interpreter that runs `preamble` (the imports) once, then forks a fresh copy of itself for each run, which
executes `body` with its own argv and stdout/stderr and exits. The forked child is a real process: it is killed by
a real SIGKILL, with its files, sockets and catalog connections left as a crash leaves them. Nothing passes from
one run to the next: each is forked from the server, which only ever imported (no thread, no connection, no event
loop), so each run starts as a new process would, after the imports.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

# A forked child's life, shared by this server and tests/support/spawner.py's: `setup(request)` (its files), then
# `body` with sys.argv[1:] = argv, as the interpreter runs a script, and the interpreter's way out with its status.
CHILD = textwrap.dedent("""
    import atexit, os, sys, threading, traceback

    def run_child(setup, request, shared):
        code = 1
        try:
            setup(request)
            sys.argv = ["-c", *request["argv"]]
            exec(compile(request["body"], "<child>", "exec"), dict(shared))
            code = 0
        except SystemExit as exc:  # as the interpreter reads it: None is 0, anything but an int is printed, 1
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            try:  # the interpreter's way out: non-daemon threads joined, then atexit
                threading._shutdown()
                atexit._run_exitfuncs()
            except BaseException:
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
""")

_SERVER = CHILD + textwrap.dedent("""
    import json
    shared = {"__name__": "__forked__"}
    exec(compile(sys.argv[1], "<preamble>", "exec"), shared)

    def files(request):
        os.dup2(os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.dup2(os.open(request.get("stdin") or os.devnull, os.O_RDONLY), 0)
        sys.stdin = open(0, closefd=False)  # not the server's reader of requests, which may hold bytes

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(files, request, shared)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
""")


@dataclass(frozen=True)
class Finished:
    returncode: int  # as subprocess reports it: -9 for a child killed by SIGKILL
    stdout: str
    stderr: str


class ForkServer:
    """One interpreter with `preamble` run (cwd: `cwd`; `env` added to this process's environment); `run` forks it."""

    def __init__(self, preamble: str, *, cwd: Path, env: dict[str, str] | None = None):
        self._dir = Path(tempfile.mkdtemp(prefix="tiered-forkserver-"))
        with open(self._dir / "server.err", "wb") as server_err:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER, textwrap.dedent(preamble)], cwd=cwd,
                env={**os.environ, **(env or {})}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=server_err,
                start_new_session=True,
            )
        self._runs = 0

    def run(self, body: str, argv: list[str], timeout_s: float = 120.0) -> Finished:
        """Runs `body` in a fresh fork with sys.argv[1:] = argv; waits for it to exit (or be killed)."""
        done = self.call(body, argv, timeout_s)
        return Finished(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))

    def call(self, body: str, argv: list[str], timeout_s: float = 120.0,
             input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """`run`, with `input` as the child's stdin (else /dev/null), its outputs as bytes."""
        self._runs += 1
        out, err, given = (self._dir / f"{self._runs}.{name}" for name in ("out", "err", "in"))
        request = {"body": textwrap.dedent(body), "argv": [str(a) for a in argv], "stdout": str(out),
                   "stderr": str(err)}
        if input is not None:
            given.write_bytes(input)
            request["stdin"] = str(given)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(f"the fork server exited:\n{self._server_errors()}") from None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        answer = self._proc.stdout.readline() if ready else b""
        if not answer:
            self.close()
            raise AssertionError(f"a forked child did not finish within {timeout_s} s (or the server exited):\n"
                                 f"{self._server_errors()}{err.read_text(errors='replace') if err.exists() else ''}")
        done = subprocess.CompletedProcess(argv, json.loads(answer)["returncode"], out.read_bytes(), err.read_bytes())
        for path in (out, err, given):
            path.unlink(missing_ok=True)
        return done

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def _server_errors(self) -> str:
        path = self._dir / "server.err"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Ends the server and any child it still has (they share its process group)."""
        end_server(self._proc)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def kill_group(pgid: int) -> None:
    """SIGKILL to a process group, which may be gone already."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def end_server(proc: subprocess.Popen[bytes]) -> None:
    """Kills a server started in a session of its own (and whatever shares its process group); closes its pipes."""
    if proc.poll() is None:
        kill_group(proc.pid)
    proc.wait(10)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()
