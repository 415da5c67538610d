"""``clean`` and ``vacuum``: Kafka's ``CleanerThread`` and its segment deletion, run by hand.

``clean`` runs `streaming.jobs.registered_logs_cleaner.RegisteredLogsCleaner` over the selected
logs: clean the filthiest, then back off. ``clean --once`` starts no Spark session when no log is
cleanable (measuring reads Delta metadata only). ``vacuum`` deletes every file out of
the log longer than ``file.delete.delay.ms`` now, call by call until none is left.
"""

from __future__ import annotations

import argparse

from streaming.cli.common import add_log_selection, add_remote, err, out, refs, session


def add_clean(commands: argparse._SubParsersAction) -> None:
    clean = commands.add_parser(
        "clean", help="clean the filthiest logs, then back off (Kafka's CleanerThread)"
    )
    add_log_selection(clean)
    clean.add_argument("--once", action="store_true", help="clean each cleanable log once, exit")
    clean.add_argument("--force", action="store_true", help="clean any cleanable bytes")
    clean.add_argument(
        "--vacuum", action="store_true", help="delete expired files now, not only when due"
    )
    clean.add_argument(
        "--backoff-ms",
        type=int,
        default=None,
        help="log.cleaner.backoff.ms (default: each log's, 15000)",
    )
    add_remote(clean)
    clean.set_defaults(handler=_clean)


def add_vacuum(commands: argparse._SubParsersAction) -> None:
    vacuum = commands.add_parser(
        "vacuum", help="delete files out of the log longer than file.delete.delay.ms, now"
    )
    add_log_selection(vacuum)
    vacuum.set_defaults(handler=_vacuum)


def _clean(args: argparse.Namespace) -> int:
    from streaming.jobs import RegisteredLogsCleaner

    selected = refs(args)
    thread = RegisteredLogsCleaner(
        selected, force=args.force, vacuum=args.vacuum, backoff_ms=args.backoff_ms, out=out
    )
    for ref in selected:
        if ref.inferred:
            stored = thread.sinks[ref.spec.path].log_config.recorded
            settings = "the log's" if stored else "defaults (not stored on the log)"
            err(
                f"clean: {ref.spec.path}: no job file given; key columns "
                f"{list(ref.spec.key_columns)} as the log records them, cleaner settings: "
                f"{settings}"
            )
    if args.once and thread.grab_filthiest() is None:
        # Measuring needs Delta metadata only: no Spark session for a round with no pass.
        thread.delete_expired_files()
        for line in thread.idle_reasons():
            out(line)
        return 0
    session("compacted-sink-clean", args)
    if args.once:
        thread.run_once()
        return 0
    err(f"clean: cleaning {len(selected)} log(s); backing off {thread.backoff_ms} ms when idle")
    try:
        thread.run()
    except KeyboardInterrupt:
        pass
    return 0


def _vacuum(args: argparse.Namespace) -> int:
    """Delete every expired file of each log and its checkpoint table, bounded call by call."""
    for ref in refs(args):
        sink = ref.sink()
        if sink.log_table.snapshot() is None:
            continue
        while True:
            report = sink.vacuum()
            out(report.summary())
            if not report.left_for_next_call:
                break
    return 0
