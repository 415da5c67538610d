"""The sink leaves the session's logging as it found it: no Spark INFO line after a batch.

Spark's default console threshold in a script or a notebook is WARN, kept by a
filter on the console appender while the root logger stays at INFO. The sink's
check of Spark's Python workers (`sinks.python_workers`) used to set the root level
to OFF and back to what it read (INFO), which drops that threshold: every INFO line
of every later job reached the console (70 lines in a ten-row script, 156 here;
897 in the README's quick start in a Jupyter kernel, 194 here).

Both tests run where the check has something to fix: ``PYSPARK_PYTHON`` unset, so
the workers start the ``python3`` on the PATH, which cannot import the package. The
script's run also serves the check's local fix end to end (the first batch succeeds on
the script's own Python and says so): one Spark process for both.
The notebook test runs the README's quick start, as written, in a real Jupyter
kernel (nbclient, ipykernel), whose outputs receive what the JVM writes to stderr.
The kernel's environment carries the tests' ``PYTHONPATH`` (this checkout: the
kernel imports the code under test even where the venv's editable install points
at another checkout); ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are removed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

SCRIPT = """
import sys
from pyspark.sql import SparkSession
from sinks import CompactedStateSink
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
sink = CompactedStateSink(sys.argv[1])
sink(spark.createDataFrame([(f"k{i}", str(i)) for i in range(10)], "key string, value string"), 0)
print("state", sink.state().count(), "dirty ratio", sink.dirty_ratio())
import subprocess
jvm = str(spark.sparkContext._jvm.ProcessHandle.current().pid())
ps = subprocess.run(["ps", "-e", "-o", "ppid=,args="], capture_output=True, text=True).stdout
daemons = [line for line in ps.splitlines() if line.split(None, 1)[0] == jvm
           and line.split(None, 1)[1] == f"{sys.executable} -m pyspark.daemon pyspark.worker"]
print("worker daemons", len(daemons))
def frozen(batches):
    import gc, pyarrow as pa
    for _ in batches:
        yield pa.RecordBatch.from_pydict({"n": [gc.get_freeze_count()]})
print("frozen in the worker", spark.range(0, 1, 1, 1).mapInArrow(frozen, "n long").first().n)
"""
# The Python Spark starts workers with when PYSPARK_PYTHON is unset (pyspark's default).
WORKERS_PYTHON = shutil.which("python3", path=os.environ.get("PATH"))
workers_python_lacks_the_package = pytest.mark.skipif(
    WORKERS_PYTHON is None
    or subprocess.run([WORKERS_PYTHON, "-c", "import pyarrow"], capture_output=True).returncode
    == 0,
    reason="needs a python3 on the PATH without pyarrow",
)


def spark_info_lines(text: str) -> list[str]:
    """Lines in log4j's console layout at INFO (``26/11/24 18:36:50 INFO DAGScheduler: …``)."""
    return [line for line in text.splitlines() if re.search(r"\d\d:\d\d:\d\d INFO \S+:", line)]


def environment_without_pyspark_python() -> dict[str, str]:
    # ipykernel forwards what the JVM writes to its stderr only outside pytest: it looks
    # for PYTEST_CURRENT_TEST, which the kernel must not inherit.
    dropped = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_REMOTE", "PYTEST_CURRENT_TEST")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    return env


def readme_quick_start() -> str:
    block = re.search(r"<!-- quick-start -->\n```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README.md lost its quick-start block"
    return block.group(1)


@dataclass
class ScriptRun:
    process: subprocess.Popen
    output: Path  # where its stdout and stderr go: files, so a full pipe never stalls it

    def finish(self) -> tuple[int, str, str]:
        """Waits for the script; returns its exit code, stdout and stderr."""
        code = self.process.wait(timeout=600)
        return code, *((self.output / n).read_text() for n in ("stdout", "stderr"))


@pytest.fixture(scope="module", autouse=True)
def script_run(tmp_path_factory) -> Iterator[ScriptRun]:
    """The script's process, started before the module's first test (the notebook's), so
    that the two Spark sessions start side by side; the script's test reads its output."""
    root = tmp_path_factory.mktemp("script")
    with open(root / "stdout", "w") as stdout, open(root / "stderr", "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(root / "users")],
            env=environment_without_pyspark_python(),
            stdout=stdout,
            stderr=stderr,
        )
    yield ScriptRun(process, root)
    if process.poll() is None:
        process.kill()
        process.wait()


def test_the_readme_quick_start_in_a_jupyter_kernel_prints_no_info_line(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    code = readme_quick_start()
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(code),
            nbformat.v4.new_code_cell("print('live keys', sink.state().count())"),
        ]
    )
    client = nbclient.NotebookClient(
        notebook,
        timeout=900,
        kernel_name="python3",  # jupyter_client runs it with this interpreter (sys.executable)
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working directory
    )
    client.execute(env=environment_without_pyspark_python())

    outputs = [o for cell in notebook.cells for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"], outputs
    stdout = "".join(o.get("text", "") for o in outputs if o.get("name") == "stdout")
    stderr = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "live keys 100" in stdout
    assert spark_info_lines(stdout + stderr) == []
    # The kernel forwards the JVM's stderr (its WARN lines, the stage progress bar): an
    # INFO line would have been seen.
    assert "WARN" in stderr or "[Stage" in stderr, stderr[:2000]
    assert (tmp_path / "lake" / "users" / "_delta_log").is_dir()


def test_a_script_prints_no_info_line_after_the_first_batch(script_run):
    code, stdout, stderr = script_run.finish()
    assert code == 0, stderr[-3000:]
    assert "state 10 dirty ratio" in stdout
    # The sink's check of the workers and its tasks share one Python worker daemon, and
    # the worker its tasks ran in froze its imports (design.md §45).
    assert "worker daemons 1" in stdout
    frozen = re.search(r"frozen in the worker (\d+)", stdout)
    assert frozen and int(frozen.group(1)) > 10_000, stdout
    assert spark_info_lines(stderr) == []
    assert "Setting default log level" in stderr  # the JVM's stderr is what was read


@workers_python_lacks_the_package
def test_a_local_master_runs_the_workers_on_this_python(script_run):
    """The same script's run, as a newcomer's script with ``PYSPARK_PYTHON`` unset (a
    Jupyter kernel or an unactivated venv leaves it so): the workers would start the
    ``python3`` on the PATH, which has no pyarrow; the first batch succeeds on this
    process's Python and says what it did (`sinks.python_workers`)."""
    code, stdout, stderr = script_run.finish()
    assert code == 0, stderr[-3000:]
    assert "state 10 dirty ratio" in stdout
    assert f"now runs them with {sys.executable}" in stderr
    assert "Traceback" not in stderr
