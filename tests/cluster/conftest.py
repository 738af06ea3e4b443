"""Several brokers as one service: broker processes on 127.0.0.1 ports sharing one PostgreSQL catalog and one moto
bucket, each on its own data directory, as an operator runs them."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tiered.catalog import Catalog
from tiered.catalog import cluster as catalog_cluster
from tiered.catalog.check import check_catalog

from tests.support.broker import BrokerProcess

LEASE_MS = 2000  # short, so that takeovers happen within a test's patience


class Cluster:
    def __init__(self, root: Path, catalog_url: str, store_url: str, s3_endpoint: str):
        self.root = root
        self.catalog_url = catalog_url
        self.store_url = store_url
        self.s3_endpoint = s3_endpoint
        self.brokers: dict[int, BrokerProcess] = {}
        self.retired: list[BrokerProcess] = []

    def start(self, broker_id: int, *extra: str, lease_ms: int = LEASE_MS, disk: str | None = None) -> BrokerProcess:
        """Broker `broker_id` on `disk` (default: its own, kept across restarts)."""
        flags = ("--catalog", self.catalog_url, "--store", self.store_url, "--s3-path-style", "--broker-id",
                 str(broker_id), "--cluster-lease-ms", str(lease_ms), "--block-max-age-ms", "50",
                 "--shutdown-timeout-s", "10", *extra)
        bp = BrokerProcess(self.root / (disk or f"disk{broker_id}"), *flags,
                           env={"AWS_ENDPOINT_URL": self.s3_endpoint})
        old = self.brokers.pop(broker_id, None)
        if old is not None:
            self.retired.append(old)
        self.brokers[broker_id] = bp
        return bp.start()

    def start_all(self, broker_ids: range | list[int]) -> list[BrokerProcess]:
        """Several brokers at once, each as `start` starts it: their start-ups overlap (a start is mostly the process's
        imports and its first catalog statements, and waiting for its first ping), and they join in whatever order
        they come up, as a service's brokers do."""
        ids = list(broker_ids)
        with ThreadPoolExecutor(len(ids)) as pool:
            return list(pool.map(self.start, ids))

    def endpoint(self, broker_id: int) -> tuple[str, int]:
        return "127.0.0.1", self.brokers[broker_id].port

    def kill(self, broker_id: int) -> None:
        self.brokers[broker_id].kill()

    def stop(self, broker_id: int, timeout_s: float = 30.0) -> int:
        """SIGTERM: a graceful stop, with handovers."""
        return self.brokers[broker_id].terminate(timeout_s)

    def pause(self, broker_id: int) -> None:
        self.brokers[broker_id].proc.send_signal(signal.SIGSTOP)

    def resume(self, broker_id: int) -> None:
        self.brokers[broker_id].proc.send_signal(signal.SIGCONT)

    def catalog(self) -> Catalog:
        return Catalog.open(self.catalog_url)

    def leaders(self, topic: str) -> dict[int, int | None]:
        with self.catalog() as cat:
            return {a.partition: a.leader_broker for a in catalog_cluster.assignments(cat, topic)}

    def assignments(self, topic: str) -> list[catalog_cluster.Assignment]:
        with self.catalog() as cat:
            return catalog_cluster.assignments(cat, topic)

    def wait_for_leaders(self, topic: str, among: set[int], timeout_s: float = 20.0) -> dict[int, int]:
        """Waits until every partition is led (claimed, epoch past 0) by a broker of `among`."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.assignments(topic)
            if rows and all(a.leader_broker in among and a.leader_epoch > 0 for a in rows):
                return {a.partition: a.leader_broker for a in rows}
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: leaders not among {among} within {timeout_s} s: {rows}")
            time.sleep(0.1)

    def check(self, topic: str | None = None) -> None:
        """The catalog's consistency check: every seq from first available to the high-water mark has exactly one
        location."""
        with self.catalog() as cat:
            report = check_catalog(cat, topic)
        assert report.ok, report.problems

    def stop_all(self) -> None:
        for bp in [*self.brokers.values(), *self.retired]:
            if bp.proc is not None and bp.proc.poll() is not None:
                continue
            try:
                bp.proc.send_signal(signal.SIGCONT)
            except (OSError, AttributeError):
                pass
            bp.kill()

    def logs(self) -> str:
        current = [(f"broker {bid}", bp) for bid, bp in self.brokers.items()]
        retired = [(f"broker process {bp.port} (replaced)", bp) for bp in self.retired]
        return "\n".join(f"--- {name} ---\n{bp.output()[-4000:]}" for name, bp in current + retired)


@pytest.fixture
def cluster(tmp_path, pg_url, s3_endpoint, s3_bucket):
    c = Cluster(tmp_path, pg_url, f"s3://{s3_bucket}/cluster", s3_endpoint)
    yield c
    c.stop_all()
