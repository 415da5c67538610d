"""The log's tests import their helper modules from beside this file."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # evolution_history, beside this file
