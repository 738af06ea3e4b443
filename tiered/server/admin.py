"""The administrative requests: DiscoverPartitions, CreateTopic, ReloadConf, Status, DiscoverTopics, DiscoverTopology.

Where TANK has a bug we answer properly instead (docs/protocol.md §16): an explicit partition list in DiscoverPartitions
gets real ranges in standalone mode, and an unknown partition in that list is answered with the system-error reason
(0xfb: a definite "this partition cannot be served") instead of aborting the broker. ReloadConf re-reads the
partition's `config` file (TANK's rule and error codes) and applies it over the topic's layers, not instead of them.
"""

from __future__ import annotations

import logging

from tiered import metrics as m
from tiered.acl import Op
from tiered.catalog.errors import TopicExists as CatalogTopicExists
from tiered.protocol.codes import UINT64_MAX, CreateTopicStatus, DiscoverReason, ReloadConfStatus
from tiered.protocol.frame import MsgType
from tiered.protocol.requests import (
    CreateTopicRequest,
    DiscoverPartitionsRequest,
    DiscoverTopicsRequest,
    DiscoverTopologyRequest,
    ReloadConfRequest,
    StatusRequest,
)
from tiered.protocol.responses import (
    CreateTopicResponse,
    DiscoverPartitionsResponse,
    DiscoverTopicsResponse,
    DiscoverTopologyResponse,
    PartitionRange,
    ReloadConfResponse,
    StatusResponse,
    TopicInfo,
    encode_create_topic_response,
    encode_discover_partitions_response,
    encode_discover_topics_response,
    encode_discover_topology_response,
    encode_reload_conf_response,
    encode_status_response,
)
from tiered.server.leaders import redirect_endpoint
from tiered.server.registry import Role
from tiered.storage import topics as topic_dirs
from tiered.storage.topic_config import ConfigError

log = logging.getLogger("tiered.server")

TANK_VERSION = 400


class AdminHandler:
    def __init__(self, broker):
        self.broker = broker

    async def discover_partitions(self, conn, req: DiscoverPartitionsRequest) -> None:
        topic = self.broker.registry.topics.get(req.topic)
        ranges: list[PartitionRange] = []
        if topic is not None:
            wanted = range(len(topic.partitions)) if req.partitions is None else req.partitions
            for p in wanted:
                if 0 <= p < len(topic.partitions):
                    part = topic.partitions[p]
                    if part.role is not Role.LEADER and self.broker.tier.lower_tier:
                        # The leader's bounds are the exact ones: TANK's clients ask it (tiered.server.leaders).
                        self.broker.metrics.inc(m.REDIRECTS)
                        ranges.append(PartitionRange(UINT64_MAX, UINT64_MAX, DiscoverReason.NO_LEADER)
                                      if part.leader is None else
                                      PartitionRange(UINT64_MAX, UINT64_MAX, DiscoverReason.OTHER_LEADER,
                                                     redirect_endpoint(part.leader, conn.plaintext,
                                                                       self.broker.advertised_host)))
                        continue
                    bounds = part.bounds()
                    ranges.append(PartitionRange(bounds.first_available, bounds.hwmark))
                else:
                    ranges.append(PartitionRange(UINT64_MAX, UINT64_MAX, DiscoverReason.SYSTEM))
        payload = encode_discover_partitions_response(DiscoverPartitionsResponse(req.request_id, req.topic, tuple(ranges)))
        await conn.send(MsgType.DISCOVER_PARTITIONS, payload)

    async def create_topic(self, conn, req: CreateTopicRequest) -> None:
        status = await self._create_topic(conn, req)
        payload = encode_create_topic_response(CreateTopicResponse(req.request_id, req.topic, status))
        await conn.send(MsgType.CREATE_TOPIC, payload)

    async def _create_topic(self, conn, req: CreateTopicRequest) -> int:
        """Everything that can be refused is checked before anything is written (catalog or disk)."""
        broker = self.broker
        if broker.settings.read_only or not broker.access.allows(conn, Op.CREATE, req.topic):
            return CreateTopicStatus.READ_ONLY  # read-only, or the access rules refuse this client
        if not 1 <= req.partitions <= topic_dirs.MAX_PARTITIONS:
            log.info("create topic %s refused: %d partitions (1..%d allowed)", req.topic, req.partitions,
                     topic_dirs.MAX_PARTITIONS)
            return CreateTopicStatus.INVALID
        try:
            topic_dirs.validate_new_topic_name(req.topic)
        except ValueError as exc:
            log.info("create topic refused: %s", exc)
            return CreateTopicStatus.INVALID
        if req.topic in broker.registry.topics:
            return CreateTopicStatus.EXISTS
        try:
            config_text = bytes(req.config).decode("utf-8")
            broker.registry.topic_config(config_text)
        except (UnicodeDecodeError, ConfigError) as exc:
            log.info("create topic %s refused: bad config: %s", req.topic, exc)
            return CreateTopicStatus.BAD_CONFIG
        try:
            await broker.create_topic(req.topic, req.partitions, config_text)
        except (topic_dirs.TopicDirExists, CatalogTopicExists):
            return CreateTopicStatus.EXISTS
        except OSError as exc:
            log.error("create topic %s failed: %s", req.topic, exc)
            return CreateTopicStatus.SYSTEM
        log.info("created topic %s with %d partitions", req.topic, req.partitions)
        return CreateTopicStatus.OK

    async def reload_conf(self, conn, req: ReloadConfRequest) -> None:
        if not self.broker.access.allows(conn, Op.RELOAD, req.topic):
            status = ReloadConfStatus.UNKNOWN_TOPIC  # TANK's nearest refusal (tiered.server.access)
        else:
            status = self._reload(req)
        payload = encode_reload_conf_response(ReloadConfResponse(req.request_id, req.topic, req.partition, status))
        await conn.send(MsgType.RELOAD_CONF, payload)

    def _reload(self, req: ReloadConfRequest) -> int:
        registry = self.broker.registry
        topic = registry.topics.get(req.topic)
        if topic is None:
            return ReloadConfStatus.UNKNOWN_TOPIC
        part = registry.get(req.topic, req.partition)
        if part is None:
            return ReloadConfStatus.UNKNOWN_PARTITION
        try:
            values, _ = topic_dirs.read_partition_config(str(registry.data_dir), req.topic, req.partition)
            config = registry.topic_config(topic.config_text, values)
        except topic_dirs.PartitionConfigError as exc:
            log.info("reload %s/%d refused: %s", req.topic, req.partition, exc)
            return ReloadConfStatus.PARSE if exc.kind == "parse" else ReloadConfStatus.IO
        except ConfigError as exc:
            log.info("reload %s/%d refused: %s", req.topic, req.partition, exc)
            return ReloadConfStatus.PARSE
        part.reconfigure(config)  # a topic switched to durable acks shows only committed records from now on
        self.broker.tier.reconfigured(part.tp, config)
        log.info("reloaded config of %s/%d", req.topic, req.partition)
        return ReloadConfStatus.OK

    async def status(self, conn, req: StatusRequest) -> None:
        registry = self.broker.registry
        resp = StatusResponse(
            req.request_id,
            topics=len(registry.topics),
            partitions=registry.partition_count(),
            open_partitions=registry.partition_count(),
            open_partitions_time_ms=registry.open_time_ms,
            startup_ts=int(self.broker.started_at),
            version=TANK_VERSION,
        )
        await conn.send(MsgType.STATUS, encode_status_response(resp))

    async def discover_topics(self, conn, req: DiscoverTopicsRequest) -> None:
        topics = tuple(TopicInfo(t.name, True, len(t.partitions)) for t in self.broker.registry.topics.values())
        payload = encode_discover_topics_response(DiscoverTopicsResponse(req.request_id, topics))
        await conn.send(MsgType.DISCOVER_TOPICS, payload)

    async def discover_topology(self, conn, req: DiscoverTopologyRequest) -> None:
        payload = encode_discover_topology_response(DiscoverTopologyResponse(req.request_id))
        await conn.send(MsgType.DISCOVER_TOPOLOGY, payload)
