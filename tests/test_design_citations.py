"""The code cites its own design: ``docs/design.md``'s numbered rules, nothing outside the repo.

Every library, test and bench module may cite a rule as ``design.md §N`` (or ``§N–§M``);
each number must be a rule heading of ``docs/design.md``, and rule numbers are given once.
No module cites a design document that lives outside the repository (the product spec or
the notes it was built from, by their names). A section sign in ``docs/`` and the README
is such a citation too (the bench's own write-ups number their sections themselves).
Pure: reads text, imports nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
CITING = ("checkpoints", "sinks", "streaming", "tests", "bench")

SECTION = "\u00a7"  # the section sign, spelled out so this file cites nothing itself
RULE_HEADING = re.compile(rf"^#{{2,4}} {SECTION}(\d+) \S", re.MULTILINE)
CITATION = re.compile(rf"{SECTION}(\d+)(?:\s*[\u2013-]\s*{SECTION}(\d+))?")
# Documents outside the repository, by the names they were cited with; built from parts
# so that this file does not match itself.
OUTSIDE = re.compile(r"\b" + "SP" + r"EC\b|\b" + "NOT" + r"ES\b|" + "shared" + r"/")


def rule_numbers() -> list[int]:
    return [int(n) for n in RULE_HEADING.findall(DESIGN.read_text())]


def cited(text: str) -> set[int]:
    """The rule numbers ``text`` cites; a range ``§5–§9`` cites every rule in it."""
    found = set()
    for first, last in CITATION.findall(text):
        found.update(range(int(first), int(last or first) + 1))
    return found


def python_files() -> list[Path]:
    return sorted(p for top in CITING for p in (ROOT / top).rglob("*.py"))


def test_rules_are_numbered_once():
    numbers = rule_numbers()
    assert numbers, f"no '### {SECTION}N Title' heading in {DESIGN}"
    assert len(numbers) == len(set(numbers)), f"a rule number given twice: {sorted(numbers)}"


def test_no_module_cites_a_document_outside_the_repository():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in python_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == []


def test_every_cited_rule_exists():
    rules = set(rule_numbers())
    missing = [
        f"{path.relative_to(ROOT)}: {SECTION}{n}"
        for path in python_files()
        for n in sorted(cited(path.read_text()) - rules)
    ]
    for path in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        if path != DESIGN:
            missing += [
                f"{path.relative_to(ROOT)}: {SECTION}{n}" for n in cited(path.read_text()) - rules
            ]
    assert missing == []


def test_citations_are_read_as_meant():
    s = SECTION
    assert cited(f"design.md {s}3 and {s}5\u2013{s}9") == {3, 5, 6, 7, 8, 9}
    assert cited(f"(design.md {s}14)") == {14}
    assert OUTSIDE.search("SP" + "EC rule 4")
    assert not OUTSIDE.search("LogSpec, ParamSpec, spec.path")
