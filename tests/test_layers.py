"""The library's layers: no module imports one from a layer above its own.

From the bottom (issue #19, point 5): ``checkpoints``, ``sinks.errors``,
``sinks.crash_points``, ``sinks.shutdown`` and ``sinks.spark_compat``; ``sinks.config``;
``sinks.log`` and ``sinks.spark_session``; ``sinks.maintenance``; ``sinks.cleaner``;
``sinks.reading``; ``sinks.sink``; ``streaming``. Every import counts, also one inside a
function (a lazy import that hides a cycle is still an upward import). Pure: parses the
source, imports nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("checkpoints", "sinks", "streaming")

LAYERS: list[tuple[str, ...]] = [
    ("checkpoints", "sinks.errors", "sinks.crash_points", "sinks.shutdown", "sinks.spark_compat"),
    ("sinks.config",),
    ("sinks.log", "sinks.spark_session", "sinks.python_workers"),
    ("sinks.maintenance",),
    ("sinks.cleaner",),
    ("sinks.reading",),
    ("sinks.sink", "sinks.append_report", "sinks"),  # the front; the package re-exports it
    ("streaming",),
]

KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()


def layer_of(module: str) -> int:
    """The index of ``module``'s layer: the longest prefix named in `LAYERS` wins."""
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Every library module ``path`` imports, at any depth of its code."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            # ``from sinks.log import storage`` imports the submodule too
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in PACKAGES and _is_module(m)}


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def library_modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def upward_imports() -> list[str]:
    found = []
    for path in library_modules():
        importer = module_name(path)
        for imported in sorted(imported_modules(path)):
            if (importer, imported) in KNOWN_EXCEPTIONS:
                continue
            if layer_of(imported) > layer_of(importer):
                found.append(
                    f"{importer} (layer {layer_of(importer)}) imports {imported} "
                    f"(layer {layer_of(imported)})"
                )
    return found


def test_every_library_module_has_a_layer():
    for path in library_modules():
        layer_of(module_name(path))


def test_no_import_runs_upward():
    assert upward_imports() == []


def test_function_level_imports_count():
    source = "def f():\n    from sinks.sink import CompactedStateSink\n"
    tree = ast.parse(source)
    names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names == ["sinks.sink"]  # ast.walk reaches into function bodies
