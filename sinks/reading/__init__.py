"""Reading a log back: its state (latest record per key) and replay for disaster recovery."""

from sinks.reading.replay import (
    ExportReport,
    ReplayError,
    RestoreSource,
    export_state,
    restore,
    verify_export,
)
from sinks.reading.state_reader import read_state

__all__ = [
    "ExportReport",
    "ReplayError",
    "RestoreSource",
    "export_state",
    "read_state",
    "restore",
    "verify_export",
]
