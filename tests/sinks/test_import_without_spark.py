"""The Arrow readers import no pyspark (design.md §59): ``import sinks`` and a
``read_state`` and ``lookup`` of a log leave ``pyspark`` out of ``sys.modules`` in this
venv, which has one; with pyspark hidden they work the same, and the sink is refused by
name. Subprocesses, no Spark in them (the log is written by this process's Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sinks import CompactedStateSink, lookup, read_state

ROOT = Path(__file__).resolve().parents[2]
HIDE_PYSPARK = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
"""
READ = """
import json, sys
import sinks
log = sys.argv[1]
rows = sinks.read_state(log).num_rows
batches = sum(b.num_rows for b in sinks.read_state_batches(log))
found = sinks.lookup(log, "k1").column("value").to_pylist()
imported = sorted(m for m in sys.modules if m.split(".")[0] == "pyspark")
try:
    sinks.CompactedStateSink
    refused = None
except sinks.SparkVersionError as e:
    refused = str(e)
print(json.dumps([rows, batches, found, imported, refused]))
"""


def _read(log: str, prelude: str = "") -> list:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", prelude + READ, log], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_import_sinks_and_reads_import_no_pyspark(spark, tmp_path):
    log = str(tmp_path / "log")
    sink = CompactedStateSink(log)
    rows = [(f"k{i}", f"v{i}") for i in range(5)]
    sink(spark.createDataFrame(rows, "key string, value string"), 0)
    sink.close()
    expected = [read_state(log).num_rows, 5, lookup(log, "k1").column("value").to_pylist()]
    rows, batches, found, imported, refused = _read(log)
    assert [rows, batches, found] == expected == [5, 5, ["v1"]]
    assert imported == [] and refused is None  # pyspark is installed here: the sink loads

    rows, batches, found, imported, refused = _read(log, HIDE_PYSPARK)
    assert [rows, batches, found] == expected and imported == []
    assert refused.startswith("compacted-sink needs pyspark 3.5 or newer; no pyspark module")
