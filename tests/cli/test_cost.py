"""`tiered cost`: the catalog's usage rows priced per topic, as a table or JSON; bad input is one line."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from tiered.catalog import Catalog
from tiered.catalog import usage as catalog_usage
from tiered.catalog.migrate import upgrade
from tiered.cli.cost import parse_since
from tiered.cost_report import S3_STANDARD_US_EAST_1, BadPrices, cost_report, parse_prices

from tests.support.cli import one_line_error, tiered

GiB = 1 << 30
NOW = datetime.now(timezone.utc)
PRICES_TOML = """
name = "a contract"
storage_per_gib_month = 0.01
written_per_gib = 0.0
read_per_gib = 0.02
[per_1000_requests]
put = 0.01
copy = 0.01
list = 0.01
part = 0.01
multipart = 0.01
get = 0.001
head = 0.001
delete = 0.0
"""


@pytest.fixture
def catalog_with_usage(tmp_path):
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    upgrade(url)
    with Catalog.open(url) as cat:
        # 4,000 block PUTs shared 3:1 by two topics, one GiB ingested by orders; an old hour outside --since 1h.
        catalog_usage.add_usage(cat, 1, {("orders", "put"): 3000.0, ("clicks", "put"): 1000.0,
                                         ("orders", "get"): 500.0, ("orders", "bytes_ingested"): float(GiB),
                                         ("orders", "bytes_read"): float(GiB), ("(catalog)", "list"): 10.0}, now=NOW)
        catalog_usage.add_usage(cat, 2, {("orders", "put"): 99.0}, now=NOW - timedelta(hours=5))
    return url


def test_the_table_prices_each_topic_and_the_total(catalog_with_usage):
    out = tiered("cost", "--catalog", catalog_with_usage, "--since", "1h").stdout.decode()
    assert "prices: S3 Standard, us-east-1" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.strip()}
    # orders: 3000 PUTs * $0.005/1000 + 500 GETs * $0.0004/1000 = $0.0152, for its one GiB ingested
    assert lines["orders"][1:7] == ["1.000", "3,000.0", "500.0", "1.000", "0.0152", "0.0152"]
    assert lines["clicks"][2] == "1,000.0" and lines["clicks"][6] == "-"  # nothing ingested: no $/GiB
    assert lines["total"][2] == "4,010.0"


def test_json_and_a_price_file(catalog_with_usage, tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES_TOML)
    report = json.loads(tiered("cost", "--catalog", catalog_with_usage, "--json", "--prices", str(prices)).stdout)
    assert report["prices"] == "a contract"
    rows = {r["topic"]: r for r in report["topics"]}
    assert rows["orders"]["puts"] == 3099.0  # no --since and no live broker: everything recorded
    assert rows["orders"]["dollars_requests"] == pytest.approx(3099 * 0.01 / 1000 + 500 * 0.001 / 1000 + 0.02)
    assert rows["total"]["puts"] == pytest.approx(4109.0)


def test_a_price_table_as_json_says_the_same():
    toml_table = parse_prices(PRICES_TOML, "p.toml")
    import tomllib

    assert parse_prices(json.dumps(tomllib.loads(PRICES_TOML)), "p.json") == toml_table


@pytest.mark.parametrize("text, says", [
    ("name = 1", "missing per_1000_requests, storage_per_gib_month"),
    (PRICES_TOML.replace("head = 0.001\n", ""), "per_1000_requests lacks head"),
    (PRICES_TOML.replace("get = 0.001", "get = -1"), "per_1000_requests.get must be a price"),
    ("extra = 1\n" + PRICES_TOML, "unknown key(s) extra"),
    (PRICES_TOML + "select = 1\n", "unknown operation(s) select"),
    ("[[", "not TOML"),
])
def test_a_bad_price_table_is_one_line(text, says):
    with pytest.raises(BadPrices) as caught:
        parse_prices(text, "p.toml")
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_bad_input_is_one_line(catalog_with_usage, tmp_path):
    err = one_line_error(tiered("cost", "--catalog", catalog_with_usage, "--since", "yesterday", check=False),
                         "cost", 2)
    assert "expected an ISO time" in err
    err = one_line_error(tiered("cost", "--catalog", catalog_with_usage, "--prices", str(tmp_path / "none.toml"),
                                check=False), "cost", 2)
    assert "cannot read the price table" in err
    one_line_error(tiered("cost", "--catalog", f"sqlite:///{tmp_path / 'nothing.db'}", check=False), "cost", 1)


def test_since_takes_ages_and_iso_times():
    now = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
    assert parse_since("90m", now) == now - timedelta(minutes=90)
    assert parse_since("2w", now) == now - timedelta(weeks=2)
    assert parse_since("2026-11-29T08:00Z", now) == datetime(2026, 11, 29, 8, tzinfo=timezone.utc)
    assert parse_since("2026-11-28", now) == datetime(2026, 11, 28, tzinfo=timezone.utc)
    with pytest.raises(ValueError, match="in the future"):
        parse_since("2027-01-01", now)


def test_an_operation_the_table_cannot_price_is_refused_not_dropped():
    with pytest.raises(BadPrices, match="select"):
        cost_report({("t", "select"): 1.0}, {}, S3_STANDARD_US_EAST_1)


def test_the_default_window_starts_at_the_hour_the_longest_running_live_broker_started(catalog_with_usage):
    from tiered.catalog import cluster

    with Catalog.open(catalog_with_usage) as cat:
        cluster.register(cat, 7, "incarnation", "127.0.0.1:1", "", 60_000, now=NOW - timedelta(hours=3))
        assert catalog_usage.live_since(cat) == NOW - timedelta(hours=3)
    out = tiered("cost", "--catalog", catalog_with_usage).stdout.decode()
    assert out.startswith(f"from {NOW - timedelta(hours=3):%Y-%m-%d %H}:00 UTC to now")
    orders = next(line.split() for line in out.splitlines() if line.startswith("orders"))
    assert orders[2] == "3,000.0"  # the hour 5 hours ago is before the window
