"""The broker's counters, declared once, and their Prometheus text exposition.

TANK's own names are kept (`tanksrv_topic_produced_bytes{m="<topic>"}`, `..._produced_msgs`, `..._consumed_bytes`,
the `tanksrv_topic_latency` histogram labelled `n="<topic>"`), so existing dashboards keep working; the tiering
counters are ours, under `tiered_`. Everything here is plain integers updated on the event loop: no locks.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from tiered import process_metrics
from tiered.protocol.bundle import NATIVE_SCAN
from tiered.storage.appender import NativeSegmentAppender, appender_class
from tiered.protocol.consume_response import ConsumeTopicResult

# Latency buckets in seconds, for produce acknowledgement latency per topic.
# A gauge's reading: one value, or one value per label set ({'m="orders"': 3.0}).
GaugeValue = float | dict[str, float]

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Histogram:
    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.total += seconds
        self.count += 1

    def quantile(self, q: float) -> float:
        """An upper bound of the q-quantile from the buckets (for logs and benchmarks)."""
        if not self.count:
            return 0.0
        target = q * self.count
        running = 0
        for i, n in enumerate(self.counts):
            running += n
            if running >= target:
                return LATENCY_BUCKETS_S[i] if i < len(LATENCY_BUCKETS_S) else float("inf")
        return float("inf")


@dataclass(frozen=True, slots=True)
class Counter:
    """A counter of ours: declared once here, with its meaning, and incremented by this object everywhere."""

    name: str
    help: str


@dataclass(frozen=True, slots=True)
class Timing:
    """A histogram of seconds, declared like a Counter."""

    name: str
    help: str


@dataclass(frozen=True, slots=True)
class Gauge:
    """A value read at scrape time from a function registered by the part that owns it."""

    name: str
    help: str


# Every counter and histogram of ours, with its meaning (docs/operations.md lists them too; a test compares). They
# are exported from the start, at 0: a series that appears only at its first increment hides that increment from
# rate() and increase(), so an alert on the first upload error would never fire. Counters that another part keeps
# (the object store's, the catalog's) are plain Counters, read at scrape time through `counter_fn`.
DECLARED_COUNTERS: list[Counter] = []
DECLARED_TIMINGS: list[Timing] = []


def _declare(name: str, help: str) -> Counter:
    counter = Counter(name, help)
    DECLARED_COUNTERS.append(counter)
    return counter


def _declare_timing(name: str, help: str) -> Timing:
    timing = Timing(name, help)
    DECLARED_TIMINGS.append(timing)
    return timing


BLOCKS_UPLOADED = _declare("tiered_blocks_uploaded_total", "blocks uploaded")
BLOCK_BYTES_UPLOADED = _declare("tiered_block_bytes_uploaded_total", "block bytes uploaded")
PUT_ERRORS = _declare("tiered_put_errors_total", "failed attempts to upload a block")
COMMIT_ERRORS = _declare("tiered_commit_errors_total", "failed attempts to commit a block to the catalog")
CATALOG_ERRORS = _declare("tiered_catalog_errors_total",
                         "failed catalog writes (block intent rows, segment copy states, pruning)")
ACK_TIMEOUTS = _declare("tiered_durable_ack_timeouts_total", "produce acks answered 0x03 (ack timeout): not committed within the ack timeout")
FENCED_PARTITIONS = _declare("tiered_fenced_partitions_total", "partitions fenced by a newer leader epoch")
SEGMENTS_COPIED = _declare("tiered_segments_copied_total", "sealed segments copied to the bucket")
SEGMENT_BYTES_COPIED = _declare("tiered_segment_bytes_copied_total", "segment and index bytes copied")
SEGMENT_COPY_FAILURES = _declare("tiered_segment_copy_failures_total",
                                 "segment copies that failed on a local file or were refused by the row of their base "
                                 "(the segment is tried again later)")
SEGMENT_UPLOAD_ERRORS = _declare("tiered_segment_upload_errors_total",
                                "failed attempts to upload a sealed segment or its index")
BLOCKS_DELETED = _declare("tiered_blocks_deleted_total", "block objects deleted after their grace period")
BLOCKS_ABANDONED = _declare("tiered_blocks_abandoned_total", "intent rows whose upload never committed")
RECONCILER_DELETIONS = _declare("tiered_reconciler_deletions_total",
                               "orphan objects the catalog did not know, deleted by the reconciler")
REMOTE_SEGMENTS_DELETED = _declare("tiered_remote_segments_deleted_total", "remote segments expired by remote retention")
ABANDONED_COPIES_DELETED = _declare("tiered_abandoned_copies_deleted_total",
                                    "copies left in COPY_STARTED under an older epoch, whose objects were deleted")
REMOTE_BYTES = _declare("tiered_remote_bytes_total", "bytes served from the bucket")
REMOTE_GETS = _declare("tiered_remote_gets_total", "range GETs by remote reads")
REMOTE_CATALOG_QUERIES = _declare("tiered_remote_catalog_queries_total", "catalog lookups by remote reads")
REMOTE_CACHE_HITS = _declare("tiered_remote_cache_hits_total", "remote reads served without a catalog lookup")
REMOTE_CACHE_MISSES = _declare("tiered_remote_cache_misses_total", "remote reads that needed a catalog lookup")
REMOTE_RUN_CACHE_HITS = _declare("tiered_remote_run_cache_hits_total",
                                "remote reads served from a cached block run (no GET)")
REMOTE_READ_AHEAD_HITS = _declare("tiered_remote_read_ahead_hits_total",
                                  "remote reads served by a range GET started ahead of them")
REMOTE_READ_AHEAD_DROPPED = _declare("tiered_remote_read_ahead_dropped_total",
                                     "range GETs read ahead that no fetch took in time")
REMOTE_MISSING_OBJECTS = _declare("tiered_remote_missing_objects_total",
                                 "objects the catalog names but the bucket lacks")

TASK_RESTARTS = _declare("tiered_task_restarts_total", "background tasks that died and were restarted")
TASK_FAILURES = _declare("tiered_task_failures_total", "failed runs of periodic background steps")
UNLOCATED_READS = _declare("tiered_unlocated_reads_total",
                           "consumes of a seq below the high-water mark that no tier holds (a bug: see the log)")
DISCONTINUOUS_COMMITS = _declare("tiered_discontinuous_commits_total",
                                 "block commits refused because they did not continue the catalog's high-water mark")
TAKEOVERS = _declare("tiered_takeovers_total", "partitions this broker claimed (a start, a takeover, a handover)")
HANDOVERS = _declare("tiered_handovers_total", "partitions this broker handed to another cleanly")
LEASE_RENEWAL_FAILURES = _declare("tiered_lease_renewal_failures_total", "membership lease renewals that failed")
BLOCKS_CLOSED_EARLY = _declare("tiered_blocks_closed_early_total",
                                "blocks closed before their age limit by the latency-first policy (block_linger_ms)")
REDIRECTS = _declare("tiered_redirects_total", "partitions answered 0xfc (led elsewhere) or 0xfd (no leader yet)")

COMPACTION_PASSES = _declare("tiered_compaction_passes_total", "key compaction passes over local segments")
COMPACTION_FAILURES = _declare("tiered_compaction_failures_total", "key compaction passes that failed")
COMPACTION_GROUPS = _declare("tiered_compaction_groups_total", "groups of segments compacted and swapped in")
COMPACTION_BYTES_BEFORE = _declare("tiered_compaction_bytes_before_total",
                                   "segment and index bytes of the groups compacted, before")
COMPACTION_BYTES_AFTER = _declare("tiered_compaction_bytes_after_total",
                                  "segment and index bytes of the groups compacted, after")
COMPACTION_TOMBSTONES_DROPPED = _declare("tiered_compaction_tombstones_dropped_total",
                                         "tombstones removed by compaction (superseded or past their retention)")
REMOTE_COMPACTION_GROUPS = _declare("tiered_remote_compaction_groups_total",
                                    "groups of remote segments replaced by compacted ones")
REMOTE_COMPACTION_BYTES_BEFORE = _declare("tiered_remote_compaction_bytes_before_total",
                                          "object and index bytes of the remote segments replaced")
REMOTE_COMPACTION_BYTES_AFTER = _declare("tiered_remote_compaction_bytes_after_total",
                                         "object and index bytes of the compacted remote segments")
REMOTE_COMPACTION_FAILURES = _declare("tiered_remote_compaction_failures_total",
                                      "remote compaction passes that failed (the bucket or the catalog)")

COMMIT_SECONDS = _declare_timing("tiered_commit_seconds", "block commit latency")
DURABLE_ACK_SECONDS = _declare_timing("tiered_durable_ack_seconds", "time from a block's first record to its commit")
LEASE_RENEWAL_SECONDS = _declare_timing("tiered_lease_renewal_seconds", "membership lease renewal latency")
COMPACTION_PASS_SECONDS = _declare_timing("tiered_compaction_pass_seconds", "duration of a key compaction pass")


# Read at scrape time.
STORE_PUTS = Counter("tiered_store_puts_total", "object store PUT requests")
STORE_GETS = Counter("tiered_store_gets_total", "object store GET requests")
STORE_ERRORS = Counter("tiered_store_errors_total", "object store request errors")
STORE_PUT_BYTES = Counter("tiered_store_put_bytes_total", "bytes uploaded")
CATALOG_STATEMENTS = Counter("tiered_catalog_statements_total", "SQL statements sent to the catalog")
REQUESTS_REFUSED = Counter("tiered_requests_refused_total",
                           "requests refused by the access rules, by operation (produce, consume, create, reload)")
# The cost meter (tiered/tiering/objects/meter.py): every object store request and its bytes, by topic; "(catalog)" is
# catalog-wide work. A request shared by the topics of a block counts a share to each, so the counts are floats.
OBJECT_REQUESTS = Counter("tiered_object_requests_total",
                          "object store requests by topic and operation (shared requests split by bytes)")
OBJECT_BYTES = Counter("tiered_object_bytes_total", "object store bytes by topic and direction (written or read)")
OBJECT_BYTES_STORED = Gauge("tiered_object_bytes_stored",
                            "bytes in the bucket by topic, from the catalog (segments and block runs)")
BLOCK_PENDING_BYTES = Gauge("tiered_block_pending_bytes", "bytes waiting for the next block")
BLOCKS_IN_FLIGHT = Gauge("tiered_blocks_in_flight", "blocks uploading or committing")
SEGMENTS_PENDING_UPLOAD = Gauge("tiered_segments_pending_upload", "sealed segments waiting to be copied")
UPLOAD_LAG_BYTES = Gauge("tiered_upload_lag_bytes", "bytes appended locally and not yet in the bucket")
REMOTE_READ_BYTES = Gauge("tiered_remote_read_bytes",
                          "memory of remote reads: range GET buffers and caches (within remote_read_budget_bytes)")
LEADERSHIPS = Gauge("tiered_leaderships", "partitions this broker leads")
PARTITIONS_DAMAGED = Gauge("tiered_partitions_damaged",
                           "partitions whose directory could not be opened at start or claim: opened again empty "
                           "(served=\"true\") or not served here (served=\"false\"); /readyz names them")
LEASE_HELD = Gauge("tiered_lease_held", "1 while this broker's membership lease is renewed in time (it may acknowledge)")
UPLOAD_LAG_SECONDS = Gauge("tiered_upload_lag_seconds", "age of the oldest record not yet committed to the bucket")
COMPACTION_RUNNING = Gauge("tiered_compaction_running", "1 while a key compaction pass runs")
COMPACTION_KEYS = Gauge("tiered_compaction_keys", "distinct keys kept by the latest compaction pass of each partition")
COMPACTION_TOMBSTONES = Gauge("tiered_compaction_tombstones",
                              "tombstones kept by the latest compaction pass of each partition")
NATIVE_SEGMENT_APPENDER = Gauge("tiered_native_segment_appender",
                                "1 when records are appended to segments by the native appender, 0 when by the "
                                "pure-Python reference (not built, or TIERED_PRODUCE_PATH=python)")
NATIVE_BUNDLE_SCAN = Gauge("tiered_native_bundle_scan", "1 when produce requests are read by the native extension, "
                           "0 when by the pure-Python fallback")
BUILD_INFO = Gauge("tiered_build_info", "always 1: the version, the Python and the native extensions in use, as labels")
PROCESS_CPU = Counter("process_cpu_seconds_total", "user and system CPU time spent, in seconds")
PROCESS_RESIDENT = Gauge("process_resident_memory_bytes", "resident memory size in bytes")
PROCESS_VIRTUAL = Gauge("process_virtual_memory_bytes", "virtual memory size in bytes")
PROCESS_START = Gauge("process_start_time_seconds", "start time of the process since the epoch, in seconds")
PROCESS_OPEN_FDS = Gauge("process_open_fds", "open file descriptors")
PROCESS_MAX_FDS = Gauge("process_max_fds", "the limit of open file descriptors")
GC_COLLECTIONS = Counter("python_gc_collections_total", "number of times this generation was collected")
GC_COLLECTED = Counter("python_gc_objects_collected_total", "objects collected during gc")
HEAP_FROZEN_OBJECTS = Gauge("tiered_heap_frozen_objects",
                            "long-lived objects set aside from the cyclic collector's full passes (tiered.heap)")
HEAP_SETTLES = Counter("tiered_heap_settles_total",
                       "times the long-lived objects were set aside after they grew (start-up, topics, claims)")



class Metrics:
    def __init__(self) -> None:
        self.produced_bytes: dict[str, int] = defaultdict(int)
        self.produced_msgs: dict[str, int] = defaultdict(int)
        self.consumed_bytes: dict[str, int] = defaultdict(int)
        self.latency: dict[str, Histogram] = defaultdict(Histogram)
        self.counters: dict[str, float] = defaultdict(float)
        self.histograms: dict[str, Histogram] = defaultdict(Histogram)
        # Gauges computed at scrape time: name -> (help, function returning value or {labels: value}).
        self.gauges: dict[str, tuple[str, Callable[[], GaugeValue]]] = {}
        self.counter_fns: dict[str, tuple[str, Callable[[], GaugeValue]]] = {}
        self.help: dict[str, str] = {}
        for counter in DECLARED_COUNTERS:
            self.counters[counter.name] = 0
            self.help[counter.name] = counter.help
        for timing in DECLARED_TIMINGS:
            self.histograms[timing.name] = Histogram()
            self.help[timing.name] = timing.help
        # An install without a C compiler runs the pure-Python reading of produce requests: correct, several times
        # slower per request. Exported so that such a deployment is seen, not guessed from its CPU.
        self.gauge(NATIVE_BUNDLE_SCAN, lambda: 1.0 if NATIVE_SCAN else 0.0)
        self.gauge(NATIVE_SEGMENT_APPENDER, lambda: 1.0 if appender_class() is NativeSegmentAppender else 0.0)
        self._process_families()

    def _process_families(self) -> None:
        from tiered import __version__

        labels = process_metrics.build_labels(__version__, NATIVE_SCAN)
        self.gauge(BUILD_INFO, lambda: {labels: 1.0})
        self.counter_fn(PROCESS_CPU, process_metrics.cpu_seconds)
        self.gauge(PROCESS_MAX_FDS, process_metrics.max_fds)
        self.counter_fn(GC_COLLECTIONS, lambda: process_metrics.gc_by_generation("collections"))
        self.counter_fn(GC_COLLECTED, lambda: process_metrics.gc_by_generation("collected"))
        memory = process_metrics.memory_bytes()
        if memory is not None:  # Linux: the families that need /proc
            self.gauge(PROCESS_RESIDENT, lambda: (process_metrics.memory_bytes() or (0.0, 0.0))[0])
            self.gauge(PROCESS_VIRTUAL, lambda: (process_metrics.memory_bytes() or (0.0, 0.0))[1])
            self.gauge(PROCESS_OPEN_FDS, lambda: process_metrics.open_fds() or 0.0)
            started = process_metrics.start_time_s()
            if started is not None:
                self.gauge(PROCESS_START, lambda: started)

    def produced(self, topic: str, size_bytes: int, messages: int) -> None:
        self.produced_bytes[topic] += size_bytes
        self.produced_msgs[topic] += messages

    def consumed(self, topics: Iterable[ConsumeTopicResult]) -> None:
        """Counts a consume response's chunk bytes per topic, from its partition results."""
        for topic in topics:
            for p in topic.partitions or ():
                self.consumed_bytes[topic.name] += p.chunk_len

    def ack_latency(self, topic: str, seconds: float) -> None:
        self.latency[topic].observe(seconds)

    def inc(self, counter: Counter, value: float = 1) -> None:
        self.counters[counter.name] += value
        self.help.setdefault(counter.name, counter.help)

    def observe(self, timing: Timing, seconds: float) -> None:
        self.histograms[timing.name].observe(seconds)
        self.help.setdefault(timing.name, timing.help)

    def count(self, counter: Counter) -> float:
        return self.counters.get(counter.name, 0)

    def gauge(self, gauge: Gauge, fn: Callable[[], GaugeValue]) -> None:
        self.gauges[gauge.name] = (gauge.help, fn)

    def counter_fn(self, counter: Counter, fn: Callable[[], GaugeValue]) -> None:
        """A counter kept elsewhere (e.g. the object store's own), read at scrape time: one value, or one per label
        set."""
        self.counter_fns[counter.name] = (counter.help, fn)

    def render(self) -> str:
        out: list[str] = []
        _family(out, "tanksrv_topic_produced_bytes", "counter", "bytes produced per topic",
                ((f'm="{_esc(t)}"', v) for t, v in sorted(self.produced_bytes.items())))
        _family(out, "tanksrv_topic_produced_msgs", "counter", "messages produced per topic",
                ((f'm="{_esc(t)}"', v) for t, v in sorted(self.produced_msgs.items())))
        _family(out, "tanksrv_topic_consumed_bytes", "counter", "bytes consumed per topic",
                ((f'm="{_esc(t)}"', v) for t, v in sorted(self.consumed_bytes.items())))
        out.append("# HELP tanksrv_topic_latency produce acknowledgement latency in seconds")
        out.append("# TYPE tanksrv_topic_latency histogram")
        for topic, hist in sorted(self.latency.items()):
            _histogram_lines(out, "tanksrv_topic_latency", hist, f'n="{_esc(topic)}",')
        for name, value in sorted(self.counters.items()):
            _family(out, name, "counter", self.help.get(name, name), (("", value),))
        for name, hist in sorted(self.histograms.items()):
            out.append(f"# HELP {name} {self.help.get(name, name)}")
            out.append(f"# TYPE {name} histogram")
            _histogram_lines(out, name, hist, "")
        for name, (help, fn) in sorted(self.counter_fns.items()):
            counted = fn()
            _family(out, name, "counter", help, counted.items() if isinstance(counted, dict) else (("", counted),))
        for name, (help, gauge_fn) in sorted(self.gauges.items()):
            reading = gauge_fn()
            samples: Iterable[tuple[str, float]] = reading.items() if isinstance(reading, dict) else (("", reading),)
            _family(out, name, "gauge", help, samples)
        return "\n".join(out) + "\n"


def _family(out: list[str], name: str, kind: str, help: str, samples: Iterable[tuple[str, float]]) -> None:
    out.append(f"# HELP {name} {help}")
    out.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        out.append(f"{name}{{{labels}}} {_num(value)}" if labels else f"{name} {_num(value)}")


def _histogram_lines(out: list[str], name: str, hist: Histogram, labels: str) -> None:
    running = 0
    for bound, n in zip(LATENCY_BUCKETS_S, hist.counts):
        running += n
        out.append(f'{name}_bucket{{{labels}le="{bound}"}} {running}')
    out.append(f'{name}_bucket{{{labels}le="+Inf"}} {hist.count}')
    bare = labels.rstrip(",")
    suffix = f"{{{bare}}}" if bare else ""
    out.append(f"{name}_sum{suffix} {_num(hist.total)}")
    out.append(f"{name}_count{suffix} {hist.count}")


def _num(value: float) -> str:
    if isinstance(value, float) and not value.is_integer():
        return repr(value)
    return str(int(value))


def labels(**values: str) -> str:
    """A label set as it is written in the exposition: `topic="orders",op="put"`."""
    return ",".join(f'{name}="{_esc(value)}"' for name, value in values.items())


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
