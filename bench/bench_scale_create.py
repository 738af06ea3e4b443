"""Creating partitions at scale (issue 28 goal 4): `python -m bench.bench_scale_idle --mode create`.

    python -m bench.bench_scale_create [--quick|--smoke] [--topics 25] [--partitions 4096] [--tree DIR]

Three `tiered serve` processes on one real PostgreSQL and a shared local-directory store; CreateTopic of `--topics`
durable topics of `--partitions` partitions each, one after the other, through the project's client: the time of
each answer (the creating broker answers once the topic is in the catalog, on its disk and claimed, and the other
brokers' claims landed or 5 s passed) and until every partition of every topic is claimed. Goals: 4,096 partitions
in <= 1 s, 100,000 across topics in <= 30 s.
"""

from __future__ import annotations

import sys

from bench import bench_scale_idle


def main(argv: list[str] | None = None) -> int:
    return bench_scale_idle.main(["--mode", "create", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
