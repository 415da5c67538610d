"""Reading a log back: its state (latest record per key) and replay for disaster recovery."""

from sinks.reading.export import (
    ExportReport,
    export_state,
    verify_export,
)
from sinks.reading.export_format import (
    ReplayError,
)
from sinks.reading.replay import (
    RestoreSource,
    replay,
)
from sinks.reading.state_reader import spark_state

__all__ = [
    "ExportReport",
    "ReplayError",
    "RestoreSource",
    "export_state",
    "replay",
    "spark_state",
    "verify_export",
]
