"""Using the sink without a pyspark module, or importing the package with one older than
3.5, stops at once with `SparkVersionError` naming the supported range and how to get a
Spark: a subprocess whose ``pyspark`` is hidden, or replaced by a module reporting an old
version (no Spark). Without pyspark ``import sinks`` itself works: the Arrow readers need
none (design.md §59); a Spark name (``CompactedStateSink``) raises when first used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HIDE_PYSPARK = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
"""
IMPORT = """
try:
    import sinks
except Exception as e:
    print(type(e).__name__ + ": " + str(e))
"""
USE_THE_SINK = """
import sinks
try:
    from sinks import CompactedStateSink
except Exception as e:
    print(type(e).__name__ + ": " + str(e))
"""


def _import_sinks(prelude: str, pythonpath: list[str], code: str = IMPORT) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*pythonpath, str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_without_pyspark_the_sink_names_the_range_and_the_way_on() -> None:
    assert _import_sinks(HIDE_PYSPARK, []) == ""  # the Arrow readers need no pyspark
    assert _import_sinks(HIDE_PYSPARK, [], USE_THE_SINK) == (
        "SparkVersionError: compacted-sink needs pyspark 3.5 or newer; no pyspark module is "
        "installed. It runs on pyspark 3.5 to 4.x. Use the Spark your platform provides (its "
        "runtime's pyspark, databricks-connect or pyspark-client), or on a machine without "
        "one: pip install 'compacted-sink[spark]'."
    )


def test_a_pyspark_older_than_3_5_is_named(tmp_path: Path) -> None:
    fake = tmp_path / "pyspark"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "3.4.1"\n')
    message = _import_sinks("", [str(tmp_path)])
    assert message.startswith(
        "SparkVersionError: compacted-sink needs pyspark 3.5 or newer; this is pyspark 3.4.1. "
        "It runs on pyspark 3.5 to 4.x: upgrade the Spark it runs on"
    ), message
