"""Keeping a log healthy for months: retention and startup recovery.

`retention` ports Kafka's time, size and log-start-offset retention (whole
files removed from the log); `recovery` ports the checks a broker makes when it
opens a log (orphan files, the cleaner checkpoint, offsets).
"""

from sinks.maintenance.recovery import RecoveryReport, recover_log
from sinks.maintenance.retention import RetentionPlan, apply_retention, delete_records

__all__ = ["RecoveryReport", "RetentionPlan", "apply_retention", "delete_records", "recover_log"]
