"""Reading a log back: its state (latest record per key) and replay for disaster recovery."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.lazy_names import lazy_names

if TYPE_CHECKING:
    from sinks.errors import ReplayError
    from sinks.log.log_format import RESTORE_APP_ID
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
    from sinks.reading.lookup import KeyLookup, wanted_keys
    from sinks.reading.replay import RestoreSource, check_target, replay
    from sinks.reading.state_reader import spark_state

_MODULE_OF = {
    "CarriedConfig": "sinks.reading.export_format",
    "EXACT": "sinks.reading.export_format",
    "ExportReport": "sinks.reading.export",
    "KeyLookup": "sinks.reading.lookup",
    "NEW_OFFSETS": "sinks.reading.export_format",
    "RESTORE_APP_ID": "sinks.log.log_format",
    "ReplayError": "sinks.errors",
    "RestoreSource": "sinks.reading.replay",
    "check_target": "sinks.reading.replay",
    "export_state": "sinks.reading.export",
    "export_state_arrow": "sinks.reading.arrow_export",
    "is_faithful": "sinks.reading.export_format",
    "read_manifest": "sinks.reading.export_format",
    "replay": "sinks.reading.replay",
    "spark_state": "sinks.reading.state_reader",
    "verify_export": "sinks.reading.export",
    "verify_export_arrow": "sinks.reading.arrow_export",
    "wanted_keys": "sinks.reading.lookup",
    "verify_restore_arrow": "sinks.reading.arrow_export",
}
"""Each name and its module, imported on first use: the Arrow readers import modules of
this package, whose Spark modules they must not import (design.md §59)."""


__getattr__ = lazy_names(__name__, globals(), _MODULE_OF)


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
    "wanted_keys",
]
