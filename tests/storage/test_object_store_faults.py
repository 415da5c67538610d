"""Object-store faults (issue 21, point 4): the sink on S3 behind a proxy that fails requests.

`fault_proxy.FaultProxy` sits between moto's S3 server and both of the sink's clients
(delta-rs for commits and log reads, pyarrow on the driver and the executors for
segments), and fails a share of every kind of request: 500, 503 SlowDown, held past
the client's timeout, reset, and 500 or reset *after* a PUT reached the store. The
sink appends (direct calls, cleaning inline), cleans, recovers and reads its state
through it. (Not ``vacuum``: delta-rs's listing of a log's ``_delta_log`` with
``start-after`` its newest version hangs against moto, with or without the proxy.) A call
that fails after the clients' retries is called again, as a query's restart would run the
batch again; then, with
the store healed: batches lost 0, duplicated 0 (offsets unique, state equal to a dict
replay of the input), orphan files 0 after the sink's recovery.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from fault_proxy import CONDITIONAL_PUT, FaultProxy
from s3_server import BUCKET

from sinks import CleanerConfig, CompactedStateSink, read_state
from sinks.log.store_options import delta_storage_options
from sinks.maintenance.file_inventory import list_data_files, referenced_paths
from sinks.maintenance.recovery import recover_log

T = TypeVar("T")
SCHEMA = "key string, value string, partition int"
CLIENT_OPTIONS = {"timeout": "3s", "connect_timeout": "2s", "max_retries": "4"}
"""Short client timeouts, so a held request costs seconds, and fewer retries than the
defaults, so faults sometimes outlast them. Most of these tests' time is one wait: delta-rs
(1.6.6) waits out the timeout on every try of ``alter.set_table_properties`` against moto,
with or without the proxy (no request reached a relay put in between), so the deletion's
alignment of the checkpoint table's properties costs timeout x (retries + 1) at each sink's
first maintenance, then fails (logged; nothing is deleted). 5 s made that 25 s, about five
times a run, with no fault injected."""
FAULTS = (*(("500", "503", "reset", "500-after", "reset-after") * 3), "timeout")
"""Each fault as likely as the others, but a held request (it costs the timeout) a third as."""
BATCHES = int(os.environ.get("FAULT_BATCHES", "2"))
RATE = float(os.environ.get("FAULT_RATE", "0.02"))
"""``make soak-faults`` runs more batches at a higher rate (the figures in docs/operations.md)."""


def progress(text: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def proxy(s3_options) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3_options["AWS_ENDPOINT_URL"], seed=21, hold_s=4, faults=FAULTS).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def options_through(proxy: FaultProxy, s3_options: dict[str, str], uri: str) -> dict[str, str]:
    options = {**s3_options, "AWS_ENDPOINT_URL": proxy.endpoint, **CLIENT_OPTIONS}
    return delta_storage_options(uri, options)


class Restarts:
    """Runs a call again after a failure, as a restarted query or job would; counts failures."""

    def __init__(self, attempts: int = 6) -> None:
        self.attempts = attempts
        self.failures: list[str] = []

    def run(self, call: Callable[[], T]) -> T:
        for attempt in range(self.attempts):
            try:
                return call()
            except Exception as e:  # any failure: the restart runs it again
                self.failures.append(f"{type(e).__name__}: {str(e)[:200]}")
                if attempt == self.attempts - 1:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")


def rows_of(batch_id: int) -> list[tuple[str, str | None, int]]:
    rows = [(f"k{(batch_id * 7 + i) % 40}", f"v{batch_id}-{i}", i % 3) for i in range(12)]
    rows = [(k, v, int(k[1:]) % 3) for k, v, _ in rows]
    if batch_id % 3 == 2:
        rows.append((f"k{batch_id % 40}", None, batch_id % 40 % 3))
    return rows


@pytest.mark.slow
def test_appends_passes_deletion_recovery_and_state_lose_nothing_under_faults(
    spark, s3_options, proxy
):
    uri = f"s3://{BUCKET}/faults"
    options = options_through(proxy, s3_options, uri)
    config = CleanerConfig(
        min_cleanable_dirty_ratio=0.3,
        delete_retention_ms=3_600_000,
        file_delete_delay_ms=1_000,
        log_retention_check_interval_ms=0,
    )
    expected: dict[str, str] = {}
    restarts = Restarts()
    proxy.set_rates(RATE)
    started = time.monotonic()
    sink = CompactedStateSink(uri, config=config, storage_options=options)
    for batch_id in range(BATCHES):
        rows = rows_of(batch_id)

        def append(rows=rows, batch_id=batch_id) -> None:
            # A restart builds a new sink object on the same path, as a new process would.
            CompactedStateSink(uri, config=config, storage_options=options)(
                spark.createDataFrame(rows, SCHEMA), batch_id
            )

        restarts.run(append)
        for key, value, _ in rows:
            if value is None:
                expected.pop(key, None)
            else:
                expected[key] = value
        if batch_id % 4 == 3 or batch_id == BATCHES - 1:
            restarts.run(lambda: sink.clean(force=True))
        progress(f"batch {batch_id} in; {sum(proxy.injected.values())} faults so far")
    state = restarts.run(lambda: {r.key: r.value for r in sink.state().collect()})
    arrow = restarts.run(lambda: read_state(uri, storage_options=options))
    faults = proxy.injected_by_kind()
    faulted_s = time.monotonic() - started

    proxy.set_rates(0)
    healed = CompactedStateSink(uri, config=config, storage_options=options)
    report = recover_log(
        healed.log_table,
        healed.checkpoints,
        file_delete_delay_ms=0,  # orphans of failed writes are deleted now, not in a window
        now_ms=int(time.time() * 1000) + 60_000,
    )
    offsets = [(r.partition, r.offset) for r in healed.log().collect()]
    snapshot = healed.log_table.snapshot()
    referenced = referenced_paths(healed.log_table, snapshot)
    orphans = [f.path for f in list_data_files(healed.log_table) if f.path not in referenced]
    print(
        f"\nfaults injected {dict(proxy.injected)}; by kind {faults}; requests "
        f"{dict(proxy.requests)}; calls failed past retries {len(restarts.failures)}; "
        f"orphans removed by recovery {len(report.orphans_removed)}, left {len(orphans)}; "
        f"offsets {len(offsets)} ({len(set(offsets))} distinct); {BATCHES} batches, "
        f"{faulted_s:.0f} s under faults; "
        f"failures: {restarts.failures}"
    )
    assert state == expected
    assert dict(zip(*arrow.select(["key", "value"]).to_pydict().values(), strict=True)) == expected
    assert len(offsets) == len(set(offsets))  # no batch written twice
    assert {r.key: r.value for r in healed.state().collect()} == expected
    assert orphans == []
    assert sum(faults.values()) > 0


@pytest.mark.slow
def test_commits_whose_answer_was_lost_count_once(spark, s3_options, proxy):
    """The nasty case: the commit's conditional PUT lands, the client gets a 500 or a reset."""
    uri = f"s3://{BUCKET}/lost-answers"
    options = options_through(proxy, s3_options, uri)
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, delete_retention_ms=3_600_000)
    sink = CompactedStateSink(uri, config=config, storage_options=options)
    expected: dict[str, str] = {}
    restarts = Restarts()
    proxy.faults = ("500-after", "reset-after")
    proxy.injected.clear()
    proxy.set_rates({CONDITIONAL_PUT: 0.5})
    try:
        for batch_id in range(3):
            rows = rows_of(batch_id)
            restarts.run(lambda rows=rows, b=batch_id: sink(spark.createDataFrame(rows, SCHEMA), b))
            expected.update({k: v for k, v, _ in rows if v is not None})
            for key in [k for k, v, _ in rows if v is None]:
                expected.pop(key, None)
        # A pass also makes several checkpoint-table commits; they recognise their own
        # landed commit too (`checkpoints.keyed_table`), so the same half rate holds.
        restarts.run(lambda: sink.clean(force=True))
    finally:
        proxy.set_rates(0)
        proxy.faults = FAULTS
    lost = dict(proxy.injected)
    offsets = [(r.partition, r.offset) for r in sink.log().collect()]
    print(f"\nlost answers {lost}; calls failed past retries {restarts.failures}")
    assert sum(lost.values()) > 0
    assert len(offsets) == len(set(offsets))  # no batch written twice
    assert {r.key: r.value for r in sink.state().collect()} == expected
