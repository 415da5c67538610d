"""The ``job.py`` docs/deployment.md gives ``spark-submit`` runs a job file on the active
session (as spark-submit's driver would create it), and writes the log.

``examples/spark_submit_job.py`` is loaded as spark-submit loads it and its ``main`` run
in the test's process, the test session standing in for the one spark-submit configures:
a tiny JSON-lines input, ``available_now``. The document's command names that file.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

from sinks import read_state

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "spark_submit_job.py"


def test_the_documented_job_py_runs_a_job_file(spark, tmp_path, capsys):
    (tmp_path / "in").mkdir()
    rows = [{"key": "user-24", "value": "v1", "partition": 0, "offset": 0}]
    (tmp_path / "in" / "part-0.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "job.toml").write_text(
        f'[source]\nformat = "files"\npath = "{tmp_path}/in"\n'
        f'[sink]\npath = "{tmp_path}/lake/users"\n[trigger]\navailable_now = true\n'
    )
    main = runpy.run_path(str(JOB))["main"]
    assert main([str(tmp_path / "job.toml")]) == 0
    assert read_state(str(tmp_path / "lake" / "users")).to_pylist()[0]["key"] == b"user-24"
    assert "started (1 log(s))" in capsys.readouterr().err
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    assert "--py-files dist/compacted_sink.zip examples/spark_submit_job.py" in deployment
