"""A class-data sharing archive of the JVM classes the tests' Spark loads, for a venv.

`make test-setup` runs this file with the main suite's venv's Python (``python
tests/jvm_archive.py``): it starts the tests' classic session (tests/conftest.py's
``build_session``), runs a few small jobs (a DataFrame aggregate, an Arrow round trip
through a Python UDF, a Parquet write and read) and lets the JVM dump the classes it
loaded into ``<venv>/spark-classes.jsa`` when it exits (HotSpot's
``-XX:ArchiveClassesAtExit``, JDK 13+). ``jvm_options()`` gives the options every JVM the
tests start runs with: the archive's, when it is there.

A JVM maps the archive only when its class path starts with the dump's and the jars on it
are the same files; otherwise it loads its classes as without it. Neither case prints
anything (the JDK's ``cds`` log tags are off).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# HotSpot's client compiler alone and the serial collector, with the code cache the tiered
# compilers would have: the client compiler's own default (48 MB) fills with Spark's and
# delta-spark's code, and its sweeper then spends minutes evicting and recompiling; and a
# first metaspace threshold above what Spark's classes take (the default, about 21 MB, cost a
# Connect server five full collections in its first 25 s) (docs/development.md).
BASE_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m -XX:MetaspaceSize=256m"
)
# A Spark driver's (spark-submit's) heap starts at 1 GB, not at the 1/64 of the machine's
# memory the JVM picks (384 MB here), which the serial collector grows slowly: the tests'
# session ran a full collection every 10-20 s. Every driver the tests start has 1 GB or more.
DRIVER_OPTIONS = "-Xms1g"
ARCHIVE = Path(sys.prefix) / "spark-classes.jsa"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def jvm_options(archive: Path = ARCHIVE) -> str:
    """``SPARK_SUBMIT_OPTS`` for the tests' JVMs: the base and driver options, and ``archive``
    when it exists (mapped read-only: every JVM of every test run shares it)."""
    options = f"{BASE_OPTIONS} {DRIVER_OPTIONS}"
    if archive.is_file():
        return f"{options} -XX:SharedArchiveFile={archive} {QUIET}"
    return options


def dump(archive: Path = ARCHIVE) -> None:
    """Write ``archive`` from one session of the tests' settings and a few small jobs;
    written beside it first, then renamed (a failed dump leaves no archive)."""
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    os.environ["SPARK_SUBMIT_OPTS"] = f"{BASE_OPTIONS} -XX:ArchiveClassesAtExit={partial} {QUIET}"
    import pyspark.sql.functions as F
    from conftest import build_session

    spark = build_session()
    with tempfile.TemporaryDirectory() as scratch:
        df = spark.range(2000).withColumn("k", F.col("id") % 7)
        df.groupBy("k").agg(F.count("*"), F.max("id")).collect()

        @F.pandas_udf("long")
        def plus_one(v):
            return v + 1

        df.select(plus_one("id")).toPandas()
        df.toPandas()
        spark.createDataFrame(df.limit(10).toPandas()).collect()
        df.write.parquet(f"{scratch}/t", partitionBy="k")
        spark.read.parquet(f"{scratch}/t").where("k = 1").count()
        gateway = spark.sparkContext._gateway
        spark.stop()
        # The JVM dumps when it exits: end it here (closing its stdin) and wait.
        gateway.shutdown()
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            proc.stdin.close()
            proc.wait(timeout=120)
    if partial.is_file() and partial.stat().st_size:
        partial.replace(archive)
    else:
        raise SystemExit(f"no class-data archive written ({partial})")


if __name__ == "__main__":
    # Run as a file, this directory is first on the path, where tests/sinks would hide the
    # package `sinks`: the checkout goes first (conftest puts this directory back, after it).
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
    sys.path.insert(1, str(Path(__file__).resolve().parent))
    dump()
