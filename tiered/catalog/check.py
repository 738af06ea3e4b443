"""The catalog's consistency check (`tiered catalog check`): every acknowledged seq has exactly one location.

For each partition, every seq from its first available seq to its high-water mark must be answered for by exactly
one location: a readable (COPY_FINISHED) remote segment or a committed block run, each answering for
[from_seq, last_seq]. Reported as problems:
- a seq range no location answers for (a hole: a consumer there would be skipped past acknowledged messages);
- two locations answering for one seq (two segments, two runs, or a run a segment already holds);
- a location reaching past the high-water mark (committed seqs beyond what the catalog says is committed);
- a location with from_seq > first_seq or first_seq > last_seq;
- a run whose block row is missing or not `committed` (no foreign key holds block_runs to blocks: migration 0005).
The runs of unexpanded blocks (their runs packed in the block row, not yet in block_runs: tiered.catalog.blocks) are
locations like the others, read in the same snapshot: an expansion that put a run in both places, or a prune that
left one behind, shows as two locations.
Locations wholly below the first available seq are retention's leftovers, not problems. The walk reads every
readable segment and run row in pages, per partition, in seq order: its cost grows with the catalog, so it is an
operator's tool and a test oracle, never on a request path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from sqlalchemy import Connection, select

from tiered.catalog.blocks import pending_runs
from tiered.catalog.engine import Catalog
from tiered.catalog.models import BlockModel, BlockRunModel, PartitionModel, SegmentModel
from tiered.catalog.partitions import get_partition_states
from tiered.catalog.states import BlockState, SegmentState

PAGE = 5000


@dataclass(frozen=True, slots=True)
class Location:
    kind: str  # "segment" or "run"
    name: str  # the object key (and position of a run)
    from_seq: int
    first_seq: int
    last_seq: int
    problem: str = ""  # what is wrong with the row itself, whatever the seqs around it


@dataclass
class PartitionCheck:
    topic: str
    partition: int
    first_available: int
    hwmark: int
    locations: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass
class CheckReport:
    partitions: list[PartitionCheck] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [f"{p.topic}/{p.partition}: {problem}" for p in self.partitions for problem in p.problems]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_catalog(cat: Catalog, topic: str | None = None) -> CheckReport:
    """Checks every partition (of `topic`, or of all topics), each in one snapshot of the catalog: brokers may go on
    committing meanwhile."""
    report = CheckReport()
    for state in get_partition_states(cat, topic):
        report.partitions.append(check_partition(cat, state.topic, state.partition))
    return report


def check_partition(cat: Catalog, topic: str, partition: int) -> PartitionCheck:
    with cat.snapshot() as conn:
        state = conn.execute(
            select(PartitionModel.first_available_seq, PartitionModel.hwmark_seq)
            .where(PartitionModel.topic == topic, PartitionModel.partition == partition)
        ).one()
        locations = sorted(_locations(conn, topic, partition), key=lambda loc: (loc.from_seq, loc.last_seq))
    return _check(PartitionCheck(topic, partition, state.first_available_seq, state.hwmark_seq), locations)


def _check(result: PartitionCheck, locations: list[Location]) -> PartitionCheck:
    result.locations = len(locations)
    low, high = result.first_available, result.hwmark
    covered_to = low - 1 if low else 0  # the highest seq answered for so far, from `low` up
    previous: Location | None = None
    for loc in locations:
        if loc.problem:
            result.problems.append(f"{loc.kind} {loc.name}: {loc.problem}")
        if not loc.from_seq <= loc.first_seq <= loc.last_seq:
            result.problems.append(f"{loc.kind} {loc.name}: seqs from {loc.from_seq}, first {loc.first_seq}, "
                                   f"last {loc.last_seq} out of order")
            continue
        if loc.last_seq > high:
            result.problems.append(f"{loc.kind} {loc.name} holds seqs up to {loc.last_seq}, past the high-water "
                                   f"mark {high}")
        if low and loc.last_seq < low:
            continue  # wholly below the first available seq: retention's to remove
        if previous is not None and loc.from_seq <= previous.last_seq:
            both_from = max(loc.from_seq, low)
            result.problems.append(f"seqs {both_from}..{min(loc.last_seq, previous.last_seq)} have two locations: "
                                   f"{previous.kind} {previous.name} and {loc.kind} {loc.name}")
        elif low and loc.from_seq > covered_to + 1 and covered_to < high:
            result.problems.append(f"seqs {covered_to + 1}..{min(loc.from_seq - 1, high)} have no location")
        covered_to = max(covered_to, loc.last_seq)
        if previous is None or loc.last_seq > previous.last_seq:
            previous = loc
    if low and covered_to < high:
        result.problems.append(f"seqs {max(covered_to + 1, low)}..{high} have no location")
    if not low and high:
        result.problems.append(f"high-water mark {high} but no first available seq")
    return result


def _locations(conn: Connection, topic: str, partition: int) -> Iterator[Location]:
    yield from _segments(conn, topic, partition)
    yield from _runs(conn, topic, partition)
    for pending in pending_runs(conn, keys=((topic, partition),)):
        run = pending.run
        yield Location("run", f"{pending.object_key}@{run.position} (unexpanded)", run.from_seq, run.first_seq,
                       run.last_seq, "" if pending.block_state == BlockState.COMMITTED
                       else f"its block is {pending.block_state}, not committed")


def _segments(conn: Connection, topic: str, partition: int) -> Iterator[Location]:
    after = -1
    while True:
        rows = conn.execute(
            select(SegmentModel.base_seq, SegmentModel.from_seq, SegmentModel.last_seq, SegmentModel.object_key)
            .where(SegmentModel.topic == topic, SegmentModel.partition == partition, SegmentModel.base_seq > after,
                   SegmentModel.state == SegmentState.COPY_FINISHED)
            .order_by(SegmentModel.base_seq)
            .limit(PAGE)
        ).all()
        for base, from_seq, last, object_key in rows:
            yield Location("segment", object_key, from_seq, base, last)
        if len(rows) < PAGE:
            return
        after = rows[-1].base_seq


def _runs(conn: Connection, topic: str, partition: int) -> Iterator[Location]:
    runs = BlockRunModel
    after = (-1, -1)
    while True:
        later = (runs.last_seq > after[0]) | ((runs.last_seq == after[0]) & (runs.position > after[1]))
        rows = conn.execute(
            select(runs.last_seq, runs.position, runs.from_seq, runs.first_seq, runs.block_id, BlockModel.object_key,
                   BlockModel.state)
            .outerjoin(BlockModel, BlockModel.block_id == runs.block_id)
            .where(runs.topic == topic, runs.partition == partition, later)
            .order_by(runs.last_seq, runs.position)
            .limit(PAGE)
        ).all()
        for last, position, from_seq, first, block_id, object_key, state in rows:
            if object_key is None:
                yield Location("run", f"block {block_id}@{position}", from_seq, first, last, "its block row is missing")
            else:
                yield Location("run", f"{object_key}@{position}", from_seq, first, last,
                               "" if state == BlockState.COMMITTED else f"its block is {state}, not committed")
        if len(rows) < PAGE:
            return
        after = (rows[-1].last_seq, rows[-1].position)
