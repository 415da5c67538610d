"""Forgetting keys (design.md §54, §55): `tombstones` appends an erasure's tombstones once
and marks its partitions for cleaning; `erasure_status` reads every file under the log's
path for what is left of a key, and when each place goes by the log's config.
"""

from sinks.erasure.erasure_status import ErasureStatus, KeyErasure, Place, erasure_status
from sinks.erasure.tombstones import (
    ErasureReport,
    ErasuresAfter,
    erase,
    erase_dead_letters,
    erasures_after,
    vacuum_dead_letters,
)

__all__ = [
    "ErasureReport",
    "ErasureStatus",
    "ErasuresAfter",
    "KeyErasure",
    "Place",
    "erase",
    "erase_dead_letters",
    "erasure_status",
    "erasures_after",
    "vacuum_dead_letters",
]
