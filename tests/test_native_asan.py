"""The native modules under AddressSanitizer and UndefinedBehaviorSanitizer (issue 26: memory safety is part of done).

Every C source the package builds (pyproject's [tool.setuptools.ext-modules]) is compiled again here, into a temp
dir, with `-fsanitize=address,undefined` (undefined behaviour aborts: -fno-sanitize-recover), and the tests that
compare each native module with its Python reference on valid, truncated, oversized, mutated and random input run
against that build in a subprocess: libasan preloaded (the interpreter is not built with it), leaks not reported
(the interpreter's own allocations outlive it), and an import hook that serves the sanitized modules in place of the
installed ones, which the subprocess checks before the tests start. Any invalid read or write, use after free,
overflow or undefined operation aborts the subprocess with the sanitizer's report, and fails this test.

The subprocess runs each hypothesis test with a quarter of its usual examples, and a tenth of the decoder's bit
flips (ASan runs the C ~3x slower, and every allocation goes through its malloc; the ordinary run covers the
rest). Skipped, saying why, only when the compiler cannot build or run with the sanitizers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
# The tests the sanitized build runs: each native entry point against its reference, with hostile input.
TESTS = [
    "tests/protocol/test_validate.py",  # _bundlescan: scan_bundle, scan_produce
    "tests/protocol/test_frame.py",  # _bundlescan: cut_payloads
    "tests/protocol/test_encoders.py",  # _bundlescan: produce_codes_frame
    "tests/protocol/test_chunk.py",  # _bundlescan: read_chunk, scan_chunk
    "tests/spark/test_native_decoding.py",  # _decode
    "tests/storage/test_appender.py",  # _appender
    "tests/storage/test_log_append.py",  # _appender: LogCore, log_append
    "tests/tiering/test_block_builder.py",  # _builder
    "tests/server/test_produce_native.py",  # _produce
]

RUNNER = r"""
import importlib.machinery, importlib.util, json, sys

BUILT = json.loads(sys.argv[1])  # module name -> the sanitized build's path


class Sanitized:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in BUILT:
            loader = importlib.machinery.ExtensionFileLoader(name, BUILT[name])
            return importlib.util.spec_from_file_location(name, BUILT[name], loader=loader)
        return None


sys.meta_path.insert(0, Sanitized)
for name, path in BUILT.items():
    module = importlib.import_module(name)
    assert module.__file__ == path, (name, module.__file__)

import hypothesis
import tests.protocol.strategies as strategies

# No deadlines: the sanitized C runs several times slower, and a loaded machine stretches one example past any
# deadline (a timing, not a fault: faults abort the process).
hypothesis.settings.register_profile("asan", deadline=None)
hypothesis.settings.load_profile("asan")

usual = strategies.budget
strategies.budget = lambda n: usual(max(5, n // 4))
import tests.spark.test_native_decoding as decoding  # imported before pytest collects it: its loop shrinks too
decoding.FLIPS //= 10

import pytest

options = ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "addopts=", "--durations=12"]
sys.exit(pytest.main([*options, *sys.argv[2:]]))
"""


def ext_modules() -> list[dict]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["ext-modules"]


def compiler() -> str:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    found = shutil.which(cc) or shutil.which("gcc") or shutil.which("cc")
    if found is None:
        pytest.skip("no C compiler: the native modules are not built either")
    return found


def runtime(cc: str) -> str:
    """The ASan runtime to preload, or a skip saying why there is none."""
    out = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True)
    path = out.stdout.strip()
    if out.returncode or not os.path.isabs(path) or not os.path.exists(path):
        pytest.skip(f"{cc} has no AddressSanitizer runtime (libasan.so not found)")
    return path


def build(cc: str, modules: list[dict], out: Path) -> dict[str, str]:
    """Every module's sanitized build, the compilers run side by side; module name -> the built file."""
    started = {}
    for module in modules:
        target = out / (module["name"].rsplit(".", 1)[-1] + sysconfig.get_config_var("EXT_SUFFIX"))
        includes = [f"-I{sysconfig.get_paths()['include']}",
                    *(f"-I{REPO / d}" for d in module.get("include-dirs", []))]
        command = [cc, "-shared", "-fPIC", "-O1", "-g", *SANITIZE, *includes,
                   *(str(REPO / s) for s in module["sources"]), "-o", str(target)]
        started[module["name"]] = (target, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                            text=True))
    made = {name: (target, proc.communicate()[1], proc.returncode) for name, (target, proc) in started.items()}
    for name, (target, stderr, returncode) in made.items():
        if returncode:
            if "sanitize" in stderr:
                pytest.skip(f"{cc} cannot build with {' '.join(SANITIZE[:1])}: {stderr.strip().splitlines()[0]}")
            pytest.fail(f"{name} does not build with the sanitizers:\n{stderr}")
    return {name: str(target) for name, (target, _, _) in made.items()}


@pytest.mark.timeout(900)  # every module built, and every file of TESTS run, under the sanitizers: minutes, not seconds
def test_the_native_modules_under_address_sanitizer(tmp_path):
    cc = compiler()
    asan = runtime(cc)
    built = build(cc, ext_modules(), tmp_path)
    env = dict(os.environ, LD_PRELOAD=asan, ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1", PYTHONPATH=str(REPO),
               PYTHONMALLOC="malloc")  # every allocation through ASan's malloc, so overflows of Python buffers show
    import json

    run = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(built), *TESTS], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=840)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-6000:]}\n{run.stderr[-6000:]}"
    assert " passed" in run.stdout, run.stdout
