"""Logs: secrets never appear in a broker's output, in either format and at debug level, whether it fails to start or
serves and stops; JSON logs are one JSON object per line, with the settings as a structured field."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tiered.client import Client

from tests.ops.helpers import child_env, tiered_console_script, wait_for_port
from tests.support.broker import free_port

CATALOG_PASSWORD = "s3cret-catalog-pw"
SECRETS = {
    "PGPASSWORD": "pg-password-4f1c9e",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-key-8b2d7a",
    "AWS_SESSION_TOKEN": "aws-session-token-3e5f0b",
}


def _run_failing(tmp_path: Path, log_format: str, *flags: str) -> subprocess.CompletedProcess:
    script = tiered_console_script(tmp_path)
    argv = [str(script), "serve", "-p", str(tmp_path / "data"), "-l", "127.0.0.1:0", "-P", "off",
            "--log-level", "debug", "--log-format", log_format, *flags]
    return subprocess.run(argv, capture_output=True, env=child_env(**SECRETS), timeout=60)


def _assert_clean(output: str) -> None:
    for secret in (CATALOG_PASSWORD, *SECRETS.values()):
        assert secret not in output, f"{secret!r} printed:\n{output}"


def _json_lines(output: str) -> list[dict]:
    records = [json.loads(line) for line in output.splitlines() if line.strip()]
    for record in records:
        assert {"ts", "level", "logger", "msg"} <= set(record), record
    return records


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_an_unreachable_catalog_with_a_password_in_its_url(tmp_path, log_format):
    url = f"postgresql+psycopg://tiered:{CATALOG_PASSWORD}@127.0.0.1:1/tiered"
    proc = _run_failing(tmp_path, log_format, "--catalog", url)
    output = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 1, output
    _assert_clean(output)
    assert "tiered:***@127.0.0.1:1/tiered" in output  # the URL is logged, masked
    if log_format == "json":
        records = _json_lines(output)
        assert any(r["level"] == "error" and r["msg"].startswith("could not start:") for r in records)
        starting = next(r for r in records if r["msg"].startswith("starting"))
        assert starting["settings"]["catalog_url"] == "postgresql+psycopg://tiered:***@127.0.0.1:1/tiered"


@pytest.mark.parametrize("password", ["se#cret-catalog-pw", "se?cret-catalog-pw", "se/cret/catalog-pw",
                                      "a#b?c/d-e-catalog"])
def test_a_catalog_password_that_urlsplit_misreads_is_masked_too(tmp_path, password):
    """`#`, `?` and `/` end a URL's authority for urlsplit, which then finds no password; SQLAlchemy, which connects,
    reads the whole password: masking must use the same parser, or the start-up line prints it in clear."""
    url = f"postgresql+psycopg://tiered:{password}@127.0.0.1:1/tiered"
    proc = _run_failing(tmp_path, "text", "--catalog", url)
    output = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 1, output
    for fragment in {password, *password.replace("/", "#").replace("?", "#").split("#")} - {"a", "b", "c"}:
        if len(fragment) >= 6:
            assert fragment not in output, f"{fragment!r} printed:\n{output}"
    assert "tiered:***@127.0.0.1:1/tiered" in output


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_refused_store_url_with_credentials_in_it(tmp_path, log_format):
    proc = _run_failing(tmp_path, log_format, "--store", f"ftp://user:{CATALOG_PASSWORD}@files.example/x")
    output = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 1 and "could not start" in output, output
    _assert_clean(output)
    if log_format == "json":
        _json_lines(output)


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_a_serving_broker_on_s3_with_errors_prints_no_secret(tmp_path, log_format, s3_endpoint, s3_bucket,
                                                                    s3_faults):
    port = free_port()
    argv = [str(tiered_console_script(tmp_path)), "serve", "-p", str(tmp_path / "data"), "-l", f"127.0.0.1:{port}",
            "-P", "off", "--store", f"s3://{s3_bucket}/t", "--s3-path-style", "--block-max-age-ms", "20",
            "--log-level", "debug", "--log-format", log_format]
    env = child_env(**SECRETS, AWS_ACCESS_KEY_ID="testing", AWS_REGION="us-east-1", AWS_ENDPOINT_URL=s3_endpoint,
                    AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null")
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc, log_path.read_text)
        async with await Client.connect("127.0.0.1", port) as c:
            await c.create_topic("t", 1)
            # The first PUT is refused (403 is not retried by botocore): the broker logs the error and retries.
            s3_faults.fail_next(1, 403, match=lambda method, path: method == "PUT")
            await c.produce("t", 0, [b"one"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    output = log_path.read_text()
    assert "failed (attempt 1" in output, output  # the store error was logged ...
    _assert_clean(output)  # ... without the credentials it was made with
    if log_format == "json":
        assert _json_lines(output)[-1]["msg"] == "stopped"


def test_secret_values_are_redacted_wherever_they_appear():
    import logging

    from tiered.cli.serve import JsonFormatter, Redactor, TextFormatter
    from tiered.config import Settings

    settings = Settings(catalog_url="postgresql+psycopg://u:p%40ss-word@db/x", store_url="s3://b/p")
    redact = Redactor.for_settings(settings, {"PGPASSWORD": "pg-pass-1", "AWS_SECRET_ACCESS_KEY": "k\"ey\\1234"})
    try:
        raise RuntimeError("login with p@ss-word failed")
    except RuntimeError:
        import sys

        exc_info = sys.exc_info()
    record = logging.LogRecord("tiered", logging.ERROR, __file__, 1, "tried %s and %s with %s",
                               ("p%40ss-word", "pg-pass-1", 'k"ey\\1234'), exc_info)
    text = TextFormatter(redact).format(record)
    assert "p@ss-word" not in text and "p%40ss-word" not in text and "pg-pass-1" not in text
    assert 'k"ey\\1234' not in text and text.count("***") >= 4
    line = json.loads(JsonFormatter(redact).format(record))
    assert "p@ss-word" not in json.dumps(line) and 'k"ey\\1234' not in line["msg"]
    assert line["msg"] == "tried *** and *** with ***" and "***" in line["exc"]
    # Short values are left alone: redacting every "ab" would garble the logs and protect nothing.
    assert Redactor(["ab"]).secrets == []
