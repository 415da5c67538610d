"""How deep ``sink.clean(force=True)`` and one append go to their commits.

Run: ``python -m bench.call_depth [--json FILE]``.

On a small dirty log (two partitions of six keys, batches appended through the sink from a
local Spark session, cleaned once), the script profiles two calls with ``sys.setprofile`` (and
``threading.setprofile`` for the threads they start):

- ``sink(batch_df, batch_id)``, one append (``cleaning="inline"``, a dirty ratio the append
  never reaches: no pass after it), and
- ``sink.clean(force=True)``, one round and its pass.

For each call it reports every commit the call made through delta-rs (a call into the
``deltalake`` package that writes a Delta log: ``create_write_transaction``,
``write_deltalake``, ...), with the table it went to and the stack from the sink's method
down to the repository frame that called delta-rs: how many frames, over how many
repository modules. Then the repository modules touched during the whole call (any frame
run, on any thread the call started), the calls of ``LogTable.snapshot`` (those that read
the Delta log, and those served from the cache) and every Delta table opened.

The scenario runs twice on two logs, the first time unprofiled, so that no module is
imported during the profiled calls. Spark's Python workers run in other processes and are
not seen. Figures are deterministic for a given code base; they change when the code does.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sinks", "checkpoints", "streaming")

COMMITS = {
    "create",
    "create_write_transaction",
    "write_deltalake",
    "restore",
    "set_table_properties",
    "execute",
    "delete",
    "update",
    "compact",
    "z_order",
    "vacuum",
    "create_checkpoint",
    "cleanup_metadata",
}
"""The ``deltalake`` functions that write to a Delta log, by name."""


def repository_module(frame: FrameType) -> str | None:
    """The dotted module of ``frame`` when it runs the library's code, else None."""
    path = Path(frame.f_code.co_filename)
    try:
        parts = path.resolve().relative_to(ROOT).with_suffix("").parts
    except ValueError:
        return None
    if not parts or parts[0] not in PACKAGES:
        return None
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_deltalake(frame: FrameType) -> bool:
    return f"{Path('/deltalake/')}/" in frame.f_code.co_filename


def qualname(frame: FrameType) -> str:
    return getattr(frame.f_code, "co_qualname", frame.f_code.co_name)


@dataclass
class Commit:
    """One call into delta-rs that writes a Delta log, and the stack that led to it."""

    call: str
    table: str
    frames: list[str]  # module:qualname, from the sink's method down to delta-rs's caller

    @property
    def modules(self) -> list[str]:
        return list(dict.fromkeys(f.split(":")[0] for f in self.frames))


@dataclass
class Profile:
    """What one profiled call did."""

    entry: str  # the qualname of the sink's method the stacks start from
    tables: dict[str, str]  # uri -> name in the report
    commits: list[Commit] = field(default_factory=list)
    modules: set[str] = field(default_factory=set)
    snapshot_calls: list[list[Any]] = field(default_factory=list)  # [caller, read]
    tables_opened: dict[str, int] = field(default_factory=dict)
    _open_snapshots: dict[int, list[Any]] = field(default_factory=dict)

    def event(self, frame: FrameType, event: str, _arg: object) -> None:
        if event == "return":
            self._open_snapshots.pop(id(frame), None)
            return
        if event != "call":
            return
        module = repository_module(frame)
        if module is not None:
            self.modules.add(module)
            if qualname(frame) == "LogTable.snapshot":
                caller = frame.f_back
                call = [qualname(caller) if caller is not None else "?", False]
                self.snapshot_calls.append(call)
                self._open_snapshots[id(frame)] = call
            return
        if not is_deltalake(frame):
            return
        caller = frame.f_back
        if caller is None or is_deltalake(caller):
            return
        if qualname(frame) == "DeltaTable.__init__":
            uri = str(frame.f_locals.get("table_uri", "?"))
            name = self.name_of(uri)
            self.tables_opened[name] = self.tables_opened.get(name, 0) + 1
            reader = _nearest(frame, lambda f: qualname(f) == "LogTable.snapshot")
            if reader is not None and id(reader) in self._open_snapshots:
                self._open_snapshots[id(reader)][1] = True
            return
        if frame.f_code.co_name in COMMITS:
            self.commits.append(
                Commit(frame.f_code.co_name, self.table_of(frame), self.stack_to(caller))
            )

    def stack_to(self, caller: FrameType) -> list[str]:
        """The repository frames from the entry's frame down to ``caller``, top first."""
        frames: list[str] = []
        current: FrameType | None = caller
        while current is not None:
            module = repository_module(current)
            if module is not None:
                frames.append(f"{module}:{qualname(current)}")
            if qualname(current) == self.entry and module == "sinks.sink":
                return frames[::-1]
            current = current.f_back
        return frames[::-1]  # another thread's commit: its whole stack

    def table_of(self, frame: FrameType) -> str:
        local = frame.f_locals
        target = local.get("table_uri") or local.get("table_or_uri") or local.get("self")
        uri = getattr(target, "table_uri", target)
        return self.name_of(str(uri))

    def name_of(self, uri: str) -> str:
        for known, name in self.tables.items():
            if uri.rstrip("/").endswith(known.rstrip("/").split("://")[-1]):
                return name
        return uri.rsplit("/", 1)[-1]

    def summary(self) -> dict[str, Any]:
        return {
            "commits": [
                {
                    "call": c.call,
                    "table": c.table,
                    "frames": len(c.frames),
                    "modules": len(c.modules),
                    "stack": c.frames,
                }
                for c in self.commits
            ],
            "modules_touched": len(self.modules),
            "modules": sorted(self.modules),
            "snapshot_calls": [
                {"caller": caller, "read": read} for caller, read in self.snapshot_calls
            ],
            "snapshot_reads": sum(1 for _, read in self.snapshot_calls if read),
            "tables_opened": self.tables_opened,
        }


def _nearest(frame: FrameType, match: Callable[[FrameType], bool]) -> FrameType | None:
    current = frame.f_back
    while current is not None and not match(current):
        current = current.f_back
    return current


def profiled(profile: Profile, call: Callable[[], object]) -> None:
    """Run ``call`` with ``profile`` hearing every Python call, on this thread and new ones."""
    threading.setprofile(profile.event)
    sys.setprofile(profile.event)
    try:
        call()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def rows(batch_id: int) -> list[tuple[str, str, int]]:
    """A batch of twelve records over six keys per partition, every key updated each batch."""
    return [(f"k{p}.{n}", f"v{batch_id}.{n}", p) for p in (0, 1) for n in range(6)]


def scenario(spark: Any, directory: Path, *, measure: bool) -> dict[str, Any]:
    """A log in steady state (three batches, a forced round, a fourth batch), then a fifth
    batch (profiled) and a forced round (profiled)."""
    from sinks import CleanerConfig, CompactedStateSink

    path = str(directory / "log")
    never = CleanerConfig(min_cleanable_dirty_ratio=1.0)  # only the forced rounds clean
    sink = CompactedStateSink(path, config=never, cleaning="inline")
    tables = {sink.path: "log", sink.checkpoint_path: "checkpoint table"}

    def frame(batch_id: int) -> Any:
        schema = "key string, value string, partition int"
        return spark.createDataFrame(rows(batch_id), schema).coalesce(1)

    for batch_id in range(3):
        sink(frame(batch_id), batch_id)
    sink.clean(force=True)  # creates the checkpoint table; the log records its cleaner offsets
    sink(frame(3), 3)
    fifth = frame(4)
    append = Profile("CompactedStateSink.__call__", tables)
    clean = Profile("CompactedStateSink.clean", tables)
    stats: list[object] = []
    if measure:
        profiled(append, lambda: sink(fifth, 4))
        profiled(clean, lambda: stats.append(sink.clean(force=True)))
    else:
        sink(fifth, 4)
        stats.append(sink.clean(force=True))
    assert stats[0] is not None, "the forced round ran no pass"
    return {"append": append.summary(), "clean(force=True)": clean.summary()}


def report(figures: dict[str, Any]) -> str:
    lines = []
    for call, profile in figures.items():
        lines.append(f"{call}:")
        for commit in profile["commits"]:
            lines.append(
                f"  commit to the {commit['table']} ({commit['call']}): "
                f"{commit['frames']} frames over {commit['modules']} modules"
            )
            lines.extend(f"    {frame}" for frame in commit["stack"])
        lines.append(f"  commits: {len(profile['commits'])}")
        lines.append(f"  repository modules touched: {profile['modules_touched']}")
        calls = profile["snapshot_calls"]
        reads = profile["snapshot_reads"]
        lines.append(
            f"  LogTable.snapshot calls: {len(calls)} ({reads} read the Delta log, "
            f"{len(calls) - reads} from the cache)"
        )
        lines.extend(f"    from {c['caller']}: {'read' if c['read'] else 'cached'}" for c in calls)
        opened = ", ".join(f"{n} {k}" for k, n in sorted(profile["tables_opened"].items()))
        lines.append(f"  Delta tables opened: {opened or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.call_depth", description=__doc__)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    from streaming.jobs.session import local_session

    spark = local_session(
        "compacted-sink-call-depth",
        "local[1]",
        conf={"spark.sql.shuffle.partitions": "1", "spark.ui.enabled": "false"},
    )
    try:
        with tempfile.TemporaryDirectory(prefix="call-depth-") as directory:
            scenario(spark, Path(directory) / "warm-up", measure=False)
            figures = scenario(spark, Path(directory) / "measured", measure=True)
    finally:
        spark.stop()
    print(report(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
