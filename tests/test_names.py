"""One name per thing, as tests. Pure: parses the source, imports nothing.

- No public name (a class, function or module constant not starting with ``_``) is defined
  at the top level of two library modules: a reader who meets ``read_state`` or
  ``CleanerLoop`` knows which one it is. A package's ``__init__`` re-exporting a name
  defines nothing; every module's own ``logger`` is the one exception by convention.
- One exit registry: only `sinks.shutdown` hooks the interpreter's exit.
- A class named a thread (``...Thread``) is one: it derives from ``threading.Thread``; a
  loop that runs on its caller's thread is named a loop.
- No library function or class is there for the tests alone: what only ``tests/`` uses
  lives in ``tests/`` (``testkit.py`` or the test module), unless the documentation offers
  it to users (``docs/``, the README).
- An exception class is named ``...Error``.
- One warn-once helper: only `sinks.warn_once` remembers at module level what was said.
- A read never asks for a repair: the reading packages call ``snapshot`` without
  ``repair=True`` and never ``repair()`` (design.md §66), but where they write a log.
- Two levels of cleaning, each named once (design.md §43): a round is ``run_round``, a
  pass ``run_pass``; no other function of the cleaner or the sink is named by a cleaning
  verb (``clean``, ``maintain``, ``clean_*``, ``do_clean``), but the public
  ``CompactedStateSink.clean``.
- A round's request is one value: no function of the round's and the pass's modules takes
  ``force``, ``plan`` or ``budget`` (they take the `RoundRequest`), and in the sink only
  ``clean`` takes ``force``.
- A table's address is one value: no library function takes ``storage_options`` but a
  public entry point, where a `LogLocation` is built, and the modules that build or resolve
  options; every other function takes the location whole (design.md §70).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("checkpoints", "sinks", "streaming")
ALSO_USING = ("bench", "examples")  # code outside the library that uses it, not tests
EXIT_REGISTRY = "sinks/shutdown.py"

PER_MODULE = {"logger"}

KNOWN_DUPLICATES: dict[str, str] = {}

KEPT_FOR_TESTS: dict[str, str] = {
    "armed": "arms a named crash point in this process: it writes sinks.crash_points' own "
    "table of armed points, which crash_point reads, so it stays beside crash_point",
    "drop_tombstones": "the Spark half of a rule pair in sinks.cleaner.rules: the reference "
    "a pass and the readers are held to, kept beside its Arrow half",
    "retain_latest": "the Spark half of a rule pair in sinks.cleaner.rules, as above",
    "staged_files": "streaming/consumers/datasource.py is being rewritten on another branch",
}


def library_modules() -> list[Path]:
    return sorted(p for package in LIBRARY for p in (ROOT / package).rglob("*.py"))


def python_files(tops: tuple[str, ...]) -> list[Path]:
    return sorted(p for top in tops if (ROOT / top).exists() for p in (ROOT / top).rglob("*.py"))


def top_level_names(tree: ast.Module) -> list[tuple[str, str]]:
    """(name, kind) of every public class, function and constant ``tree`` defines at its top
    level, also inside a top-level ``if`` or ``try``; kind is ``def``, ``class`` or ``=``."""
    found = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((node.name, "def"))
        elif isinstance(node, ast.ClassDef):
            found.append((node.name, "class"))
        elif isinstance(node, ast.Assign):
            found.extend((t.id, "=") for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.append((node.target.id, "="))
        elif isinstance(node, ast.If | ast.Try):
            pending.extend(node.body + node.orelse)
            pending.extend(s for h in getattr(node, "handlers", ()) for s in h.body)
    return [(n, k) for n, k in found if not n.startswith("_")]


def definitions() -> dict[str, list[tuple[str, str]]]:
    """Each public name -> the library modules (relative paths) defining it, with its kind."""
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for path in library_modules():
        for name, kind in top_level_names(ast.parse(path.read_text(), filename=str(path))):
            found[name].append((str(path.relative_to(ROOT)), kind))
    return found


def names_used(path: Path) -> set[str]:
    """Every name ``path`` refers to: names, attributes and imported names. A package's
    ``__init__`` only re-exports, so its imports are not uses."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and path.name != "__init__.py":
            used.update(alias.name for alias in node.names)
    return used


def defined_twice() -> list[str]:
    return [
        f"{name}: {', '.join(m for m, _ in modules)}"
        for name, modules in sorted(definitions().items())
        if len(modules) > 1 and name not in PER_MODULE and name not in KNOWN_DUPLICATES
    ]


def used_only_by_tests() -> list[str]:
    """Library functions and classes that no library, bench or example code uses, but tests
    do, and that the documentation does not offer to users."""
    outside_tests: set[str] = set()
    for path in python_files(LIBRARY + ALSO_USING):
        outside_tests |= names_used(path)
    in_tests: set[str] = set()
    for path in python_files(("tests",)):
        in_tests |= names_used(path)
    documented = " ".join(
        p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    )
    found = []
    for name, modules in sorted(definitions().items()):
        if any(kind == "=" for _, kind in modules) or name in KEPT_FOR_TESTS:
            continue
        if name in outside_tests or name not in in_tests:
            continue
        if re.search(rf"\b{re.escape(name)}\b", documented):
            continue
        found.append(f"{name} ({modules[0][0]})")
    return found


def exit_hooks() -> list[str]:
    """Library modules other than `sinks.shutdown` that hook the interpreter's exit."""
    found = []
    for path in library_modules():
        relative = str(path.relative_to(ROOT))
        if relative == EXIT_REGISTRY:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            hooks = (
                (isinstance(node, ast.Import) and any(a.name == "atexit" for a in node.names))
                or (isinstance(node, ast.ImportFrom) and node.module == "atexit")
                or (isinstance(node, ast.Attribute) and node.attr == "_register_atexit")
            )
            if hooks:
                found.append(f"{relative}:{node.lineno}")
    return found


def threads_that_are_not() -> list[str]:
    """Library classes named ``...Thread`` that do not derive from ``threading.Thread``."""
    found = []
    for path in library_modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Thread"):
                bases = {ast.unparse(b) for b in node.bases}
                if not bases & {"Thread", "threading.Thread"}:
                    found.append(f"{path.relative_to(ROOT)}:{node.name}")
    return found


def test_no_public_name_is_defined_in_two_library_modules():
    assert defined_twice() == []


def test_known_duplicates_are_still_duplicates():
    """A duplicate fixed leaves `KNOWN_DUPLICATES`, so the list only shrinks."""
    found = definitions()
    assert [n for n in KNOWN_DUPLICATES if len(found.get(n, ())) < 2] == []


def test_no_library_function_is_there_for_the_tests_alone():
    assert used_only_by_tests() == []


def test_what_is_kept_for_the_tests_still_exists_in_the_library():
    found = definitions()
    assert [n for n in KEPT_FOR_TESTS if n not in found] == []


def test_one_exit_registry():
    assert exit_hooks() == []


def test_a_class_named_a_thread_is_a_thread():
    assert threads_that_are_not() == []


def test_the_checks_see_what_they_look_for():
    source = (
        "X = 1\n_Y = 2\nlogger = None\n"
        "if True:\n    def f(): pass\n"
        "class C:\n    def method(self): pass\n"
    )
    assert top_level_names(ast.parse(source)) == [
        ("X", "="),
        ("logger", "="),
        ("C", "class"),
        ("f", "def"),
    ]


WALL_CLOCK = "checkpoints/clock.py"
WALL_CLOCK_ELSEWHERE = {
    "streaming/consumers/datasource.py": "compares staged files' modification times, which "
    "storage stamps with the wall clock, not a timestamp the library writes",
}


def wall_clock_readers() -> list[str]:
    """Library modules that read ``time.time()`` outside the clock module (and the known
    exceptions): a timestamp the library writes comes from a clock it is given."""
    found = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == WALL_CLOCK or relative in WALL_CLOCK_ELSEWHERE:
                continue
            if re.search(r"\btime\.time\(\)", path.read_text()):
                found.append(relative)
    return found


def test_one_clock_for_every_timestamp_the_library_writes():
    assert wall_clock_readers() == []


READERS = ("sinks/reading", "streaming/status", "streaming/consumers")
READERS_THAT_WRITE = {
    "sinks/reading/replay.py": "replays an export or a log's version into a log: a writer of "
    "that log",
}


def reads_that_repair() -> list[str]:
    """Calls in the reading packages that ask ``snapshot`` for a repair, which commits an
    undo of another engine's stale rewrite: a read never commits (design.md §28, §66)."""
    found = []
    for top in READERS:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in READERS_THAT_WRITE:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                asks = any(
                    k.arg == "repair"
                    and not (isinstance(k.value, ast.Constant) and k.value.value is False)
                    for k in node.keywords
                )
                if node.func.attr in ("snapshot", "repair") and (
                    asks or node.func.attr == "repair"
                ):
                    found.append(f"{relative}:{node.lineno}")
    return found


def test_a_read_never_asks_for_a_repair():
    assert reads_that_repair() == []


WARN_ONCE = "sinks/warn_once.py"
MEMORY_OF_WARNINGS = re.compile(r"^_?\w*(?:said|warned)\w*\s*[:=]", re.IGNORECASE | re.MULTILINE)


def warnings_remembered_elsewhere() -> list[str]:
    """Library modules outside `sinks.warn_once` that keep, at their top level, what they
    have said or warned about: "said once" has one home (design.md §67)."""
    return [
        f"{path.relative_to(ROOT).as_posix()}: {match.group(0)}"
        for path in library_modules()
        if path.relative_to(ROOT).as_posix() != WARN_ONCE
        for match in MEMORY_OF_WARNINGS.finditer(path.read_text())
    ]


def test_one_warn_once_helper():
    assert warnings_remembered_elsewhere() == []
    assert MEMORY_OF_WARNINGS.search("_warned_unsafe: set[str] = set()")
    assert MEMORY_OF_WARNINGS.search("_SAID = set()")


def errors_not_named_errors() -> list[str]:
    """Exception classes of the library whose name does not end in ``Error``."""
    found = []
    for path in library_modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef) and not node.name.endswith("Error"):
                bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                if any(b.endswith(("Error", "Exception")) for b in bases):
                    found.append(f"{path.relative_to(ROOT).as_posix()}:{node.name}")
    return found


def test_an_error_is_named_an_error():
    assert errors_not_named_errors() == []


CLEANING = ("sinks/cleaner", "sinks/sink.py")
LEVELS = {"run_round": "sinks/cleaner/log_cleaner.py", "run_pass": "sinks/cleaner/cleaner.py"}
CLEANING_VERB = re.compile(r"^(clean|maintain\w*|clean_\w+|do_clean\w*)$")
PUBLIC_CLEAN = {("sinks/sink.py", "CompactedStateSink.clean")}


def functions(paths: tuple[str, ...]) -> list[tuple[str, str, ast.FunctionDef]]:
    """(relative path, ``Class.method`` or ``function``, node) of every function defined in
    ``paths`` (files or folders), methods named with their class."""
    found = []
    for top in paths:
        root = ROOT / top
        for path in sorted(root.rglob("*.py") if root.is_dir() else [root]):
            relative = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in tree.body:
                members = node.body if isinstance(node, ast.ClassDef) else [node]
                prefix = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
                for member in members:
                    if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                        found.append((relative, prefix + member.name, member))
    return found


def cleaning_verbs() -> list[str]:
    """Functions of the cleaner and the sink named by a cleaning verb, but the public
    ``clean``; and each level's name where it is defined, if not exactly once there."""
    found = [
        f"{path}:{name}"
        for path, name, _ in functions(CLEANING)
        if CLEANING_VERB.match(name.rpartition(".")[2]) and (path, name) not in PUBLIC_CLEAN
    ]
    for level, home in LEVELS.items():
        defined = [p for p, name, _ in functions(CLEANING) if name.rpartition(".")[2] == level]
        if defined != [home]:
            found.append(f"{level}: defined in {defined}, not once in {home}")
    return found


def test_a_round_and_a_pass_are_each_named_once():
    assert cleaning_verbs() == []


REQUEST_FIELDS = {"force", "plan", "budget"}
ROUND_AND_PASS = ("sinks/cleaner/log_cleaner.py", "sinks/cleaner/cleaner.py")


def carried_by_hand() -> list[str]:
    """Functions of the round's and the pass's modules that take a field of the round's
    request as a parameter of their own, and functions of the sink that take ``force``
    but ``clean``."""
    found = []
    for path, name, node in functions(ROUND_AND_PASS + ("sinks/sink.py",)):
        arguments = node.args
        names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
        carried = names & (REQUEST_FIELDS if path in ROUND_AND_PASS else {"force"})
        if carried and (path, name) not in PUBLIC_CLEAN:
            found.append(f"{path}:{name} takes {', '.join(sorted(carried))}")
    return found


def test_a_rounds_request_is_handed_down_as_one_value():
    assert carried_by_hand() == []
    source = "class C:\n    def clean_log(self, *, force=False): ...\n"
    tree = ast.parse(source)
    method = tree.body[0].body[0]  # type: ignore[attr-defined]
    assert CLEANING_VERB.match(method.name) and method.args.kwonlyargs[0].arg == "force"


OPTIONS_ENTRY_POINTS = {
    "sinks/sink.py": {"CompactedStateSink.__init__"},
    "sinks/reading/arrow_state.py": {"read_state", "read_state_batches"},
    "sinks/reading/lookup.py": {"lookup"},
    "sinks/reading/replay.py": {"replay", "RestoreSource.of_log"},
}
"""The public functions that take ``storage_options`` (docs/api.md, the spec): each builds
the `LogLocation` it hands down."""

OPTIONS_MODULES = {
    "sinks/log/location.py": "builds a `LogLocation` (``LogLocation.at``)",
    "sinks/log/store_options.py": "adds delta-rs's commit safety to the options",
    "sinks/log/s3a_options.py": "resolves the options from the Spark session's fs.s3a.*",
    "sinks/log/filesystems.py": "turns the options into a pyarrow file system",
    "checkpoints": "the bottom layer, below `LogLocation`: the sink builds its checkpoint "
    "tables from its location's URI and options",
}
"""Modules (or packages) whose functions take ``storage_options``, and why."""


def functions_taking_options() -> list[str]:
    """``path: Class.function`` of every library function with a ``storage_options``
    parameter outside `OPTIONS_ENTRY_POINTS` and `OPTIONS_MODULES`."""
    found = []
    for path in library_modules():
        relative = path.relative_to(ROOT).as_posix()
        if any(relative == m or relative.startswith(m + "/") for m in OPTIONS_MODULES):
            continue
        allowed = OPTIONS_ENTRY_POINTS.get(relative, set())
        for name, function in qualified_functions(ast.parse(path.read_text(), filename=relative)):
            arguments = function.args
            names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
            if "storage_options" in names and name not in allowed:
                found.append(f"{relative}: {name}")
    return found


def qualified_functions(
    tree: ast.Module,
) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function of ``tree`` with its dotted name (``Class.method``, ``f.inner``)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    pending: list[tuple[str, ast.AST]] = [("", tree)]
    while pending:
        prefix, node = pending.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found.append((name, child))
                pending.append((f"{name}.", child))
            else:
                pending.append((prefix, child))
    return found


def test_storage_options_only_where_a_location_is_built():
    assert functions_taking_options() == []


def test_every_options_entry_point_still_takes_them():
    for relative, names in OPTIONS_ENTRY_POINTS.items():
        path = ROOT / relative
        taking = {
            name
            for name, f in qualified_functions(ast.parse(path.read_text(), filename=relative))
            if "storage_options" in [a.arg for a in f.args.args + f.args.kwonlyargs]
        }
        assert names <= taking, f"{relative}: {sorted(names - taking)} take no storage_options"
    for module in OPTIONS_MODULES:
        assert (ROOT / module).exists() or (ROOT / f"{module}.py").exists(), module
    source = "class C:\n    def m(self, storage_options=None):\n        def f(): pass\n"
    assert [n for n, _ in qualified_functions(ast.parse(source))] == ["C.m", "C.m.f"]
