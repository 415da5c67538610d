"""What lives in an extra fails by name when the extra is missing: ``status --plot`` without
matplotlib (the ``plot`` extra) exits 2 before reading anything, naming the extra. A
subprocess whose ``matplotlib`` is hidden (no Spark)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HIDE_MATPLOTLIB = """
import importlib.abc, runpy, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
sys.argv = ["compacted-sink", *sys.argv[1:]]
runpy.run_module("streaming.cli", run_name="__main__")
"""


def test_status_plot_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", HIDE_MATPLOTLIB, "status", "lake/users", "--plot", "s.png"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == (
        "compacted-sink status: configuration error: status --plot needs matplotlib, which is "
        "not installed: pip install 'compacted-sink[plot]' (or pip install matplotlib)"
    )
    assert not (tmp_path / "s.png").exists()
