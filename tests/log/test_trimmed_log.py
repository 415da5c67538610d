"""A commit against a version the log has since moved past and trimmed.

Another writer commits, writes a Delta checkpoint and trims the commit files before it
(`testkit.checkpoint_and_trim`) while a snapshot is held. A commit that removes files is rebased
only over commits that removed none of them (design.md §34), which a trimmed commit can
no longer tell: the commit is refused as a conflict, and the caller plans again.
(A commit that only adds reads the log again: tests/produce/test_append_attempt.py.)
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from testkit import arrow_append, checkpoint_and_trim

from sinks import CleanerConfig, CompactedStateSink
from sinks.errors import ConcurrentCommitError
from sinks.log.log_table import LogTable


def test_a_commit_that_removes_files_is_not_rebased_over_commits_trimmed_since(lake):
    path = lake / "log"
    sink = CompactedStateSink(str(path), config=CleanerConfig(min_cleanable_dirty_ratio=1.0))
    arrow_append(sink, [("a", "1"), ("b", "2")], "key string, value string", 0)
    held = LogTable(str(path)).snapshot()
    [segment] = held.all_segments()
    other = LogTable(str(path))  # another writer removes the same file first, commits again
    other.snapshot().commit(removes=[segment], data_change=False, transactions={}, info={})
    other.snapshot().commit(data_change=False, transactions={}, info={})
    latest = checkpoint_and_trim(str(path))

    with pytest.raises(ConcurrentCommitError, match=f"version {held.version + 1} cannot be read"):
        held.commit(removes=[segment], data_change=False, transactions={}, info={"operation": "t"})
    assert DeltaTable(str(path)).version() == latest  # nothing committed: no second remove
