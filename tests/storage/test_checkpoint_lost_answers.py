"""The checkpoint table's commits when the store loses their answer (issue 21, point 4).

The commit's conditional PUT reaches the store, then the client gets a 500 or a reset
(`fault_proxy`'s ``-after`` faults); delta-rs's retry finds the version taken, by this very
commit. `checkpoints.keyed_table` recognises a landed write by the rows it wrote, so a
compare-and-set whose commit landed answers True, an upsert does not fail, and neither
is written twice. Spark-free: S3 (moto) behind the proxy.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from deltalake import DeltaTable
from fault_proxy import CONDITIONAL_PUT, FAULTS_AFTER, FaultProxy
from s3_server import BUCKET

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint
from sinks.log.foreign.commits import read_commit
from sinks.log.location import LogLocation
from sinks.log.store_options import delta_storage_options

CLIENT_OPTIONS = {"timeout": "5s", "connect_timeout": "2s", "max_retries": "4"}


@pytest.fixture
def proxy(s3_options) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3_options["AWS_ENDPOINT_URL"], seed=5, faults=FAULTS_AFTER).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def writes(uri: str, options: dict[str, str]) -> list[dict]:
    """The writes' commit info, read from the Delta log's files (delta-rs's ``history``
    lists with ``start-after``, which hangs against moto)."""
    infos = []
    for version in range(DeltaTable(uri, storage_options=options).version() + 1):
        actions = read_commit(LogLocation(uri, options), version) or []
        infos += [a["commitInfo"] for a in actions if "commitInfo" in a]
    return [i for i in infos if i.get("operation") == "WRITE"]


def test_a_compare_and_set_whose_answer_was_lost_counts_once(s3_options, proxy):
    uri = f"s3://{BUCKET}/lost-checkpoint"
    options = delta_storage_options(
        uri, {**s3_options, "AWS_ENDPOINT_URL": proxy.endpoint, **CLIENT_OPTIONS}
    )
    direct = delta_storage_options(uri, dict(s3_options))
    table = CleanerOffsetCheckpoint(uri, options)
    table.write([CheckpointEntry(log_path="lake/users", partition=0, first_dirty_offset=10)])
    row = table.read()[("lake/users", 0)]
    claim = row.with_changes(cleaner_state="in_progress", state_owner="me")

    proxy.set_rates({CONDITIONAL_PUT: 1.0})  # every commit lands and loses its answer
    try:
        assert table.compare_and_set(row, claim)
        claimed = table.read()[("lake/users", 0)]
        assert not table.compare_and_set(row, claim)  # the row is no longer the one read
        table.write([claimed.with_changes(cleaner_state="idle", first_dirty_offset=25)])
    finally:
        proxy.set_rates(0)
    assert sum(proxy.injected.values()) >= 2
    after = table.read()[("lake/users", 0)]
    assert (after.cleaner_state, after.first_dirty_offset) == ("idle", 25)
    assert (claimed.cleaner_state, claimed.state_owner) == ("in_progress", "me")
    assert DeltaTable(uri, storage_options=direct).to_pyarrow_table().num_rows == 1
    assert len(writes(uri, direct)) == 3  # the first write, the claim, the release: once each
