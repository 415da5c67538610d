"""Fixtures of the reliability tests; helpers live in ``reliability_support`` beside this file."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from reliability_support import Oracle  # noqa: E402


@pytest.fixture
def oracle() -> Oracle:
    return Oracle()
