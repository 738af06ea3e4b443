"""`tiered dev`: the durable set-up on one machine, in one command.

Starts a throwaway PostgreSQL (as the `postgres` user when run as root, since initdb refuses root), a local S3
(moto's server, with its bucket made) and three brokers as one service sharing them, prints the `-b` list, the URLs
and the environment for Spark and `tiered replay`, and stops everything on Ctrl-C (or SIGTERM), removing what it
made unless `--dir` named where to keep it. docs/local.md does the same by hand.
"""

from __future__ import annotations

import argparse
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
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tiered.cli.common import CommandError, UsageError, fail

BUCKET = "tiered"
# moto accepts any key; these only have to be present, for botocore to sign with.
DEV_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "dev", "AWS_SECRET_ACCESS_KEY": "dev", "AWS_REGION": "us-east-1"}
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def register(sub) -> None:
    p = sub.add_parser("dev", help="PostgreSQL, a local S3 and three brokers as one service on this machine",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, help="keep everything here (default: a temporary directory, removed at the end)")
    p.add_argument("--brokers", type=int, default=3, help="how many brokers (default 3)")
    p.add_argument("--port", type=int, default=11011, help="the first broker's TANK port; the others follow (default 11011)")
    p.add_argument("--http-port", type=int, default=9102, help="the first broker's HTTP port (default 9102)")
    p.add_argument("--pg-port", type=int, default=0, help="PostgreSQL's port (default: a free one)")
    p.add_argument("--s3-port", type=int, default=0, help="the local S3's port (default: a free one)")
    p.set_defaults(func=cmd_dev)


@dataclass
class Stack:
    root: Path
    keep: bool
    processes: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    pg_stop: list[str] | None = None
    postgres_home: Path | None = None  # PostgreSQL's directory when it cannot be under root

    def stop(self) -> None:
        """Brokers first (a graceful stop commits what they hold), then the S3 server, then PostgreSQL."""
        for _, proc in reversed(self.processes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for _, proc in reversed(self.processes):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self.pg_stop is not None:
            subprocess.run(self.pg_stop, capture_output=True, timeout=60)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
            if self.postgres_home is not None:
                shutil.rmtree(self.postgres_home, ignore_errors=True)


def cmd_dev(args: argparse.Namespace) -> int:
    try:
        _check(args)
    except CommandError as exc:
        return fail("dev", exc, status=2 if isinstance(exc, UsageError) else 1)
    root = args.dir.resolve() if args.dir else Path(tempfile.mkdtemp(prefix="tiered-dev-"))
    root.mkdir(parents=True, exist_ok=True)
    stack = Stack(root, keep=args.dir is not None)
    stopping = []
    previous = {sig: signal.signal(sig, lambda *_: stopping.append(True)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        env = _start(stack, args)
        _announce(args, env, root, stack.postgres_home or root / "postgresql")
        while not stopping:
            for name, proc in stack.processes:
                if proc.poll() is not None:
                    raise CommandError(f"{name} exited with status {proc.returncode} (its log: {root / name}.log)")
            time.sleep(0.2)
        print("tiered dev: stopping", file=sys.stderr, flush=True)
        return 0
    except CommandError as exc:
        return fail("dev", exc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN)
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _check(args: argparse.Namespace) -> None:
    if not 1 <= args.brokers <= 16:
        raise UsageError(f"--brokers {args.brokers}: want 1..16")
    try:
        import moto.server  # noqa: F401
    except ModuleNotFoundError:
        raise CommandError("the local S3 is moto's server, which is not installed: pip install 'tiered[dev]'") from None
    if find_pg_bindir() is None:
        raise CommandError("PostgreSQL's server binaries (initdb, pg_ctl) are not installed: apt-get install "
                           "postgresql (or `make system-deps` in a checkout)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise CommandError("initdb refuses to run as root and there is no `postgres` user to run it as") from None
    for what, first in (("--port", args.port), ("--http-port", args.http_port)):
        for port in range(first, first + args.brokers):
            if not _free(port):
                raise UsageError(f"port {port} is taken ({what} {first} and the next {args.brokers - 1}): "
                                 f"choose others with {what}")


def _start(stack: Stack, args: argparse.Namespace) -> dict[str, str]:
    root = stack.root
    pg_url = _start_postgres(stack, args.pg_port or _any_port())
    s3_port = args.s3_port or _any_port()
    endpoint = f"http://127.0.0.1:{s3_port}"
    moto_log = open(root / "s3.log", "ab")
    stack.processes.append(("s3", subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)], stdout=moto_log,
        stderr=subprocess.STDOUT, start_new_session=True)))
    _wait(lambda: _answers(endpoint), "the local S3", root / "s3.log")
    _make_bucket(endpoint)
    env = {"TIERED_CATALOG_URL": pg_url, "TIERED_STORE_URL": f"s3://{BUCKET}/dev", "TIERED_S3_PATH_STYLE": "true",
           "AWS_ENDPOINT_URL": endpoint, **DEV_CREDENTIALS}
    for i in range(args.brokers):
        name = f"broker{i}"
        listen, http = f"127.0.0.1:{args.port + i}", f"127.0.0.1:{args.http_port + i}"
        log = open(root / f"{name}.log", "ab")
        stack.processes.append((name, subprocess.Popen(
            [sys.executable, "-m", "tiered.cli.main", "serve", "-p", str(root / name), "-l", listen, "-P", http,
             "--broker-id", str(i), "--advertise", listen],
            env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)))
    for i in range(args.brokers):
        url = f"http://127.0.0.1:{args.http_port + i}/readyz"
        _wait(lambda: _answers(url, ok_only=True), f"broker{i}", root / f"broker{i}.log")
    return env


def _start_postgres(stack: Stack, port: int) -> str:
    bindir = find_pg_bindir()
    assert bindir is not None  # _check
    home = stack.root / "postgresql"
    as_postgres: list[str] = []
    if os.geteuid() == 0:
        as_postgres = ["runuser", "-u", "postgres", "--"]
        if subprocess.run([*as_postgres, "test", "-x", str(stack.root)], capture_output=True, timeout=30).returncode:
            # The postgres user cannot reach a directory under this one (e.g. a 0700 home): its own, in /tmp.
            home = Path(tempfile.mkdtemp(prefix="tiered-dev-postgresql-"))
            stack.postgres_home = home
    home.mkdir(exist_ok=True)
    if as_postgres:
        user = pwd.getpwnam("postgres")
        os.chown(home, user.pw_uid, user.pw_gid)
    data = home / "data"
    if not data.exists():
        _run([*as_postgres, str(bindir / "initdb"), "-A", "trust", "-U", "postgres", "-E", "UTF8", "-D", str(data)],
             "initdb")
    options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1"
    _run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(home / "server.log"), "-o", options,
          "start", "-w"], "pg_ctl start")
    stack.pg_stop = [*as_postgres, str(bindir / "pg_ctl"), "-D", str(data), "stop", "-m", "fast", "-w"]
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True,
                         connect_timeout=10) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'tiered'").fetchone() is None:
            conn.execute("CREATE DATABASE tiered")
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/tiered"


def _announce(args: argparse.Namespace, env: dict[str, str], root: Path, postgres: Path) -> None:
    brokers = ",".join(f"127.0.0.1:{args.port + i}" for i in range(args.brokers))
    http = ", ".join(f"http://127.0.0.1:{args.http_port + i}" for i in range(args.brokers))
    exports = " ".join(f"{k}={v}" for k, v in env.items())
    print(f"tiered dev: {args.brokers} brokers as one service, PostgreSQL and a local S3 (moto), in {root}\n"
          f"  brokers   -b {brokers}\n"
          f"  HTTP      {http} (/metrics, /readyz, /v1/tier)\n"
          f"  catalog   {env['TIERED_CATALOG_URL']}\n"
          f"  store     {env['TIERED_STORE_URL']} at {env['AWS_ENDPOINT_URL']} (path-style)\n"
          f"  logs      {root}/broker*.log, {root}/s3.log, {postgres}/server.log\n"
          f"for the CLI, Spark and tiered replay (docs/local.md):\n"
          f"  export TIERED_BROKER={brokers} {exports}\n"
          f"ready; Ctrl-C stops everything", flush=True)


def find_pg_bindir() -> Path | None:
    """PostgreSQL's server binaries (initdb, pg_ctl): Debian's newest /usr/lib/postgresql/N/bin, else the PATH's.
    The one finder: the tests' and the benchmarks' throwaway clusters use it too."""
    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name),
                         reverse=True):
        if os.access(Path(bindir) / "initdb", os.X_OK) and os.access(Path(bindir) / "pg_ctl", os.X_OK):
            return Path(bindir)
    pg_ctl, initdb = shutil.which("pg_ctl"), shutil.which("initdb")
    return Path(pg_ctl).parent if pg_ctl and initdb else None


def _run(argv: list[str], what: str) -> None:
    # A session of its own: the terminal's Ctrl-C reaches us, and we stop PostgreSQL in order, not it directly.
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, start_new_session=True)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise CommandError(f"{what} failed: {said[-1] if said else f'exit {done.returncode}'}")


def _make_bucket(endpoint: str) -> None:
    from botocore.session import Session

    client = Session().create_client("s3", endpoint_url=endpoint, region_name=DEV_CREDENTIALS["AWS_REGION"],
                                     aws_access_key_id="dev", aws_secret_access_key="dev")
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass


def _wait(ready, what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline:
            raise CommandError(f"{what} did not start within {START_TIMEOUT_S:.0f} s (its log: {log})")
        time.sleep(0.2)


def _answers(url: str, ok_only: bool = False) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return not ok_only or response.status == 200
    except urllib.error.HTTPError as exc:
        return not ok_only and exc.code < 500
    except (OSError, ValueError):
        return False


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _any_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
