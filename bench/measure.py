"""Measuring tools: peak RSS from /proc, bytes a system wrote, Delta table size, wall time.

Peak RSS is the kernel's high-water mark (``VmHWM``), reset between systems by
writing ``5`` to ``/proc/<pid>/clear_refs``; it is read for the Python driver,
for the Spark JVM (a separate process) and for Spark's Python workers.
Bytes written are the bytes of every file that appeared or grew under a
system's directory (data files, Delta logs, the sink's checkpoint table),
leaving out the ``.crc`` and ``_SUCCESS`` files Hadoop adds on a local disk,
which an object store would not hold.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import SparkSession

_IGNORED_SUFFIXES = (".crc",)
_IGNORED_NAMES = ("_SUCCESS",)


class DirectoryMeter:
    """Counts the bytes written under a directory since the last call of `written`."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._seen: dict[str, int] = {}
        self.written()  # whatever is there already was not written by the system measured

    def written(self) -> int:
        """Bytes of files that appeared or grew since the previous call."""
        total = 0
        for directory, _dirs, files in os.walk(self.root):
            for name in files:
                if name in _IGNORED_NAMES or name.endswith(_IGNORED_SUFFIXES):
                    continue
                path = os.path.join(directory, name)
                try:
                    size = os.path.getsize(path)
                except FileNotFoundError:
                    continue
                before = self._seen.get(path, 0)
                if size > before:
                    total += size - before
                self._seen[path] = size
        return total


@dataclass(frozen=True)
class TableSize:
    bytes: int
    files: int
    paths: tuple[str, ...]


def delta_table_size(uri: str) -> TableSize:
    """Live bytes and files of the Delta table at ``uri`` (absolute paths in ``paths``)."""
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    paths = tuple(os.path.join(uri, p) for p in actions.column("path").to_pylist())
    return TableSize(sum(actions.column("size_bytes").to_pylist()), len(paths), paths)


def jvm_pid(spark: SparkSession) -> int:
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]


def _proc_stats() -> dict[int, list[str]]:
    """Each live process's ``/proc/PID/stat`` fields after ``pid (comm)``: state, ppid, ...,
    utime, stime, cutime, cstime (indices 11-14). Empty where there is no ``/proc``."""
    stats = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stats[int(entry)] = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
    return stats


def _tree(root: int, stats: dict[int, list[str]]) -> list[int]:
    """``root`` and every live descendant of it, from one `_proc_stats` reading."""
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def descendants(pid: int) -> list[int]:
    return _tree(pid, _proc_stats())[1:]


class PeakRss:
    """High-water RSS (MiB) of the driver, the JVM and the Python workers since `reset`."""

    def __init__(self, spark: SparkSession) -> None:
        self.jvm = jvm_pid(spark)

    def _pids(self) -> dict[str, list[int]]:
        return {"driver": [os.getpid()], "jvm": [self.jvm], "workers": descendants(self.jvm)}

    def reset(self) -> None:
        for pids in self._pids().values():
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/clear_refs", "w") as f:
                        f.write("5")
                except OSError:
                    pass

    def read(self) -> dict[str, float]:
        """``driver``, ``jvm`` and ``workers`` (the largest worker) peak RSS in MiB."""
        return {
            name: max((_vm_hwm_kib(pid) for pid in pids), default=0) / 1024
            for name, pids in self._pids().items()
        }


def _vm_hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def process_tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds (user + system) spent so far by process ``root`` (default: this one) and
    every live descendant (a Spark JVM, its Python workers), each counting the children it
    has reaped. On a machine others load too, wall time says how busy it was; this says
    what the work cost. Linux only (``/proc``); 0.0 elsewhere."""
    stats = _proc_stats()
    tree = _tree(os.getpid() if root is None else root, stats)
    ticks = sum(int(x) for pid in tree if pid in stats for x in stats[pid][11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cores = os.cpu_count()
    return f"{platform.system()} {platform.machine()}, {cores} cores ({cpu}), {mem_gib:.0f} GiB RAM"


def load_average() -> str:
    try:
        return subprocess.run(
            ["uptime"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        one, five, fifteen = os.getloadavg()
        return f"load average: {one:.2f}, {five:.2f}, {fifteen:.2f}"
