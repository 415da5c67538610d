"""Benchmarks: the compacted-state sink against what a user would pick instead.

``python -m bench.run`` runs, in one process and on the same generated
workload, the sink (hook plus automatic cleaning), per-batch MERGE through
delta-rs, a per-batch full rewrite in Spark and append-only ingestion, then
measures one cleaning pass against the I/O floor. Not part of ``make test``.
"""
