"""The cleaner's modules keep their halves apart, as tests. Pure: parses the source.

- The executors' task code (`sinks.cleaner.recopy_task`) imports nothing of the driver's
  half (the pass, its planning, the claims, the rounds): what a Spark task unpickles is
  that module and what it imports.
- Planning (`sinks.cleaner.pass_planning`) knows no claims, no pass and no task; the
  state machine (`sinks.cleaner.cleaner_manager`) plans nothing.
- The readers that run the task code import it from its own module, not the pass's.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRIVER = {
    "sinks.cleaner.cleaner",
    "sinks.cleaner.cleaner_manager",
    "sinks.cleaner.log_cleaner",
    "sinks.cleaner.pass_planning",
}
CLEANER = DRIVER | {"sinks.cleaner.recopy_task"}


def imports(module: str) -> set[str]:
    """The modules ``module`` imports from, at any depth of its code."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_task_code_imports_nothing_of_the_driver():
    assert imports("sinks.cleaner.recopy_task") & DRIVER == set()


def test_planning_knows_no_claim_no_pass_and_no_task():
    assert (
        imports("sinks.cleaner.pass_planning") & (DRIVER | {"sinks.cleaner.recopy_task"}) == set()
    )


def test_the_state_machine_plans_nothing():
    assert (
        imports("sinks.cleaner.cleaner_manager") & (DRIVER | {"sinks.cleaner.recopy_task"}) == set()
    )


def test_the_readers_run_the_task_code_from_its_own_module():
    used = imports("sinks.reading.partition_state")
    assert "sinks.cleaner.recopy_task" in used and "sinks.cleaner.cleaner" not in used
