"""What the ops tests share: a raw HTTP GET against the broker's `-P` endpoint, /metrics parsed with
prometheus_client's own parser, bounded waits, and `tiered` started as the container image starts it."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.broker import REPO


@dataclass
class HttpAnswer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


def http_request(port: int, raw: bytes, timeout_s: float = 10.0) -> HttpAnswer:
    """Sends `raw` (a whole HTTP request, as bytes) to 127.0.0.1:port and reads the answer until the server
    closes the connection (the endpoint answers `Connection: close`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(raw)
        chunks = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    response = b"".join(chunks)
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert int(headers["content-length"]) == len(body), "Content-Length disagrees with the body"
    return HttpAnswer(status, headers, body)


def http_get(port: int, path: str) -> HttpAnswer:
    return http_request(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())


async def ahttp_get(port: int, path: str) -> HttpAnswer:
    """http_get from a test running on the broker's own event loop."""
    return await asyncio.to_thread(http_get, port, path)


class Scrape:
    """One /metrics answer parsed by prometheus_client: samples looked up by name and labels."""

    def __init__(self, text: str):
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = [s for f in self.families.values() for s in f.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sample's value. The parser names every counter sample `<family>_total` (OpenMetrics), also those
        exported without the suffix, as TANK's are; `name` may be given either way."""
        names = (name, name + "_total")
        found = [s.value for s in self.samples if s.name in names and s.labels == labels]
        assert found, f"no sample {name}{labels} in /metrics:\n{self.text}"
        assert len(found) == 1, f"{len(found)} samples {name}{labels}"
        return found[0]

    def get(self, name: str, default: float = 0, **labels: str) -> float:
        """The sample's value, or `default` when it is not exported (yet)."""
        names = (name, name + "_total")
        found = [s.value for s in self.samples if s.name in names and s.labels == labels]
        return found[0] if found else default

    def buckets(self, name: str, **labels: str) -> list[tuple[float, float]]:
        """(le, cumulative count) of a histogram, in bucket order."""
        out = []
        for s in self.samples:
            if s.name == name + "_bucket" and {k: v for k, v in s.labels.items() if k != "le"} == labels:
                out.append((float(s.labels["le"]), s.value))
        assert out, f"no histogram {name}{labels} in /metrics"
        return sorted(out)

    def kind(self, family: str) -> str:
        assert family in self.families, f"no metric family {family} in /metrics:\n{self.text}"
        return self.families[family].type


async def scrape(port: int) -> Scrape:
    answer = await ahttp_get(port, "/metrics")
    assert answer.status == 200 and answer.headers["content-type"].startswith("text/plain")
    return Scrape(answer.text)



def tiered_console_script(tmp_path: Path) -> Path:
    """The `tiered` console script: the installed one next to this interpreter when the package is installed (as
    in the image, where pip installs the wheel), else the same launcher pip writes for pyproject.toml's
    [project.scripts] entry, written into tmp_path."""
    installed = Path(sys.executable).parent / "tiered"
    if installed.exists():
        return installed
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["tiered"].partition(":")
    script = tmp_path / "bin" / "tiered"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(
        f"#!{sys.executable}\n"
        "import re\nimport sys\n"
        f"from {module} import {function}\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        f"    sys.exit({function}())\n"
    )
    script.chmod(0o755)
    return script


def child_env(**extra: str) -> dict[str, str]:
    """The test's environment for a child broker: the checkout importable, no TIERED_* leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def wait_for_port(port: int, proc: subprocess.Popen, output, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"broker exited with {proc.returncode}:\n{output()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} after {timeout_s} s:\n{output()}")
