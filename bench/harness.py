"""The parts a benchmark runs against, each in a process of its own so its CPU time can be read on its own.

- `BrokerProcess`: `python -m tiered.cli.main serve` on 127.0.0.1, optionally under cProfile; CPU seconds from
  /proc/<pid>/stat (every thread of the process), counters from GET /metrics on its HTTP port.
- `MotoProcess`: moto's S3 server (`moto.server.ThreadedMotoServer`) in a child process, with a bucket.
- `PgCluster`: a throwaway PostgreSQL cluster (initdb + pg_ctl in a temp dir, fsync off), run as the `postgres`
  user through `runuser` when we are root. The same approach as tests/support/postgres.py, copied so that the
  benchmark does not depend on the test tree.

Every process started here is stopped by its own pid (`stop()`), never by name.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Sequence

from tiered.cli.dev import find_pg_bindir  # the one finder of PostgreSQL's server binaries

REPO = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
S3_REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_s(pid: int, *, reaped_children: bool = False) -> float:
    """User + system CPU seconds of every thread of `pid` so far (fields 14 and 15 of /proc/<pid>/stat), plus those
    of its children that have exited and been waited for (fields 16 and 17) if `reaped_children`."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces; every field after its closing parenthesis is a plain number.
    fields = stat[stat.rindex(b")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLOCK_TICKS


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the benchmark process ends, even by SIGKILL (Linux prctl), so that no
    broker is left running after an interrupted benchmark."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float, what: str, log_path: Path, *,
                  greeting: bool = False) -> None:
    """Until the port accepts; with `greeting`, until it also sends something (a broker binds its port before it
    has joined the service, and sends TANK's Ping only once it serves)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_tail(log_path)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                if not greeting or sock.recv(5):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout_s} s:\n{_tail(log_path)}")


def _tail(path: Path, size: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


def stop_process(proc: subprocess.Popen | None, timeout_s: float = 30.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class BrokerProcess:
    """`tiered serve` as an operator runs it, on loopback ports of its own; with `local_only`, the same broker without
    its tiering layer (bench/local_broker.py). `tree` is the checkout whose code runs (its working directory and
    PYTHONPATH; this one by default), `wrapper` a command the interpreter runs under (valgrind, say)."""

    def __init__(self, data_dir: Path, *extra: str, env: dict[str, str] | None = None,
                 profile_path: Path | None = None, local_only: bool = False, tree: Path = REPO,
                 wrapper: Sequence[str] = ()):
        self.data_dir = data_dir
        self.port = free_port()
        self.http_port = free_port()
        self.extra = extra
        self.tree = tree
        self.wrapper = tuple(wrapper)
        self.env = {**os.environ, "PYTHONPATH": str(tree), **(env or {})}
        self.profile_path = profile_path
        self.program = ["bench.local_broker"] if local_only else ["tiered.cli.main", "serve"]
        self.log_path = data_dir.parent / f"broker-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> "BrokerProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        runner = [*self.wrapper, sys.executable]
        if self.profile_path is not None:
            runner += ["-m", "cProfile", "-o", str(self.profile_path)]
        cmd = [*runner, "-m", *self.program, "-p", str(self.data_dir), "-l", f"127.0.0.1:{self.port}",
               "-P", f"127.0.0.1:{self.http_port}", "--log-level", "warning", *self.extra]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.tree,
                                         preexec_fn=die_with_parent)
        wait_for_port(self.port, self.proc, timeout_s, "the broker", self.log_path, greeting=True)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def metrics(self) -> dict[str, float]:
        """Unlabelled samples of GET /metrics by name (labelled ones under `name{labels}`)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
        return out

    def output(self) -> str:
        return _tail(self.log_path)

    def stop(self) -> None:
        stop_process(self.proc, 60.0)


class MotoProcess:
    """moto's S3 server in a child process on 127.0.0.1, with one bucket; `env` is what the broker needs."""

    def __init__(self, root: Path, bucket: str = "tiered-bench"):
        self.port = free_port()
        self.bucket = bucket
        self.log_path = root / f"moto-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "MotoProcess":
        code = ("import sys, time\nfrom moto.server import ThreadedMotoServer\n"
                f"s = ThreadedMotoServer(ip_address='127.0.0.1', port={self.port}, verbose=False)\ns.start()\n"
                "sys.stdin.read()\ns.stop()\n")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=log,
                                         stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                         preexec_fn=die_with_parent)
        wait_for_port(self.port, self.proc, 60.0, "moto", self.log_path)
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def client(self):
        """A boto3 S3 client straight to moto (setup and inspection)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name=S3_REGION, aws_access_key_id="testing",
                            aws_secret_access_key="testing")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": S3_REGION, "AWS_DEFAULT_REGION": S3_REGION, "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true",
        }

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()  # the child stops its server and exits when its stdin ends
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class PgCluster:
    """A PostgreSQL cluster in a temp dir of its own, trust auth as user `postgres`, fsync off (as in the tests)."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="tiered-bench-pg-"))
        self.datadir = self.root / "data"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0

    def _run(self, *argv: str) -> None:
        command = [str(self.bindir / argv[0]), *argv[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}\n"
                               f"{_tail(self.root / 'server.log')}")

    def start(self) -> "PgCluster":
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-A", "trust", "-U", "postgres", "-E", "UTF8", "-D", str(self.datadir))
        options = (f"-F -p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
                   " -c synchronous_commit=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self.datadir), "-l", str(self.root / "server.log"), "-o", options, "start", "-w")
        return self

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def postmaster_pid(self) -> int:
        return int((self.datadir / "postmaster.pid").read_text().split()[0])

    def cpu_s(self) -> float:
        """CPU seconds of the postmaster and its backends (its children, running or ended)."""
        root = self.postmaster_pid()
        total = process_cpu_s(root, reaped_children=True)
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                data = Path(stat).read_bytes()
                if int(data[data.rindex(b")") + 2:].split()[1]) == root:
                    total += process_cpu_s(int(Path(stat).parent.name))
            except (OSError, ValueError):
                continue  # the process ended while we looked
        return total

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.datadir), "stop", "-m", "immediate", "-w")
        except RuntimeError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
