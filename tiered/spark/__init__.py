"""tiered.spark: replaying a topic's history from the bucket, on Spark (docs/architecture.md "Replay on Spark").

    from tiered.spark import TieredDataSource
    spark.dataSource.register(TieredDataSource)
    spark.read.format("tiered").option("catalog", url).option("store", "s3://bucket/prefix").option("topic", t).load()

Modules: `planning` (catalog rows to splits) and `decoding` (bytes to Arrow) are pure; `listing` is the driver's
catalog side, `objects` and `execution` the executors' reads; `datasource` and `streaming` are the Spark glue, the
only modules that import pyspark (imported here on first use, so `tiered replay` runs without Spark); `snapshot`
takes the latest value per key, on a DataFrame (importing pyspark when called) or in `tiered replay`.
"""

__all__ = ["TieredDataSource", "TieredStreamReader"]


def __getattr__(name: str):
    if name == "TieredDataSource":
        from tiered.spark.datasource import TieredDataSource

        return TieredDataSource
    if name == "TieredStreamReader":
        from tiered.spark.streaming import TieredStreamReader

        return TieredStreamReader
    raise AttributeError(f"module 'tiered.spark' has no attribute {name!r}")
