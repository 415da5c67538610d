"""The library's layers: no module imports one from a layer above its own.

From the bottom: ``checkpoints``, ``sinks.errors``, ``sinks.crash_points``,
``sinks.shutdown``, ``sinks.spark_compat``, ``sinks.spark_version``, ``sinks.lazy_names``,
``sinks.warn_once`` and ``sinks.python_tasks``; ``sinks.config``;
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
import builtins
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("checkpoints", "sinks", "streaming")

LAYERS: list[tuple[str, ...]] = [
    (
        "checkpoints",
        "sinks.errors",
        "sinks.crash_points",
        "sinks.shutdown",
        "sinks.spark_compat",
        "sinks.spark_version",
        "sinks.python_tasks",
        "sinks.lazy_names",
        "sinks.warn_once",
    ),
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
    "sinks.python_tasks",
    "sinks.python_workers",
    "sinks.spark_compat",
    "sinks.spark_session",
}
"""What ``streaming`` may import from the library: packages, and modules no package holds."""

FUNCTIONS_NAMED_AS_THEIR_MODULE: dict[str, str] = {
    "sinks.cleaner.log_to_clean": "log_to_clean",
    "sinks.log.log_config": "log_config",
    "sinks.log.log_keys": "log_keys",
    "sinks.reading.replay": "replay",  # sinks.reading loads it lazily (design.md §59)
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
            # ``from sinks.log import uris`` imports the submodule too
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


ENGINE = "deltalake"
ENGINE_HOMES = ("sinks.log", "checkpoints")
"""Where the Delta engine may be imported: the log's seam and the checkpoint table."""

ENGINE_IMPORTS_ALLOWED: dict[str, str] = {}
"""Modules outside `ENGINE_HOMES` that still import the engine, each with why; to shrink."""


def fake_library(tmp_path, monkeypatch, *packages: str) -> None:
    """Point the rules at an empty library of ``packages`` under ``tmp_path``."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for package in packages:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")


def engine_importers() -> list[str]:
    """Library modules outside `ENGINE_HOMES` that import ``deltalake``, at any depth."""
    found = []
    for path in library_modules():
        importer = module_name(path)
        if any(importer == h or importer.startswith(h + ".") for h in ENGINE_HOMES):
            continue
        if importer in ENGINE_IMPORTS_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            if any(n == ENGINE or n.startswith(ENGINE + ".") for n in names):
                found.append(f"{importer} imports {ENGINE}")
                break
    return found


def test_the_engine_is_imported_behind_the_seam_only():
    assert engine_importers() == []


def test_an_engine_import_outside_the_seam_is_caught(tmp_path, monkeypatch):
    fake_library(
        tmp_path, monkeypatch, "sinks", "sinks/log", "sinks/produce", "checkpoints", "streaming"
    )
    (tmp_path / "sinks/log/table.py").write_text("from deltalake import DeltaTable\n")
    (tmp_path / "checkpoints/rows.py").write_text("import deltalake\n")
    (tmp_path / "sinks/produce/append.py").write_text(
        "def f():\n    from deltalake.exceptions import CommitFailedError\n"
    )
    assert engine_importers() == ["sinks.produce.append imports deltalake"]


def test_every_allowed_engine_import_still_imports_it():
    """An entry whose module no longer imports the engine is removed from the allow-list."""
    for module in ENGINE_IMPORTS_ALLOWED:
        path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        assert ENGINE in path.read_text(), f"{module} no longer imports {ENGINE}: drop it"


ERROR_HOME = "sinks.errors"

ERROR_CLASSES_ALLOWED: dict[str, str] = {}
"""Modules outside `ERROR_HOME` that still define an exception class, each with why; to shrink."""


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def exception_classes_outside_home() -> list[str]:
    """`exception_classes` but those of `ERROR_HOME` and `ERROR_CLASSES_ALLOWED`."""
    return [
        c
        for c in exception_classes()
        if c.rpartition(".")[0] not in (ERROR_HOME, *ERROR_CLASSES_ALLOWED)
    ]


def exception_classes() -> list[str]:
    """Every library class deriving an exception (a built-in one, a library one at any depth,
    or any base named ``*Error``/``*Exception``), as ``module.Class``."""
    exceptions = {n for n in dir(builtins) if _is_exception(getattr(builtins, n))}
    classes: list[tuple[str, str, list[str]]] = []
    for path in library_modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                classes.append((module_name(path), node.name, [_base_name(b) for b in node.bases]))
    changed = True
    while changed:  # a class deriving a library exception is one too, at any depth
        changed = False
        for _module, name, bases in classes:
            if name not in exceptions and any(
                b in exceptions or b.endswith(("Error", "Exception")) for b in bases
            ):
                exceptions.add(name)
                changed = True
    return [f"{module}.{name}" for module, name, _bases in classes if name in exceptions]


def _is_exception(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


def test_every_exception_class_lives_in_the_error_module():
    assert exception_classes_outside_home() == []


def test_an_exception_class_outside_the_error_module_is_caught(tmp_path, monkeypatch):
    fake_library(tmp_path, monkeypatch, "sinks", "sinks/log", "streaming")
    (tmp_path / "sinks/errors.py").write_text("class SinkError(Exception): ...\n")
    (tmp_path / "sinks/log/table.py").write_text(
        "class Gone(SinkError): ...\nclass Later(Gone): ...\nclass Plain: ...\n"
    )
    (tmp_path / "streaming/job.py").write_text("class Refused(RuntimeError): ...\n")
    assert sorted(exception_classes_outside_home()) == [
        "sinks.log.table.Gone",
        "sinks.log.table.Later",
        "streaming.job.Refused",
    ]


def test_the_error_module_has_one_root_and_says_when_each_is_raised():
    path = ROOT.joinpath(*ERROR_HOME.split(".")).with_suffix(".py")
    classes = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)]
    root, *rest = classes
    family = {root.name}
    for node in rest:
        assert any(_base_name(b) in family for b in node.bases), (
            f"{node.name}: not under {root.name}"
        )
        family.add(node.name)
    for node in classes:
        assert (ast.get_docstring(node) or "").startswith("Raised when"), node.name


def test_every_allowed_error_module_still_defines_one():
    """An entry whose module no longer defines an exception class is removed from the list."""
    defining = {c.rpartition(".")[0] for c in exception_classes()}
    for module in ERROR_CLASSES_ALLOWED:
        assert module in defining, f"{module} defines no exception class any more: drop it"


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
                    if inner:  # ``from sinks.log import uris`` imports a module too
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
    fake_library(tmp_path, monkeypatch, "sinks", "sinks/log", "streaming")
    (tmp_path / "sinks/log/uris.py").write_text("")
    (tmp_path / "streaming/job.py").write_text(
        "from sinks.log import uris\ndef f():\n    from sinks.log.uris import join\n"
    )
    assert library_imports_past_fronts() == [
        "streaming.job imports sinks.log.uris",
        "streaming.job imports sinks.log.uris",
    ]
