"""The cost meter's I/O: what the store's meter counted goes to the catalog's usage rows once a minute (and at
stop), and what the bucket holds per topic is read back for the `tiered_object_bytes_stored` gauge.

A failed flush puts what it took back into the meter, so the next one carries it: counts are lost only with the
process (at most a minute of them when it is killed). The pass runs under the broker's supervisor.
"""

from __future__ import annotations

from tiered.catalog import usage as catalog_usage
from tiered.clock import Clock, utc_now
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.objects.meter import Meter

FLUSH_INTERVAL_S = 60.0


class UsageFlush:
    def __init__(self, meter: Meter, catalog: AsyncCatalog, broker_id: int, clock: Clock):
        self.meter = meter
        self.catalog = catalog
        self.broker_id = broker_id
        self.clock = clock
        self.stored: dict[str, int] = {}  # bytes in the bucket per topic, as of the last pass

    async def flush(self) -> None:
        usage = self.meter.take_pending()
        if usage.empty():
            return
        try:
            await self.catalog.write(catalog_usage.add_usage, self.broker_id, usage.measures(),
                                     now=utc_now(self.clock))
        except BaseException:
            self.meter.restore(usage)
            raise

    async def run_pass(self) -> None:
        await self.flush()
        self.stored = await self.catalog.read(catalog_usage.bytes_stored)
