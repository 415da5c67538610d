"""The known limitation, measured: a pass rewrites every file below the first uncleanable offset.

Kafka's cleaner recopies the whole clean section on every pass, even a clean
segment holding no key that the dirty section supersedes. For each pass the
sink made, this reads the log as it was just before the pass (the files a pass
removes stay on disk until a vacuum) and reports how many of the bytes the pass
read were clean, and how many clean files held no superseded key at all: the
bytes a pass that skipped such files would not have recopied.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sinks.log.log_table import LogTable
from sinks.log.segment import split_clean


def pass_recopy(log: LogTable, pass_version: int, first_dirty: dict, end: dict) -> dict[str, Any]:
    """Clean vs dirty input of the pass committed at ``pass_version`` (offsets per partition)."""
    before = log.snapshot(pass_version - 1)
    assert before is not None
    clean_bytes = dirty_bytes = clean_files = skippable_files = skippable_bytes = 0
    for partition, segments in before.segments.items():
        stop = end.get(partition, end.get(str(partition)))
        start = first_dirty.get(partition, first_dirty.get(str(partition)))
        if stop is None:
            continue
        read, _ = split_clean(segments, stop)
        clean, dirty = split_clean(read, start)
        clean_bytes += sum(s.size_bytes for s in clean)
        dirty_bytes += sum(s.size_bytes for s in dirty)
        clean_files += len(clean)
        if not clean:
            continue
        dirty_keys = pa.chunked_array(
            [_keys(log.uri, s.path) for s in dirty] or [pa.array([], pa.string())]
        ).unique()
        for s in clean:
            if not pc.any(pc.is_in(_keys(log.uri, s.path), value_set=dirty_keys)).as_py():
                skippable_files += 1
                skippable_bytes += s.size_bytes
    total = clean_bytes + dirty_bytes
    return {
        "clean_bytes_read": clean_bytes,
        "dirty_bytes_read": dirty_bytes,
        "clean_share_of_read": clean_bytes / total if total else 0.0,
        "clean_files_read": clean_files,
        "clean_files_without_superseded_key": skippable_files,
        "skippable_bytes": skippable_bytes,
    }


def _keys(uri: str, path: str) -> pa.Array:
    return pq.read_table(os.path.join(uri, path), columns=["key"]).column("key").combine_chunks()
