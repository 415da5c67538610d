"""Forgetting a key on an object store (design.md §54, §55; issue 64, point 4): the log on
S3 (moto), and the segment deleter's delete of a removed file failing in the middle.

The store is moto's S3 server in a process of its own (`s3_server.s3_server_process`: an
in-process server cannot answer while delta-rs's property alignment keeps the GIL), and
the deleter's requests go through `fault_proxy.FaultProxy`, which fails every DELETE
during one run. `erasure_status` then keeps naming the file whose delete failed, with its
deadline (passed), until a later run deletes it; then it says "none", and a scan of every
object under the log's path, listed from the store, every Parquet file decoded and every
other file read, finds no record of the key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fault_proxy import DELETE, FaultProxy
from s3_server import BUCKET, s3_server_process
from testkit import arrow_append

from sinks import CleanerConfig, CompactedStateSink, read_state
from sinks.log.location import LogLocation
from sinks.log.store_options import delta_storage_options

SCHEMA = "key string, value string, partition int"
ERASED = "erase-me-on-s3"
WINDOW_MS = 2_000  # the history window (wall time: the deleter compares storage's stamps)
RETENTION_MS = 3_600_000  # delete.retention.ms, on the sink's clock (the test moves it)
CLIENT_OPTIONS = {"timeout": "5s", "connect_timeout": "2s", "max_retries": "1"}
"""One retry: a DELETE the proxy fails costs two requests, not eleven."""


@pytest.fixture(scope="module")
def store() -> Iterator[dict[str, str]]:
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    with s3_server_process() as options:
        yield options


@pytest.fixture
def proxy(store) -> Iterator[FaultProxy]:
    proxy = FaultProxy(store["AWS_ENDPOINT_URL"], faults=("500",)).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def objects_naming(location: LogLocation, key: str) -> list[str]:
    """Every object under ``location`` whose bytes, or decoded Parquet values, hold ``key``:
    listed from the store, not from the Delta log."""
    fs, root = location.filesystem()
    found = []
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        with fs.open_input_file(info.path) as f:
            raw = f.read()
        hit = key.encode() in raw
        if not hit and info.path.endswith(".parquet"):
            with fs.open_input_file(info.path) as f:
                rows = pq.read_table(f).to_pylist()
            hit = key in json.dumps(rows, default=str)
        if hit:
            found.append(info.path[len(root) + 1 :])
    return found


def test_a_failed_delete_keeps_the_file_named_with_its_deadline_until_a_later_run_deletes_it(
    spark, store, proxy, clock_at
):
    uri = f"s3://{BUCKET}/erasure"
    config = CleanerConfig(
        min_cleanable_dirty_ratio=0.99,  # the erasure, not the ratio, makes the pass
        delete_retention_ms=RETENTION_MS,
        file_delete_delay_ms=WINDOW_MS,
        log_retention_check_interval_ms=3_600_000,  # only the explicit vacuum() deletes
    )
    clock = clock_at(int(time.time() * 1000))
    direct = delta_storage_options(uri, {**store, **CLIENT_OPTIONS})
    sink = CompactedStateSink(uri, config=config, storage_options=direct, clock=clock)
    kept = sorted(f"keep-{b}-{i}" for b in range(3) for i in range(4))
    for b in range(3):
        rows = [(f"keep-{b}-{i}", f"v{b}", i % 2) for i in range(4)] + [(ERASED, f"x{b}", 0)]
        arrow_append(sink, rows, SCHEMA, b, spark)
    sink.vacuum()  # aligns the window's table properties: the one call that keeps the GIL

    assert sink.erase(ERASED).tombstones == 1
    sink.clean()  # the erasure's pass: the key's older records leave the live log
    clock.advance(RETENTION_MS + 60_000)
    sink.clean()  # past the horizon: the tombstone goes
    assert sorted(read_state(uri, storage_options=direct).column("key").to_pylist()) == kept
    status = sink.erasure_status(ERASED)
    history = {p.path: p for p in status.keys[0].places if p.kind == "history segment"}
    assert history and all(p.goes_at_ms is not None for p in history.values())
    time.sleep(WINDOW_MS / 1000 + 0.3)
    clock.now = max(clock.now, int(time.time() * 1000))
    assert all(p.goes_at_ms < clock.now for p in history.values())  # past their deadline

    # The deleter's requests go through the proxy, which fails every DELETE of this run.
    faulty = delta_storage_options(
        uri, {**store, **CLIENT_OPTIONS, "AWS_ENDPOINT_URL": proxy.endpoint}
    )
    deleter = CompactedStateSink(uri, config=config, storage_options=faulty, clock=clock)
    proxy.set_rates({DELETE: 1.0})
    with pytest.raises(OSError):
        deleter.vacuum()
    proxy.set_rates(0)
    assert proxy.injected_by_kind().get(DELETE, 0) >= 1

    after_failure = sink.erasure_status(ERASED)
    assert not after_failure.gone
    still = {p.path: p for p in after_failure.keys[0].places if p.kind == "history segment"}
    assert set(history) <= set(still)  # none of the key's files was deleted
    for path, place in history.items():  # each still named with the deadline it had
        assert still[path].goes_at_ms == place.goes_at_ms < clock.now
    assert {p.path for p in after_failure.overdue()} >= set(history)  # ... now passed

    deleter.vacuum()  # a later run: deletes the files and trims the Delta log

    final = sink.erasure_status(ERASED)
    assert final.gone, [p.as_dict() for p in final.keys[0].places]
    assert final.delta_log_files_read > 0
    assert objects_naming(sink.log_table.location, ERASED) == []
    assert sorted(read_state(uri, storage_options=direct).column("key").to_pylist()) == kept
