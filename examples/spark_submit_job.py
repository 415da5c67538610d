"""The ``job.py`` for ``spark-submit``: run the job a TOML file describes on the cluster.

::

    make wheel    # dist/compacted_sink.zip: the wheel under the name --py-files takes
    spark-submit --master yarn --py-files dist/compacted_sink.zip \\
        examples/spark_submit_job.py /shared/jobs/users.toml

spark-submit runs a Python file, not a console entry point, so this file stands in for
``compacted-sink run JOB.toml`` (the same command, the same one-line failures and exit
codes). It creates the session first, from what spark-submit set (``--master``,
``--conf``, the cluster's defaults): ``run`` then takes that active session; on its own
it would start an embedded ``local[*]`` one. Copy it beside your job files if you like;
it needs nothing but the package ``--py-files`` ships.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pyspark.sql import SparkSession


def main(argv: Sequence[str]) -> int:
    """``compacted-sink run`` with ``argv`` (the job file, then ``run``'s options) on the
    session spark-submit configured; returns the command's exit code."""
    SparkSession.builder.appName("compacted-sink").getOrCreate()
    from streaming.cli import main as compacted_sink

    return compacted_sink(["run", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
