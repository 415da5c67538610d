"""Names a package loads on first use: how the Arrow readers stay free of pyspark.

A package whose modules partly need Spark (`sinks`, `sinks.cleaner`, `sinks.reading`)
re-exports its names through `lazy_names`: a module-level ``__getattr__`` that imports a
name's module when the name is first asked for, and binds every name of that module in the
package at once (importing a submodule binds its own name in the package, ``replay`` the
module, over the function of that name). The Arrow readers import modules of these packages
without importing their Spark modules (design.md §59).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str,
    namespace: dict[str, Any],
    module_of: Mapping[str, str],
    *,
    before: Callable[[], object] | None = None,
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package`` (whose globals are ``namespace``): each name of
    ``module_of`` imported from its module on first use; ``before`` runs first (a check
    that raises by name, e.g. no pyspark)."""

    def load(name: str) -> Any:
        home = module_of.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before is not None:
            before()
        module = importlib.import_module(home)
        namespace.update({n: getattr(module, n) for n, h in module_of.items() if h == home})
        return namespace[name]

    return load
