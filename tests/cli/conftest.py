"""How the CLI tests run ``compacted-sink``: in this process, or in one fresh process without Spark.

``streaming.cli.main`` is what the console script runs (``sys.exit(main())``). `cli` calls it
in the test's own process: a command that needs Spark takes the active session (the test
session, `streaming.cli.common.session`) instead of starting a JVM of its own, which costs
~10-14 CPU-seconds a process. `no_spark_cli` runs a list of commands one after the other in
one fresh Python process whose ``SPARK_HOME`` points nowhere, so that a command that tried
to start Spark fails. The tests about the process itself (Ctrl-C, what a terminal shows of
a failed run, a Spark Connect client) start their own processes.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from streaming.cli import main
from streaming.cli.query import _FAILURE_LOGGERS

Run = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Run]:
    """``cli(*args, cwd=path)``: ``compacted-sink ARGS`` run in this process from ``path``;
    its exit code, stdout and stderr as a `subprocess.CompletedProcess`.

    ``run`` quiets py4j's logger and three of Spark's (`streaming.cli.query`) for the rest
    of a process's life: their levels are put back when the test ends, so that the shared
    session logs as before.
    """
    levels = _LogLevels()

    def call(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        levels.remember()
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's own refusals
            code = e.code
        stdout, stderr = capsys.readouterr()
        return subprocess.CompletedProcess(["compacted-sink", *args], code, stdout, stderr)

    yield call
    levels.restore()


class _LogLevels:
    """The levels ``run`` changes, as they were before the test's first command."""

    def __init__(self) -> None:
        self.py4j: int | None = None
        self.spark: dict[str, object] = {}

    def remember(self) -> None:
        if self.py4j is None:
            self.py4j = logging.getLogger("py4j").level
        log4j = _log4j()
        if log4j is not None and not self.spark:
            self.spark = {n: log4j.LogManager.getLogger(n).getLevel() for n in _FAILURE_LOGGERS}

    def restore(self) -> None:
        if self.py4j is not None:
            logging.getLogger("py4j").setLevel(self.py4j)
        log4j = _log4j()
        if log4j is not None:
            for name, level in self.spark.items():
                log4j.core.config.Configurator.setLevel(name, level)


def _log4j():
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    return None if context is None else context._jvm.org.apache.logging.log4j


_ONE_PROCESS = r"""
import io, json, sys
from streaming.cli import main

class Captured(io.TextIOBase):
    def __init__(self):
        self.parts = []
    def writable(self):
        return True
    def write(self, text):
        self.parts.append(text)
        return len(text)

results, real_stdout = [], sys.stdout
sys.stdout, sys.stderr = stdout, stderr = Captured(), Captured()
for argv in json.load(sys.stdin):
    stdout.parts, stderr.parts = [], []
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    results.append([code, "".join(stdout.parts), "".join(stderr.parts)])
real_stdout.write(json.dumps(results))
"""


@pytest.fixture
def no_spark_cli() -> Callable[..., list[subprocess.CompletedProcess]]:
    """``no_spark_cli(args_1, args_2, ..., cwd=path)``: each ``compacted-sink ARGS`` in turn,
    in one fresh Python process run from ``path`` whose ``SPARK_HOME`` points nowhere (a
    command that tried to start Spark would fail); one `subprocess.CompletedProcess` each.

    The stderr of each is what ``main`` and the logging it sets up printed; the process
    prints nothing else (no JVM).
    """

    def run(*commands: Sequence[str], cwd: Path) -> list[subprocess.CompletedProcess]:
        env = {**os.environ, "SPARK_HOME": str(cwd / "no-spark-here")}
        done = subprocess.run(
            [sys.executable, "-c", _ONE_PROCESS],
            input=json.dumps([list(c) for c in commands]),
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return [
            subprocess.CompletedProcess(["compacted-sink", *argv], code, stdout, stderr)
            for argv, (code, stdout, stderr) in zip(commands, json.loads(done.stdout), strict=True)
        ]

    return run
