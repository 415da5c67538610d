"""What lookups keep of each data file between calls: its footer, key filters, page reader.

A lookup on a 1e7-key log with a dirty region asks some 80 files whether they hold a key;
reading each one's footer and filter again at every call costs more than the answer
(design.md §38). A data file of a Delta table never changes once written: a commit adds
files under new names and removes files, it never rewrites one. So what a lookup read of
a file stays true for as long as the file lives, and `FileCache` keeps it for the next
lookup in this process, whichever snapshot or version asks: the parsed footer, each key
filter's bitset (or, of a large filter read block by block, its header), the page reader.
An entry is found by the file's full location and its size, so a file removed and another
written under the same name (which the sink never does) is not mistaken for it unless it
has the very same size. A file no longer live is simply never asked for again and leaves
the cache as less recently used entries come in; the cache holds at most `max_bytes` of
what it estimates it keeps (the least recently used file goes first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.parquet as pq

# What a process keeps for lookups: enough for a 1e7-key log's filters (about 20 MiB)
# many times over, small against a service's memory.
LOOKUP_CACHE_BYTES = 256 << 20
# A parsed footer weighs several times its serialized bytes (Python and C++ objects).
_FOOTER_WEIGHT = 8


@dataclass
class FileFacts:
    """What is known of one data file: filled in as lookups read it. Not locked: two
    lookups filling the same fact at once both read it and one copy is kept."""

    metadata: pq.FileMetaData | None = None
    # key columns -> per row group, (column, physical type, filter offset) of its filters
    key_chunks: dict[tuple[str, ...], list[list[tuple[str, str, int]]]] = field(
        default_factory=dict
    )
    # filter offset -> the bitset as 8-word blocks (uint32 [n, 8]), None when unreadable
    filters: dict[int, np.ndarray | None] = field(default_factory=dict)
    # filter offset -> (header bytes, bitset bytes), None when not a filter a lookup reads
    headers: dict[int, tuple[int, int] | None] = field(default_factory=dict)
    # the page reader (`sinks.reading.parquet_pages.PageReader`), None when the file has
    # none; absent until parsed
    pages: dict[str, Any] = field(default_factory=dict)
    column_reads: int = 0  # how many lookups read its columns other than the key


class FileCache:
    """`FileFacts` per data file (its location and size), at most ``max_bytes`` of them
    by estimate, least recently used out first. Thread-safe."""

    def __init__(self, max_bytes: int = LOOKUP_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, int], FileFacts] = OrderedDict()
        self._weights: dict[tuple[str, int], int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def facts(self, location: str, size: int) -> FileFacts:
        """The facts kept of the file at ``location`` of ``size`` bytes (new and empty the
        first time); marks it as just used."""
        key = (location, size)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = FileFacts()
                self._weights[key] = 0
            else:
                self._entries.move_to_end(key)
            return entry

    def charge(self, location: str, size: int, nbytes: int) -> None:
        """Count ``nbytes`` more kept for the file, and drop the least recently used files
        (never this one) while the cache holds more than ``max_bytes``."""
        key = (location, size)
        with self._lock:
            if key not in self._weights:
                return  # dropped meanwhile: what the caller holds goes with its entry
            self._weights[key] += nbytes
            self._total += nbytes
            while self._total > self.max_bytes and len(self._entries) > 1:
                oldest = next(iter(self._entries))
                if oldest == key:
                    self._entries.move_to_end(key)
                    oldest = next(iter(self._entries))
                del self._entries[oldest]
                self._total -= self._weights.pop(oldest)

    @property
    def kept_bytes(self) -> int:
        """What the cache holds now, by its estimate."""
        return self._total

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every file: the next lookup reads footers and filters again."""
        with self._lock:
            self._entries.clear()
            self._weights.clear()
            self._total = 0


def footer_weight(metadata: pq.FileMetaData) -> int:
    """What keeping ``metadata`` is counted as, in bytes (an estimate)."""
    return _FOOTER_WEIGHT * int(metadata.serialized_size)


LOOKUP_FILES = FileCache()
"""The process's cache for `sinks.lookup`: what lookups read of a file is kept for the next."""
