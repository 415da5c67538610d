"""The library's layers: no module imports one from a layer above its own.

From the bottom (issue #19, point 5): ``checkpoints``, ``sinks.errors``,
``sinks.crash_points``, ``sinks.shutdown`` and ``sinks.spark_compat``; ``sinks.config``;
``sinks.log`` (with ``sinks.log.foreign``) and ``sinks.spark_session``; ``sinks.produce``;
``sinks.maintenance``; ``sinks.cleaner``;
``sinks.reading``; ``sinks.sink``; then ``streaming`` by concern: ``streaming.consumers``,
``streaming.decoding`` and ``streaming.inputs``; ``streaming.status``; ``streaming.jobs``;
``streaming.cli`` and the ``streaming`` package itself. Every import counts, also one inside
a function (a lazy import that hides a cycle is still an upward import). And ``streaming``
imports the library through its packages' public names (`LIBRARY_FRONTS`), never a module
inside them. Pure: parses the source, imports nothing.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("checkpoints", "sinks", "streaming")

LAYERS: list[tuple[str, ...]] = [
    ("checkpoints", "sinks.errors", "sinks.crash_points", "sinks.shutdown", "sinks.spark_compat"),
    ("sinks.config",),
    ("sinks.log", "sinks.spark_session", "sinks.python_workers"),
    ("sinks.produce",),
    ("sinks.maintenance",),
    ("sinks.cleaner",),
    ("sinks.reading",),
    ("sinks.sink", "sinks.append_report", "sinks"),  # the front; the package re-exports it
    ("streaming.consumers", "streaming.decoding", "streaming.inputs"),
    ("streaming.status",),  # a log's status lists its consumers
    ("streaming.jobs",),  # a job runs decoding, an input and progress lines
    ("streaming.cli", "streaming"),  # the commands; the package re-exports every concern
]

KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()

LIBRARY_FRONTS = {
    "checkpoints",
    "sinks",
    "sinks.cleaner",
    "sinks.config",
    "sinks.errors",
    "sinks.log",
    "sinks.maintenance",
    "sinks.produce",
    "sinks.reading",
    # single modules of the library, each a layer of its own in `LAYERS` (no package to
    # go through); their Spark glue is no name for ``sinks`` to export to its users
    "sinks.python_workers",
    "sinks.spark_compat",
    "sinks.spark_session",
}
"""What ``streaming`` may import from the library: packages, and modules no package holds."""

FUNCTIONS_NAMED_AS_THEIR_MODULE: dict[str, str] = {
    "sinks.cleaner.log_to_clean": "log_to_clean",
    "sinks.log.log_config": "log_config",
    "sinks.log.log_keys": "log_keys",
}
"""Functions ``streaming`` imports from their module: a package exporting one would rebind
its module's name (``sinks.log.log_keys`` would be the function, not the module)."""


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


def library_imports_past_fronts() -> list[str]:
    """``streaming``'s imports of a module inside a library package, at any depth."""
    found = []
    for path in sorted((ROOT / "streaming").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom | ast.Import) or getattr(node, "level", 0):
                continue
            modules = (
                [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            )
            for module in modules:
                if module.split(".")[0] not in ("sinks", "checkpoints"):
                    continue
                if module in LIBRARY_FRONTS:
                    names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
                    inner = [
                        n
                        for n in names
                        if _is_module(f"{module}.{n}") and n not in _exported(module)
                    ]
                    if inner:  # ``from sinks.log import storage`` imports a module too
                        found.append(f"{module_name(path)} imports {module}.{inner[0]}")
                    continue
                names = {a.name for a in node.names} if isinstance(node, ast.ImportFrom) else set()
                if names and names <= {FUNCTIONS_NAMED_AS_THEIR_MODULE.get(module)}:
                    continue
                found.append(f"{module_name(path)} imports {module}")
    return found


def _exported(package: str) -> set[str]:
    """The names in ``package``'s ``__all__`` (a name there is the export, not a module)."""
    init = ROOT.joinpath(*package.split("."), "__init__.py")
    if not init.exists():
        return set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return {ast.literal_eval(e) for e in node.value.elts}
    return set()


def test_streaming_imports_the_library_through_its_packages():
    assert library_imports_past_fronts() == []


def test_an_import_past_a_package_is_caught(tmp_path, monkeypatch):
    """The rule sees a module inside a package, at any depth, and a module imported by name."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for package in ("sinks", "sinks/log", "streaming"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "sinks/log/storage.py").write_text("")
    (tmp_path / "streaming/job.py").write_text(
        "from sinks.log import storage\ndef f():\n    from sinks.log.storage import join\n"
    )
    assert library_imports_past_fronts() == [
        "streaming.job imports sinks.log.storage",
        "streaming.job imports sinks.log.storage",
    ]
