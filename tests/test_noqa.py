"""No comment that silences nothing: every ``# noqa`` names rules the lint selects.

A noqa comment for N802 where ruff does not select the pep8-naming rules tells a reader a
rule is kept here that is kept nowhere. ruff's own RUF100 (selected in pyproject.toml) finds a
``noqa`` whose rule does not fire where ruff runs; this check needs no ruff: it reads the
selection from pyproject.toml and every code a ``noqa`` names in the repository's Python
files. Pure: reads text, imports nothing of the project.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("checkpoints", "sinks", "streaming", "tests", "bench", "examples", "docker", "jvm")
NOQA = re.compile(r"#\s*(?:ruff\s*:\s*)?noqa\s*:\s*([A-Z]+[0-9]*(?:\s*,\s*[A-Z]+[0-9]*)*)")
CODE = re.compile(r"^([A-Z]+)([0-9]*)$")


def selected() -> list[str]:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    return [*lint.get("select", ()), *lint.get("extend-select", ())]


def is_selected(code: str, selectors: list[str]) -> bool:
    """Whether ruff's ``select`` enables ``code``: a selector is a linter's letters and a
    prefix of its rules' digits (``B`` selects ``B018`` but not ``BLE001``), or ``ALL``."""
    letters, digits = CODE.match(code).groups()
    for selector in selectors:
        if selector == "ALL":
            return True
        s_letters, s_digits = CODE.match(selector).groups()
        if s_letters == letters and digits.startswith(s_digits):
            return True
    return False


def noqa_codes() -> list[tuple[str, str]]:
    """(file:line, code) for every code a ``# noqa`` names."""
    found = []
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")) if (ROOT / top).exists() else ():
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for match in NOQA.finditer(line):
                    where = f"{path.relative_to(ROOT)}:{number}"
                    found += [(where, c.strip()) for c in match.group(1).split(",")]
    return found


def test_every_noqa_names_a_selected_rule():
    selectors = selected()
    assert [
        f"{where}: {code}" for where, code in noqa_codes() if not is_selected(code, selectors)
    ] == []


def test_the_check_reads_rules_as_ruff_does():
    assert is_selected("E402", ["E"]) and is_selected("B018", ["B"])
    assert not is_selected("BLE001", ["B"]) and not is_selected("N802", ["E", "F"])
    assert is_selected("RUF100", ["RUF100"]) and not is_selected("RUF012", ["RUF100"])
    line = "x = 1  # " + "noqa: N802, E501 - why"  # in two parts: no noqa of this file's
    assert [c.strip() for c in NOQA.search(line).group(1).split(",")] == ["N802", "E501"]
