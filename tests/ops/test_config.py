"""Settings (tiered.config.load_settings): docs/configuration.md's table is the contract. Every setting round-trips
through the file, its environment variable and its flag; the precedence is flags > environment > file > defaults;
a bad value is a SettingsError naming where it came from."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tiered.config import Settings, SettingsError, add_arguments, load_settings, parse_broker_id

from tests.support.broker import REPO


def doc_table() -> dict[str, dict[str, str]]:
    """The rows of docs/configuration.md's table: file key -> environment, flags, default."""
    rows = {}
    for line in (REPO / "docs" / "configuration.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        key = cells[0].strip("`")
        rows[key] = {"env": cells[1].strip("`"), "flags": re.findall(r"`(-[-\w]+)`", cells[2]),
                     "default": cells[3].strip("`")}
    return rows


TABLE = doc_table()

# Per setting: (TOML literal in the file, text for the environment and the flag, the value it loads as). A flag
# that takes no argument (store_const) is given bare.
SAMPLES = {
    "data_dir": ('"/srv/tiered"', "/srv/tiered", Path("/srv/tiered")),
    "listen": ('"127.0.0.1:1234"', "127.0.0.1:1234", "127.0.0.1:1234"),
    "http_listen": ('"off"', "off", "off"),
    "catalog_url": ('"postgresql+psycopg://u@db:5432/t"', "postgresql+psycopg://u@db:5432/t",
                    "postgresql+psycopg://u@db:5432/t"),
    "catalog_notices_url": ('"postgresql://u@db:5432/t"', "postgresql://u@db:5432/t", "postgresql://u@db:5432/t"),
    "store_url": ('"s3://bucket/prefix"', "s3://bucket/prefix", "s3://bucket/prefix"),
    "s3_path_style": ("true", "yes", True),
    "s3_sse": ('"kms"', "KMS", "kms"),
    "s3_sse_kms_key_id": ('"alias/streams"', "alias/streams", "alias/streams"),
    "broker_id": ("7", "7", 7),
    "read_only": ("true", "1", True),
    "block_max_bytes": ('"512kb"', "512KiB", 512 << 10),
    "block_max_age_ms": ("100", "100", 100),
    "block_linger_ms": ("5", "5", 5),
    "block_max_puts_per_s": ("2.5", "2.5", 2.5),
    "block_expand_in_commit_runs": ("0", "0", 0),
    "remote_read_budget_bytes": ('"64MiB"', "64MiB", 64 << 20),
    "remote_read_yield_ms": ("50", "50", 50),
    "produce_ack_timeout_ms": ("2500", "2500", 2500),
    "remote_retention_interval_ms": ("5000", "5000", 5000),
    "local_retention_interval_ms": ("4000", "4000", 4000),
    "shutdown_timeout_s": ("12.5", "12.5", 12.5),
    "advertise": ('"10.1.2.3:11011"', "10.1.2.3:11011", "10.1.2.3:11011"),
    "cluster_lease_ms": ("4000", "4000", 4000),
    "log_level": ('"debug"', "DEBUG", "debug"),
    "log_format": ('"json"', "json", "json"),
    "tls_cert": ('"/etc/tiered/tls.crt"', "/etc/tiered/tls.crt", "/etc/tiered/tls.crt"),
    "tls_key": ('"/etc/tiered/tls.key"', "/etc/tiered/tls.key", "/etc/tiered/tls.key"),
    "tls_client_ca": ('"/etc/tiered/ca.crt"', "/etc/tiered/ca.crt", "/etc/tiered/ca.crt"),
    "listen_plain": ('"127.0.0.1:11012"', "127.0.0.1:11012", "127.0.0.1:11012"),
    "acl": ('"/etc/tiered/acl.toml"', "/etc/tiered/acl.toml", "/etc/tiered/acl.toml"),
}
# A second value per setting, to tell the sources apart in the precedence test.
OTHER = {
    "data_dir": ("/other", Path("/other")), "listen": (":2345", ":2345"), "http_listen": (":9300", ":9300"),
    "catalog_url": ("sqlite:///x.db", "sqlite:///x.db"), "store_url": ("file:///objects", "file:///objects"),
    "catalog_notices_url": ("postgresql://o@db/t", "postgresql://o@db/t"),
    "s3_path_style": ("false", False), "broker_id": ("3", 3), "read_only": ("no", False),
    "s3_sse": ("s3", "s3"), "s3_sse_kms_key_id": ("alias/other", "alias/other"),
    "block_max_bytes": ("2m", 2 << 20), "block_max_age_ms": ("7", 7), "shutdown_timeout_s": ("3", 3.0),
    "produce_ack_timeout_ms": ("900", 900), "remote_retention_interval_ms": ("250", 250), "local_retention_interval_ms": ("300", 300), "advertise": ("10.9.9.9:1", "10.9.9.9:1"),
    "tls_cert": ("/o.crt", "/o.crt"), "tls_key": ("/o.key", "/o.key"), "tls_client_ca": ("/o.ca", "/o.ca"),
    "listen_plain": (":2346", ":2346"), "acl": ("/o.toml", "/o.toml"),
    "cluster_lease_ms": ("2000", 2000), "block_linger_ms": ("0", 0), "block_max_puts_per_s": ("50", 50.0),
    "block_expand_in_commit_runs": ("8", 8),
    "remote_read_budget_bytes": ("32m", 32 << 20), "remote_read_yield_ms": ("0", 0),
    "log_level": ("error", "error"), "log_format": ("text", "text"),
}
BARE_FLAGS = {"s3_path_style", "read_only"}


def parse_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tiered.toml"
    path.write_text(text)
    return path


def test_the_table_names_every_setting_and_nothing_else():
    assert set(TABLE) == {f for f in Settings.__dataclass_fields__}
    assert set(SAMPLES) == set(TABLE) - {"topic_defaults"}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_setting_round_trips_through_file_environment_and_flag(name, tmp_path):
    toml, text, expected = SAMPLES[name]
    row = TABLE[name]
    from_file = load_settings(parse_flags(), {"TIERED_CONFIG": str(write_config(tmp_path, f"{name} = {toml}\n"))})
    assert getattr(from_file, name) == expected
    assert getattr(load_settings(parse_flags(), {row["env"]: text}), name) == expected
    for flag in row["flags"]:  # every spelling the table gives
        argv = [flag] if name in BARE_FLAGS else [flag, text]
        assert getattr(load_settings(parse_flags(*argv), {}), name) == expected, flag


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_flags_beat_environment_beat_file_beat_defaults(name, tmp_path):
    toml, text, file_value = SAMPLES[name]
    env_text, env_value = OTHER[name]
    config = str(write_config(tmp_path, f"{name} = {toml}\n"))
    env = {"TIERED_CONFIG": config, TABLE[name]["env"]: env_text}
    assert getattr(load_settings(parse_flags(), {}), name) == getattr(_documented_defaults(), name)
    assert getattr(load_settings(parse_flags(), {"TIERED_CONFIG": config}), name) == file_value
    assert getattr(load_settings(parse_flags(), env), name) == env_value
    if name in BARE_FLAGS:  # a bare flag can only turn the setting on: over an environment that turns it off
        flags = parse_flags(TABLE[name]["flags"][0])
        assert getattr(load_settings(flags, env), name) is True
    else:  # the flag gives the file's value again: only a flag beating the environment brings it back
        flags = parse_flags(TABLE[name]["flags"][-1], text)
        assert getattr(load_settings(flags, {**env, TABLE[name]["env"]: env_text}), name) == file_value
    # An empty environment variable is unset: the file's value stands.
    assert getattr(load_settings(parse_flags(), {**env, TABLE[name]["env"]: ""}), name) == file_value


def _documented_defaults() -> Settings:
    """The table's default column, read as settings."""
    values = {}
    for name, row in TABLE.items():
        default = row["default"]
        if name == "topic_defaults":
            assert default == "{}"
        elif name == "broker_id":
            values[name] = parse_broker_id(default)
        elif name in ("catalog_url", "store_url"):
            values[name] = ""  # derived from data_dir, checked below
        elif name == "catalog_notices_url":
            assert default == "none"  # the listener uses catalog_url (none behind a pooler)
            values[name] = ""
        elif name == "advertise":
            assert default == "the listen address"
            values[name] = ""
        elif name == "block_linger_ms":
            assert default == "off"  # blocks wait out block_max_age_ms
            values[name] = None
        elif name == "s3_sse_kms_key_id":
            assert default == "the account's aws/s3 key"  # empty: S3 uses the account's default KMS key
            values[name] = ""
        elif name in ("tls_cert", "tls_key", "tls_client_ca", "listen_plain", "acl"):
            assert default == "off"  # TLS off; no second listener; no access rules
            values[name] = ""
        elif name in SAMPLES:
            values[name] = load_settings({name: default}, {}).__getattribute__(name)
    return Settings(**values)


def test_defaults_are_the_documented_ones(tmp_path, monkeypatch):
    loaded = load_settings(parse_flags(), {})
    assert loaded == _documented_defaults()
    assert loaded.effective_catalog_url == f"sqlite:///{Path('data/.tiered/catalog.db').resolve()}"
    assert loaded.effective_store_url == f"file://{Path('data/.tiered/objects').resolve()}"
    # broker_id defaults to `auto`: a StatefulSet pod's ordinal.
    monkeypatch.setattr("socket.gethostname", lambda: "tiered-3")
    assert load_settings(parse_flags(), {}).broker_id == 3
    monkeypatch.setattr("socket.gethostname", lambda: "laptop")
    assert load_settings(parse_flags(), {}).broker_id == 0


def test_topic_defaults_come_from_the_file_only(tmp_path):
    config = write_config(tmp_path, '[topic_defaults]\n"retention.segments.count" = 16\n"Produce.Ack" = "local"\n')
    loaded = load_settings(parse_flags("--config", str(config)), {})
    assert loaded.topic_defaults == {"retention.segments.count": "16", "produce.ack": "local"}
    # --config beats TIERED_CONFIG, like every flag.
    other = tmp_path / "other.toml"
    other.write_text("log_level = \"error\"\n")
    assert load_settings(parse_flags("--config", str(other)), {"TIERED_CONFIG": str(config)}).topic_defaults == {}


BAD = {
    "listen": ("127.0.0.1:port", "port must be a number"),
    "http_listen": (":70000", "port out of range"),
    "s3_path_style": ("maybe", "bad boolean"),
    "broker_id": ("-1", "bad broker id"),
    "read_only": ("2", "bad boolean"),
    "block_max_bytes": ("12", "1 KiB"),
    "block_max_age_ms": ("0", "1 ms"),
    "block_expand_in_commit_runs": ("-1", "below the minimum"),
    "produce_ack_timeout_ms": ("0", "1 ms"),
    "shutdown_timeout_s": ("nan", "positive number of seconds"),
    "log_level": ("loud", "not one of"),
    "log_format": ("xml", "not one of"),
    "catalog_notices_url": ("postgresql://u@pgbouncer/t?pooled=true", "need a direct connection"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_names_its_source(name, tmp_path):
    text, why = BAD[name]
    env = TABLE[name]["env"]
    config = write_config(tmp_path, f'{name} = "{text}"\n')
    with pytest.raises(SettingsError, match=rf"^config file {re.escape(str(config))}: {name}: .*{why}"):
        load_settings(parse_flags("--config", str(config)), {})
    with pytest.raises(SettingsError, match=rf"^environment {env}: {name}: .*{why}"):
        load_settings(parse_flags(), {env: text})
    if name not in BARE_FLAGS:
        flag = TABLE[name]["flags"][-1]
        with pytest.raises(SettingsError, match=rf"^flag {flag}: {name}: .*{why}"):
            load_settings(parse_flags(flag, text), {})


def test_a_bad_file_is_named(tmp_path):
    with pytest.raises(SettingsError, match="config file .*missing.toml"):
        load_settings(parse_flags("--config", str(tmp_path / "missing.toml")), {})
    broken = write_config(tmp_path, "listen = \n")
    with pytest.raises(SettingsError, match=f"config file {re.escape(str(broken))}"):
        load_settings(parse_flags(), {"TIERED_CONFIG": str(broken)})
    unknown = write_config(tmp_path, "lsiten = \":1\"\n")
    with pytest.raises(SettingsError, match="unknown setting 'lsiten'"):
        load_settings(parse_flags(), {"TIERED_CONFIG": str(unknown)})
    with pytest.raises(SettingsError, match="broker_id"):
        load_settings(parse_flags(), {"TIERED_CONFIG": str(write_config(tmp_path, "broker_id = true\n"))})


def test_the_cluster_table_sets_the_lease_and_the_advertised_endpoint(tmp_path):
    path = write_config(tmp_path, '[cluster]\nlease_ms = 3000\nadvertise = "10.0.0.5:11011"\n')
    settings = load_settings(parse_flags(), {"TIERED_CONFIG": str(path)})
    assert (settings.cluster_lease_ms, settings.advertise) == (3000, "10.0.0.5:11011")
    with pytest.raises(SettingsError, match="cluster.lease"):
        load_settings(parse_flags(), {"TIERED_CONFIG": str(write_config(tmp_path, "[cluster]\nlease = 1\n"))})


@pytest.mark.parametrize("text", ["11011", "host", ":11011", "10.0.0.1:0", "10.0.0.1:99999", "10.0.0.1:x"])
def test_a_bad_advertised_endpoint_is_named(text):
    with pytest.raises(SettingsError, match="advertise"):
        load_settings({"advertise": text}, {})


def test_a_lease_below_one_second_is_refused():
    with pytest.raises(SettingsError, match="cluster_lease_ms"):
        load_settings({"cluster_lease_ms": "500"}, {})
