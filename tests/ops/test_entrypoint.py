"""`tiered serve` started as the container image starts it: ENTRYPOINT ["tiered"], CMD ["serve", "-p", DIR, "-l",
":PORT"], the rest from a TOML file named by TIERED_CONFIG and from TIERED_* variables (as the chart passes them)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
from pathlib import Path

from tiered.client import Client

from tests.ops.helpers import Scrape, child_env, http_get, tiered_console_script, wait_for_port
from tests.support.broker import REPO, free_port

SHUTDOWN_TIMEOUT_S = 8


def _image_cmd() -> list[str]:
    """The Dockerfile's ENTRYPOINT and CMD, so the test starts what the image starts."""
    text = (REPO / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT\s+(\[.*\])$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD\s+(\[.*\])$", text, re.M).group(1))
    return entrypoint + cmd


async def test_the_image_command_serves_and_stops_on_sigterm(tmp_path: Path):
    argv = _image_cmd()
    assert argv[:2] == ["tiered", "serve"] and argv[2] == "-p" and argv[4] == "-l"
    data_dir, port, http_port = tmp_path / "var-lib-tiered", free_port(), free_port()
    argv = [str(tiered_console_script(tmp_path)), "serve", "-p", str(data_dir), "-l", f":{port}"]
    config = tmp_path / "etc" / "tiered.toml"
    config.parent.mkdir()
    config.write_text(
        f'http_listen = "127.0.0.1:{http_port}"\n'
        "block_max_age_ms = 40\n"
        "log_format = \"json\"\n"
        "[topic_defaults]\n"
        '"log.segment.bytes" = "1m"\n'
    )
    env = child_env(TIERED_CONFIG=str(config), TIERED_SHUTDOWN_TIMEOUT_S=str(SHUTDOWN_TIMEOUT_S))
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc, log_path.read_text)
        wait_for_port(http_port, proc, log_path.read_text)
        assert http_get(http_port, "/healthz").status == 200
        assert await _eventually_ready(http_port)
        async with await Client.connect("127.0.0.1", port) as c:
            await c.create_topic("events", 2)
            await c.produce("events", 1, [b"one", b"two"])
            got = [m.value async for m in c.drain("events", 1, 0)]
        assert got == [b"one", b"two"]
        scrape = Scrape(http_get(http_port, "/metrics").text)
        assert scrape.value("tanksrv_topic_produced_msgs", m="events") == 2
        assert (data_dir / "events" / "1").is_dir()  # -p is the data directory, as TANK's base path
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(SHUTDOWN_TIMEOUT_S + 2)
        assert code == 0, log_path.read_text()
        assert time.monotonic() - started < SHUTDOWN_TIMEOUT_S
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    settings = next(r for r in records if r["msg"].startswith("starting with"))["settings"]
    # Flags, environment and file all reached the settings.
    assert settings["data_dir"] == str(data_dir) and settings["listen"] == f":{port}"
    assert settings["shutdown_timeout_s"] == SHUTDOWN_TIMEOUT_S
    assert settings["http_listen"] == f"127.0.0.1:{http_port}" and settings["block_max_age_ms"] == 40
    assert settings["topic_defaults"] == {"log.segment.bytes": "1m"}
    assert records[-1]["msg"] == "stopped"
    assert {r["level"] for r in records} <= {"info", "debug"}, log_path.read_text()


async def _eventually_ready(http_port: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (await asyncio.to_thread(http_get, http_port, "/readyz")).status == 200:
            return True
        await asyncio.sleep(0.05)
    return False


def test_a_bad_setting_exits_2_naming_its_source(tmp_path: Path):
    script = tiered_console_script(tmp_path)
    proc = subprocess.run([str(script), "serve", "-p", str(tmp_path / "d"), "-l", ":0"], capture_output=True,
                          env=child_env(TIERED_BLOCK_MAX_BYTES="eight megs"), timeout=60)
    assert proc.returncode == 2
    assert b"environment TIERED_BLOCK_MAX_BYTES" in proc.stderr and b"block_max_bytes" in proc.stderr
