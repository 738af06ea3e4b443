"""A broker built without a C compiler: every native module missing, the pure-Python references serve. A produce, the
block it goes into and a consume must work as they do with the modules built (each module's own tests compare the two
paths byte for byte; this one proves the fallback is wired everywhere a native call is chosen)."""

from __future__ import annotations

import os
import subprocess
import sys

from tiered.client import Client

from tests.support.broker import REPO, BrokerProcess

NATIVE = ("tiered.protocol._bundlescan", "tiered.storage._appender", "tiered.tiering.blocks._builder",
          "tiered.server._produce", "tiered.spark._decode")

# Loaded by every Python process started with its directory first on PYTHONPATH: the native modules cannot be imported.
BLOCKER = f"""
import importlib.machinery
import sys


class _NotBuilt:
    def create_module(self, spec):
        raise ImportError(f"{{spec.name}} is not built (tests/test_native_fallback.py)")

    def exec_module(self, module):
        pass


class _NoNative:
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, _NotBuilt()) if name in {NATIVE!r} else None


sys.meta_path.insert(0, _NoNative())
"""


def _env(tmp_path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    return {"PYTHONPATH": f"{site}{os.pathsep}{REPO}"}


def test_the_native_modules_are_blocked_in_the_fallback_environment(tmp_path):
    code = ("import tiered.tiering.blocks.block_builder as b, tiered.storage.appender as a, tiered.server.produce as p; "
            "print(b.add_to_run_for() is b._add_to_run_py, b.PendingRun is b.PyPendingRun, p.append_request_for() is None)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **_env(tmp_path)}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"]


async def test_a_broker_without_its_native_modules_produces_and_consumes(tmp_path):
    broker = BrokerProcess(tmp_path / "data", env=_env(tmp_path)).start()
    try:
        async with await Client.connect("127.0.0.1", broker.port) as client:
            await client.create_topic("plain", 2)
            for partition in (0, 1):
                await client.produce("plain", partition, [f"p{partition}-{i}" for i in range(5)])
            await client.produce("plain", 0, ["last"])
            got = await client.consume("plain", 0, 1)
            assert [m.value for m in got.messages] == [b"p0-0", b"p0-1", b"p0-2", b"p0-3", b"p0-4", b"last"]
            got = await client.consume("plain", 1, 1)
            assert [m.value for m in got.messages] == [f"p1-{i}".encode() for i in range(5)]
    finally:
        broker.terminate()
    assert "Traceback" not in broker.output() and "is not defined" not in broker.output()
