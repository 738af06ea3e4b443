"""`tiered status`: the broker's Status response (0x0a)."""

from __future__ import annotations

import time

from tiered.cli.common import add_broker_argument, connect, run


def register(sub) -> None:
    p = sub.add_parser("status", help="the broker's status")
    add_broker_argument(p)
    p.set_defaults(func=lambda a: run(status(a), "status"))


async def status(args) -> int:
    async with await connect(args) as client:
        s = await client.status()
        answered = client.router.home  # the broker of the list that answered (the first reachable one)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(s.startup_ts)) if s.startup_ts else "unknown"
    print(f"broker {answered}\nversion {s.version // 100}.{s.version % 100}\ntopics {s.topics}\npartitions {s.partitions}\n"
          f"open partitions {s.open_partitions} (opened in {s.open_partitions_time_ms} ms)\nstarted {started}\n"
          f"cluster aware {'yes' if s.cluster_aware else 'no'}")
    return 0
