"""Commits other engines make to a log, in one place.

The log is a plain Delta table, so Spark's Delta, Databricks or delta-rs may
commit to it. `commits` reads each commit the sink did not make and tells a
rearrangement (same records) from a change of records; `stale_rewrites` and
`stale_revert` find and undo a rearrangement planned before one of the sink's
rewrites; `rearrangement` absorbs another engine's files into segments on the
next pass; `changes` is the way on after a change of records: accept, or restore.
"""
