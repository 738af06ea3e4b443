"""What each topic costs: the cost meter's counts (tiered.catalog.usage) priced by a price table. Pure: `tiered cost`
(tiered/cli/cost.py) reads the catalog and prints what `cost_report` returns.

A price table names a price for every operation the meter counts (per 1,000 requests), for storage (per GiB-month)
and for bytes moved (per GiB, written and read). The default is S3 Standard's list prices for US East (N. Virginia)
(docs/operations.md, "What a topic costs", gives them with their date); `--prices FILE` (JSON or TOML, the same
keys) gives another provider's or a contract's.
"""

from __future__ import annotations

import json
import tomllib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from tiered.catalog.usage import BYTES_INGESTED, BYTES_READ, BYTES_WRITTEN, CATALOG_WIDE

GiB = float(1 << 30)
OPERATIONS = ("put", "copy", "list", "part", "multipart", "get", "head", "delete")
PUT_CLASS = ("put", "copy", "list", "part", "multipart")  # what S3 bills as PUT, COPY, POST, LIST
GET_CLASS = ("get", "head")


class BadPrices(ValueError):
    """A price table that cannot be used; the message is one line naming the problem."""


@dataclass(frozen=True, slots=True)
class PriceTable:
    name: str
    per_1000_requests: Mapping[str, float]  # by operation
    storage_per_gib_month: float
    written_per_gib: float
    read_per_gib: float


# S3 Standard, US East (N. Virginia), list prices (aws.amazon.com/s3/pricing, written down 2026-11-29): storage
# $0.023 per GB-month for the first 50 TB (AWS's GB here is 2^30 bytes); PUT, COPY, POST and LIST requests $0.005
# per 1,000 (multipart parts and their start and completion are PUT/POST requests); GET, HEAD and the others $0.0004
# per 1,000; DELETE free; data in free, and data out free within the region (a broker in the bucket's region).
S3_STANDARD_US_EAST_1 = PriceTable(
    name="S3 Standard, us-east-1 list prices (2026-11-29)",
    per_1000_requests={"put": 0.005, "copy": 0.005, "list": 0.005, "part": 0.005, "multipart": 0.005,
                       "get": 0.0004, "head": 0.0004, "delete": 0.0},
    storage_per_gib_month=0.023,
    written_per_gib=0.0,
    read_per_gib=0.0,
)


def parse_prices(text: str, filename: str) -> PriceTable:
    """A price table from a file's text: JSON for a name ending in .json, else TOML. Every key is required:

        name = "my contract"
        storage_per_gib_month = 0.021
        written_per_gib = 0.0
        read_per_gib = 0.0
        [per_1000_requests]
        put = 0.005  copy = ...  list  part  multipart  get  head  delete
    """
    try:
        raw = json.loads(text) if filename.endswith(".json") else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise BadPrices(f"{filename}: not {'JSON' if filename.endswith('.json') else 'TOML'}: {exc}") from None
    if not isinstance(raw, dict):
        raise BadPrices(f"{filename}: expected a table of prices")
    fields = ("name", "per_1000_requests", "storage_per_gib_month", "written_per_gib", "read_per_gib")
    if missing := [f for f in fields if f not in raw]:
        raise BadPrices(f"{filename}: missing {', '.join(missing)}")
    if unknown := sorted(set(raw) - set(fields)):
        raise BadPrices(f"{filename}: unknown key(s) {', '.join(unknown)}")
    requests = raw["per_1000_requests"]
    if not isinstance(requests, dict):
        raise BadPrices(f"{filename}: per_1000_requests must be a table of operation = price")
    if missing := [op for op in OPERATIONS if op not in requests]:
        raise BadPrices(f"{filename}: per_1000_requests lacks {', '.join(missing)} (every one of "
                        f"{', '.join(OPERATIONS)} is needed)")
    if unknown := sorted(set(requests) - set(OPERATIONS)):
        raise BadPrices(f"{filename}: per_1000_requests has unknown operation(s) {', '.join(unknown)}")

    def price(value: object, what: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
            raise BadPrices(f"{filename}: {what} must be a price (a number, 0 or more), not {value!r}")
        return float(value)

    if not isinstance(raw["name"], str) or not raw["name"].strip():
        raise BadPrices(f"{filename}: name must be a non-empty string")
    return PriceTable(
        name=raw["name"].strip(),
        per_1000_requests={op: price(requests[op], f"per_1000_requests.{op}") for op in OPERATIONS},
        storage_per_gib_month=price(raw["storage_per_gib_month"], "storage_per_gib_month"),
        written_per_gib=price(raw["written_per_gib"], "written_per_gib"),
        read_per_gib=price(raw["read_per_gib"], "read_per_gib"),
    )


@dataclass(frozen=True, slots=True)
class TopicCost:
    topic: str  # or CATALOG_WIDE, or "total"
    gib_ingested: float
    puts: float  # put-class requests (PUT, COPY, LIST, multipart parts and their start and end)
    gets: float  # get-class requests (GET, HEAD)
    deletes: float
    gib_written: float
    gib_read: float
    gib_stored: float
    dollars_requests: float  # requests and bytes moved, over the window
    dollars_per_gib_ingested: float | None  # None: nothing ingested
    dollars_per_month_stored: float

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def cost_report(usage: Mapping[tuple[str, str], float], stored: Mapping[str, int],
                prices: PriceTable) -> list[TopicCost]:
    """One row per topic (sorted, the catalog-wide row last among them), then the total. `usage` is (topic, measure)
    -> amount over the window (tiered.catalog.usage.usage); `stored` is bytes per topic now."""
    by_topic: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (topic, measure), amount in usage.items():
        by_topic[topic][measure] += amount
    for topic in stored:
        by_topic[topic]  # noqa: B018 -- a topic that only stores bytes has a row too
    names = sorted(t for t in by_topic if t != CATALOG_WIDE) + ([CATALOG_WIDE] if CATALOG_WIDE in by_topic else [])
    rows = [_row(topic, by_topic[topic], stored.get(topic, 0), prices) for topic in names]
    total: dict[str, float] = defaultdict(float)
    for topic in names:
        for measure, amount in by_topic[topic].items():
            total[measure] += amount
    rows.append(_row("total", total, sum(stored.values()), prices))
    return rows


def _row(topic: str, measures: Mapping[str, float], stored_bytes: int, prices: PriceTable) -> TopicCost:
    unknown = sorted(set(measures) - set(OPERATIONS) - {BYTES_WRITTEN, BYTES_READ, BYTES_INGESTED})
    if unknown:  # a newer broker's operation this table does not price: refuse rather than under-count
        raise BadPrices(f"the catalog counts operation(s) {', '.join(unknown)} that the price table has no price for")
    requests = sum(measures.get(op, 0.0) * prices.per_1000_requests[op] / 1000 for op in OPERATIONS)
    written, read = measures.get(BYTES_WRITTEN, 0.0) / GiB, measures.get(BYTES_READ, 0.0) / GiB
    moved = requests + written * prices.written_per_gib + read * prices.read_per_gib
    ingested = measures.get(BYTES_INGESTED, 0.0) / GiB
    return TopicCost(
        topic=topic,
        gib_ingested=ingested,
        puts=sum(measures.get(op, 0.0) for op in PUT_CLASS),
        gets=sum(measures.get(op, 0.0) for op in GET_CLASS),
        deletes=measures.get("delete", 0.0),
        gib_written=written,
        gib_read=read,
        gib_stored=stored_bytes / GiB,
        dollars_requests=moved,
        dollars_per_gib_ingested=moved / ingested if ingested > 0 else None,
        dollars_per_month_stored=stored_bytes / GiB * prices.storage_per_gib_month,
    )
