"""Fixtures for the log's tests: DuckDB's Delta reader, an engine independent of this project."""

from __future__ import annotations

import glob
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # evolution_history, beside this file


@pytest.fixture(scope="session")
def duckdb_delta():
    """A DuckDB connection with the ``delta`` extension loaded (``delta_scan(path)``)."""
    duckdb = pytest.importorskip("duckdb")
    import duckdb_ext  # the extension's wheel (duckdb-ext-delta): no download at test time

    root = list(duckdb_ext.__path__)[0]
    found = glob.glob(os.path.join(root, "extensions", "*", "*", "delta.duckdb_extension"))
    assert found, "duckdb-ext-delta is installed but its extension file is missing"
    connection = duckdb.connect()
    connection.execute(f"LOAD '{found[0]}'")
    yield connection
    connection.close()
