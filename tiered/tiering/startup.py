"""Start-up: the local disk reconciled with the catalog, partition by partition.

- a topic only on disk (e.g. a TANK data directory) is registered in the catalog; a topic only in the catalog that
  this broker leads (a pod on a new, empty volume) is recreated locally;
- the broker claims leadership of its partitions, which bumps their epochs and fences any older incarnation;
- records on disk past the catalog's high-water mark (acknowledged locally or not at all before a crash) are
  uploaded and committed before they become visible; a disk behind the catalog continues from the catalog's
  high-water mark, and older seqs are served from the bucket.
"""

from __future__ import annotations

import logging

from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import topics as catalog_topics
from tiered.catalog.errors import TopicExists
from tiered.tiering.topic_objects import put_missing_topic_objects

log = logging.getLogger("tiered.tiering")


async def reconcile_with_catalog(service) -> None:
    registry = service.broker.registry
    in_catalog = {t.name: t for t in await service.catalog.call(catalog_topics.list_topics)}
    states = {(s.topic, s.partition): s for s in await service.catalog.call(catalog_partitions.get_partition_states)}
    for name, topic in list(registry.topics.items()):
        if name not in in_catalog:
            log.info("registering local topic %s in the catalog", name)
            try:
                await service.catalog.call(catalog_topics.create_topic, name, len(topic.partitions), topic.config_text)
            except TopicExists:
                pass
            for p in range(len(topic.partitions)):
                states[(name, p)] = None
    for name, row in in_catalog.items():
        if name in registry.topics:
            continue
        leaders = {states[(name, p)].leader_broker for p in range(row.partitions) if states.get((name, p))}
        if leaders - {None, service.broker_id}:
            log.info("topic %s is led by broker(s) %s; not served here", name, sorted(leaders - {None}))
            continue
        log.info("recreating topic %s locally from the catalog (%d partitions)", name, row.partitions)
        registry.create_topic(name, row.partitions, row.config_text)
    await put_missing_topic_objects(service.store, await service.catalog.call(catalog_topics.list_topics))
    for topic in list(registry.topics.values()):
        await service.topic_opened(topic)
        for part in topic.partitions:
            resume_partition(service, part, states.get((part.topic, part.partition)))
            await service.copier.load_copied(part.topic, part.partition)
            for segment in part.log.segments:
                service._sealed(part, segment)

def resume_partition(service, part, state) -> None:
    hwmark = state.hwmark_seq if state is not None else 0
    first = state.first_available_seq if state is not None else 0
    plog = part.log
    local_last = plog.last_assigned
    if hwmark > local_last:
        log.info("%s/%d: the local disk ends at %d, the catalog at %d: continuing from the catalog",
                 part.topic, part.partition, local_last, hwmark)
        plog.ensure_next_seq(hwmark + 1)
    if first and (not plog.first_available or first < plog.first_available):
        part.remote_first_available = first
    part.remote_hwmark = hwmark
    if part.durable:
        plog.mark_visible(min(hwmark, plog.last_assigned))
    if local_last > hwmark:
        reupload_tail(service, part, hwmark + 1, local_last)

def reupload_tail(service, part, first_seq: int, last_seq: int) -> None:
    count = 0
    now = service.now_ms()
    for stored in part.log.iter_records(first_seq, last_seq):
        if stored.last_seq < first_seq:
            continue
        service.builder.add(part.topic, part.partition, stored.first_seq, stored.last_seq, stored.record, now)
        count += 1
    if count:
        log.info("%s/%d: uploading %d records past the catalog's high-water mark (%d..%d) before serving them",
                 part.topic, part.partition, count, first_seq, last_seq)
        service.kick()
