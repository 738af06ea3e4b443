"""`tiered replay`: Parquet to a directory and to S3, and produce into another broker's topic, seqs kept or not."""

from __future__ import annotations

import asyncio
import io

import pyarrow.parquet as pq
import pytest

from tiered.catalog import Catalog
from tiered.catalog import topics as catalog_topics
from tiered.catalog.migrate import upgrade
from tiered.cli.main import main
from tiered.client import Client
from tiered.server.app import App

from tests.spark.history import FileObjects, build_history
from tests.support.broker import local_settings

TOPIC = "events"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay-world")
    url = f"sqlite:///{root / 'catalog.db'}"
    upgrade(url)
    cat = Catalog.open(url)
    catalog_topics.create_topic(cat, TOPIC, 2)
    objects = FileObjects(root / "objects")
    histories = [build_history(cat, objects, TOPIC, p, root / f"log{p}", seed=30 + p, segments=2) for p in (0, 1)]
    yield url, objects, histories
    for h in histories:
        h.close()
    cat.close()


def table_rows(table) -> list[tuple]:
    micros = table.column("timestamp").cast("int64").to_pylist()
    return [(p, s, us // 1000, k, v) for p, s, us, k, v in zip(
        table.column("partition").to_pylist(), table.column("seq").to_pylist(), micros,
        table.column("key").to_pylist(), table.column("value").to_pylist())]


def expected(histories, partitions=(0, 1), keep=lambda m: True) -> list[tuple]:
    return [(p, m.seq, m.ts_ms, m.key, m.value) for p in partitions for m in histories[p].messages if keep(m)]


@pytest.mark.parametrize("decoder", ["native", "python"])
def test_parquet_export_to_a_directory_in_partition_and_seq_order(world, tmp_path, capsys, monkeypatch, decoder):
    monkeypatch.setenv("TIERED_SPARK_DECODER", decoder)
    url, objects, histories = world
    dest = tmp_path / "out"
    assert main(["replay", TOPIC, "--catalog", url, "--store", objects.url, "--parquet", str(dest),
                 "--max-split-bytes", "8KiB"]) == 0
    files = sorted(dest.iterdir())
    assert len(files) > 6 and all(f.name.startswith("part-") and f.suffix == ".parquet" for f in files)
    rows = [row for f in files for row in table_rows(pq.read_table(f))]
    assert rows == expected(histories)  # file names sort in (partition, seq) order
    assert "replayed" in capsys.readouterr().err
    # A destination holding files is refused, so two replays never mix.
    assert main(["replay", TOPIC, "--catalog", url, "--store", objects.url, "--parquet", str(dest)]) == 1
    assert "not empty" in capsys.readouterr().err


def test_parquet_export_of_a_time_range_to_s3(world, s3_endpoint, s3_bucket, s3_admin, monkeypatch):
    url, objects, histories = world
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    stamps = sorted(m.ts_ms for m in histories[1].messages)
    start, end = stamps[len(stamps) // 5], stamps[len(stamps) // 2]
    assert main(["replay", TOPIC, "--catalog", url, "--store", objects.url, "--partitions", "1", "--s3-path-style",
                 "--starting-timestamp", str(start), "--ending-timestamp", str(end),
                 "--parquet", f"s3://{s3_bucket}/exports/run1"]) == 0
    listed = s3_admin.list_objects_v2(Bucket=s3_bucket, Prefix="exports/run1/")["Contents"]
    rows = []
    for item in sorted(listed, key=lambda i: i["Key"]):
        body = s3_admin.get_object(Bucket=s3_bucket, Key=item["Key"])["Body"].read()
        rows += table_rows(pq.read_table(io.BytesIO(body)))
    assert rows == expected(histories, [1], lambda m: start <= m.ts_ms < end)


def test_bad_arguments_fail_with_one_line(world, tmp_path, capsys):
    url, objects, _ = world
    for extra, text in ((["--partitions", "4"], "no partition 4"), (["--starting-seq", "x"], "startingSeq"),
                        (["--keep-seqs"], "--keep-seqs goes with --to-topic")):
        code = main(["replay", TOPIC, "--catalog", url, "--store", objects.url, "--parquet", str(tmp_path / "o"),
                     *extra])
        assert code in (1, 2)
        assert text in capsys.readouterr().err
    assert main(["replay", "nope", "--catalog", url, "--store", objects.url, "--parquet", str(tmp_path / "o")]) == 1
    assert "not in the catalog" in capsys.readouterr().err


async def test_produce_into_another_broker_keeping_seqs_or_not(world, tmp_path):
    url, objects, histories = world
    app = App(local_settings(tmp_path / "target"), local_only=True)
    await app.start()
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as client:
            await client.create_topic("copy", 2)
            await client.create_topic("renumbered", 2)
        port = str(app.broker.port)
        first = histories[0].messages[30].seq
        assert await asyncio.to_thread(main, [
            "replay", TOPIC, "--catalog", url, "--store", objects.url, "--to-broker", f"127.0.0.1:{port}",
            "--to-topic", "copy", "--keep-seqs", "--starting-seq", str(first), "--bundle-size", "100",
        ]) == 0
        assert await asyncio.to_thread(main, [
            "replay", TOPIC, "--catalog", url, "--store", objects.url, "--to-broker", f"127.0.0.1:{port}",
            "--to-topic", "renumbered", "--partitions", "1",
        ]) == 0
        async with await Client.connect("127.0.0.1", app.broker.port) as client:
            for p in (0, 1):
                copied = [(p, m.seq, m.ts_ms, m.key, m.value) async for m in client.drain("copy", p, 0)]
                assert copied == expected(histories, [p], lambda m: m.seq >= first)
            renumbered = [m async for m in client.drain("renumbered", 1, 0)]
            assert [m.seq for m in renumbered] == list(range(1, len(histories[1].messages) + 1))
            assert [(m.ts_ms, m.key, m.value) for m in renumbered] == [
                (m.ts_ms, m.key, m.value) for m in histories[1].messages]
            assert not [m async for m in client.drain("renumbered", 0, 0)]
    finally:
        await app.stop()


def test_keeping_seqs_into_a_partition_already_past_them_stops_at_the_first_refusal(world, tmp_path, capsys):
    async def scenario() -> int:
        url, objects, histories = world
        app = App(local_settings(tmp_path / "target"), local_only=True)
        await app.start()
        try:
            async with await Client.connect("127.0.0.1", app.broker.port) as client:
                await client.create_topic("taken", 2)
                await client.produce_with_seqnum("taken", 0, [histories[0].messages[-1]])
            return await asyncio.to_thread(main, [
                "replay", TOPIC, "--catalog", url, "--store", objects.url, "--partitions", "0", "--keep-seqs",
                "--to-broker", f"127.0.0.1:{app.broker.port}", "--to-topic", "taken",
            ])
        finally:
            await app.stop()

    assert asyncio.run(scenario()) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    first = world[2][0].messages[0].seq
    assert f"taken/0 refused seqs {first}.." in err and "replay into a new topic, or without --keep-seqs" in err


def test_replay_is_registered_in_the_cli():
    from tiered.cli.main import build_parser

    assert build_parser().parse_args(["replay", "t", "--parquet", "x"]).func.__name__ == "cmd_replay"
