"""Every sub-command of ``compacted-sink`` is in every command table of the documents.

docs/operations.md has three tables of commands (what each does and whether it starts
Spark; what each starts; all in one table) and the README names them in a sentence: a
command missing there is one a user does not find. Pure: reads the parser and the files.
"""

from __future__ import annotations

import re
from pathlib import Path

from streaming.cli import _parser

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> set[str]:
    (commands,) = [a for a in _parser()._actions if a.dest == "command"]
    return set(commands.choices)


def _command_tables(text: str) -> list[set[str]]:
    """The commands of each Markdown table whose header's first cell is ``command``."""
    tables, rows = [], None
    for line in text.splitlines():
        if line.startswith("| command |"):
            rows = set()
            tables.append(rows)
        elif rows is not None and line.startswith("|"):
            rows.update(re.findall(r"`([a-z][a-z-]*)[ `]", line.split("|")[1]))
        else:
            rows = None
    return tables


def test_every_command_is_in_every_command_table():
    commands = _commands()
    assert {"lookup", "consumers", "configs", "accept", "restore"} <= commands
    tables = _command_tables((ROOT / "docs" / "operations.md").read_text())
    assert len(tables) == 3
    for table in tables:
        assert commands - table == set()
    readme = (ROOT / "README.md").read_text()
    (sentence,) = re.findall(
        r"One console entry point, `compacted-sink`:[\s\S]*?A failing command", readme
    )
    assert {c for c in commands if f"`{c}" not in sentence} == set()
