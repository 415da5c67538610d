"""Which pyspark this interpreter would import, found without importing it (design.md §59).

``import sinks`` must not import pyspark: the Arrow readers (``read_state``, ``lookup``)
run in services and on laptops that have no Spark, and where one is installed its import
costs half a second and starts nothing the readers use. Yet a pyspark older than 3.5
must still stop the import at once, naming the supported range, as `sinks.spark_compat`
does when Spark is used. So the version is read from the module's files
(``pyspark/version.py``, else ``__version__`` in ``pyspark/__init__.py``); only a module
whose files say neither is imported to ask it.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

from sinks.errors import SparkVersionError

MIN_VERSION: tuple[int, int] = (3, 5)
SUPPORTED = "pyspark 3.5 to 4.x"
INSTALL = (
    "Use the Spark your platform provides (its runtime's pyspark, databricks-connect or "
    "pyspark-client), or on a machine without one: pip install 'compacted-sink[spark]'."
)

_VERSION_LINE = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""", re.M)


def version_tuple(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``3.5.9`` or ``4.1.0.dev0``."""
    major, minor = (text.split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def no_pyspark_error(cause: str = "no pyspark module is installed") -> SparkVersionError:
    """The error of a Spark feature used where no pyspark module is installed."""
    return SparkVersionError(
        "compacted-sink", MIN_VERSION, f"It runs on {SUPPORTED}. {INSTALL}", found=cause
    )


def check_version(text: str) -> tuple[int, int]:
    """The ``(major, minor)`` of pyspark version ``text``; `SparkVersionError` naming the
    supported range when it is older than `MIN_VERSION`."""
    version = version_tuple(text)
    if version < MIN_VERSION:
        raise SparkVersionError(
            "compacted-sink",
            MIN_VERSION,
            f"It runs on {SUPPORTED}: upgrade the Spark it runs on, or install it into an "
            f"environment with a supported one ({INSTALL})",
        )
    return version


def found_pyspark_version() -> str | None:
    """The version of the ``pyspark`` module an import would find; None when there is none.
    Imports it only when its files do not say."""
    try:
        spec = importlib.util.find_spec("pyspark")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():
        for name in ("version.py", "__init__.py"):
            try:
                found = _VERSION_LINE.search((Path(folder) / name).read_text())
            except OSError:
                continue
            if found:
                return found.group(1)
    return str(importlib.import_module("pyspark").__version__)


def refuse_an_old_pyspark() -> None:
    """Raise `SparkVersionError` when a pyspark older than `MIN_VERSION` is installed; no
    pyspark is fine (the Arrow readers need none)."""
    text = found_pyspark_version()
    if text is not None:
        check_version(text)
