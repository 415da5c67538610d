"""How the CLI tests run ``compacted-sink`` in one fresh process without Spark.

`cli` (tests/conftest.py) calls ``streaming.cli.main`` in the test's own process, the test
session taking the place of a JVM of the command's own. `no_spark_cli` runs a list of
commands one after the other in one fresh Python process whose ``SPARK_HOME`` points
nowhere, so that a command that tried to start Spark fails. The tests about the process
itself (Ctrl-C, what a terminal shows of a failed run, a Spark Connect client) start their
own processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

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
