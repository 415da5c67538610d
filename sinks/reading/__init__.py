"""Reading a log back: its state (latest record per key) and replay for disaster recovery."""

from sinks.errors import ReplayError
from sinks.reading.arrow_export import (
    export_state_arrow,
    verify_export_arrow,
    verify_restore_arrow,
)
from sinks.reading.export import (
    ExportReport,
    export_state,
    verify_export,
)
from sinks.reading.export_format import (
    EXACT,
    NEW_OFFSETS,
    CarriedConfig,
    is_faithful,
    read_manifest,
)
from sinks.reading.lookup import KeyLookup
from sinks.reading.replay import (
    RESTORE_APP_ID,
    RestoreSource,
    check_target,
    replay,
)
from sinks.reading.state_reader import spark_state

__all__ = [
    "EXACT",
    "NEW_OFFSETS",
    "RESTORE_APP_ID",
    "CarriedConfig",
    "ExportReport",
    "KeyLookup",
    "ReplayError",
    "RestoreSource",
    "check_target",
    "export_state",
    "export_state_arrow",
    "is_faithful",
    "read_manifest",
    "replay",
    "spark_state",
    "verify_export",
    "verify_export_arrow",
    "verify_restore_arrow",
]
