"""Keeping a log healthy for months: retention, startup recovery and file deletion.

`retention` ports Kafka's time, size and log-start-offset retention (whole
files removed from the log); `recovery` ports the checks a broker makes when it
opens a log (orphan files, the cleaner checkpoint, offsets); `segment_deleter`
ports Kafka's asynchronous segment deletion (files out of the log longer than
``file.delete.delay.ms`` leave storage), with `file_inventory` saying what is on
disk against what the log uses.
"""

from sinks.maintenance.file_inventory import FileInventory, take_inventory
from sinks.maintenance.recovery import RecoveryReport, recover_log
from sinks.maintenance.retention import RetentionPlan, apply_retention, delete_records
from sinks.maintenance.segment_deleter import DeletionReport, SegmentDeleter, delete_expired_files

__all__ = [
    "DeletionReport",
    "FileInventory",
    "RecoveryReport",
    "RetentionPlan",
    "SegmentDeleter",
    "apply_retention",
    "delete_expired_files",
    "delete_records",
    "recover_log",
    "take_inventory",
]
