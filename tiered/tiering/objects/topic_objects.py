"""Topic objects: what a catalog rebuild needs to know of a topic that no block or segment records.

Blocks and remote segments tell a rebuild which partitions hold data, not how many partitions a topic has nor its
config (retention, `produce.ack`, ...). So the broker writes each topic's catalog row to the bucket as well:

    topics/<topic>.json          (the key is built in tiered.tiering.objects.keys only)
        UTF-8 JSON, one object, at most MAX_TOPIC_OBJECT_BYTES:
        {"format": 1,                   always 1; a reader refuses any other
         "topic": "events",             the topic (TANK's name rule); must match the key
         "partitions": 4,               1..4096 (tiered.topic_rules)
         "config_text": "produce.ack=durable\\n",   the topic's config file as created (may be "")
         "created_ms": 1700000000000}   when the topic was created, ms since the epoch

Written after the catalog row, wherever a topic is created (TieringService.create_topic; a topic's catalog config does
not change after that: a partition's local `config` file and ReloadConf change one broker's view only), and at start for every catalog topic that has none yet (a topic created before these objects existed, or whose PUT
failed). A failed PUT is logged and does not fail the creation: the catalog row and the local directories are the
truth the broker serves from; the object is the copy a rebuild reads, caught up at the next start.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone

from tiered.tiering.objects import keys
from tiered.tiering.objects.store import ObjectNotFound, ObjectStore, StoreError
from tiered.tiering.objects.meter import CATALOG, Attribution
from tiered.topic_rules import is_valid_topic_name, validate_partition_count

log = logging.getLogger("tiered.tiering")

FORMAT = 1
MAX_TOPIC_OBJECT_BYTES = 1 << 20


class BadTopicObject(ValueError):
    """A topic object that cannot be read: names the key and what is wrong."""


@dataclass(frozen=True, slots=True)
class TopicObject:
    topic: str
    partitions: int
    config_text: str
    created_ms: int

    @property
    def created_at(self) -> datetime:
        return datetime.fromtimestamp(self.created_ms / 1000, timezone.utc)


def encode_topic_object(topic: TopicObject) -> bytes:
    document = {"format": FORMAT, "topic": topic.topic, "partitions": topic.partitions,
                "config_text": topic.config_text, "created_ms": topic.created_ms}
    return json.dumps(document, sort_keys=True).encode()


def decode_topic_object(data: bytes, object_key: str) -> TopicObject:
    """The topic object stored under `object_key`. Raises BadTopicObject."""
    def bad(why: str) -> BadTopicObject:
        return BadTopicObject(f"{object_key}: {why}")

    if len(data) > MAX_TOPIC_OBJECT_BYTES:
        raise bad(f"{len(data)} bytes, more than a topic object may hold ({MAX_TOPIC_OBJECT_BYTES})")
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"not UTF-8 JSON ({exc})") from None
    if not isinstance(document, dict):
        raise bad("not a JSON object")
    if document.get("format") != FORMAT:
        raise bad(f"format {document.get('format')!r}, not {FORMAT}")
    topic, partitions = document.get("topic"), document.get("partitions")
    config_text, created_ms = document.get("config_text"), document.get("created_ms")
    if not is_valid_topic_name(topic) or keys.parse_topic_key(object_key) != topic:
        raise bad(f"topic {topic!r} is not the one the key names")
    if type(partitions) is not int:
        raise bad(f"partitions {partitions!r} is not a number")
    try:
        validate_partition_count(partitions)
    except ValueError as exc:
        raise bad(str(exc)) from None
    if not isinstance(config_text, str):
        raise bad("config_text is not a string")
    if type(created_ms) is not int or created_ms < 0:
        raise bad(f"created_ms {created_ms!r} is not a time")
    return TopicObject(topic, partitions, config_text, created_ms)


async def put_topic_config(store: ObjectStore, topic: str, partitions: int, config_text: str,
                           created_at: datetime | None = None) -> bool:
    """Writes the topic's object (its catalog row). Logs a failure and returns False instead of raising."""
    created_at = created_at or datetime.now(timezone.utc)
    data = encode_topic_object(TopicObject(topic, partitions, config_text, int(created_at.timestamp() * 1000)))
    try:
        await store.put(keys.topic_key(topic), data, attribution=Attribution.topic(topic))
    except StoreError as exc:
        log.error("topic %s: could not store its config object (%s); it is written again at the next start", topic,
                  exc)
        return False
    return True


async def put_missing_topic_objects(store: ObjectStore, rows) -> int:
    """Writes the object of every catalog topic (`TopicRow`s) that has none in the store. Returns how many."""
    present: set[str] = set()
    try:
        async for info in store.list(keys.topics_prefix(), attribution=CATALOG):
            if (name := keys.parse_topic_key(info.object_key)) is not None:
                present.add(name)
    except StoreError as exc:
        log.error("could not list the topic objects (%s): written at the next start", exc)
        return 0
    missing = [row for row in rows if row.name not in present]
    done = await asyncio.gather(*(put_topic_config(store, r.name, r.partitions, r.config_text, r.created_at)
                                  for r in missing))
    if missing:
        log.info("wrote the config objects of %d topics that had none", sum(done))
    return sum(done)


async def read_topic_objects(store: ObjectStore, concurrency: int = 16) -> tuple[dict[str, TopicObject], list[str]]:
    """Every topic object in the store, by topic, and the problems found (each names its key)."""
    limit = asyncio.Semaphore(concurrency)
    problems: list[str] = []
    object_keys = [info.object_key async for info in store.list(keys.topics_prefix(), attribution=CATALOG)]

    async def read(object_key: str) -> TopicObject | None:
        if keys.parse_topic_key(object_key) is None:
            problems.append(f"{object_key}: not a topic object key")
            return None
        try:
            async with limit:
                return decode_topic_object(await store.get(object_key, attribution=CATALOG), object_key)
        except BadTopicObject as exc:
            problems.append(str(exc))
        except ObjectNotFound:
            pass  # deleted since the listing
        return None

    found = [t for t in await asyncio.gather(*(read(k) for k in object_keys)) if t is not None]
    return {t.topic: t for t in found}, problems
