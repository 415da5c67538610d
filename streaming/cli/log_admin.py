"""``accept``, ``repair``, ``restore`` and ``consumers``: a log's administration, one log
at a time.

``accept`` takes another engine's change to the log's records as it is
(`CompactedStateSink.accept_foreign_changes`); ``repair`` undoes another engine's stale
rewrite, which readers only see through (`CompactedStateSink.repair`, design.md §66);
``restore`` brings the log back to a Delta version (`CompactedStateSink.restore`);
``consumers`` lists, resets or deletes the log's registered consumers, as Kafka's
``kafka-consumer-groups.sh`` does.
"""

from __future__ import annotations

import argparse

from sinks.errors import ConfigError
from streaming.cli.common import check_is_log, out


def add_accept(commands: argparse._SubParsersAction) -> None:
    accept = commands.add_parser(
        "accept", help="accept another engine's change to a log's records, and go on"
    )
    accept.add_argument("log", help="the log's path")
    accept.add_argument(
        "--through-version", type=int, help="the last version to accept (default: the current)"
    )
    accept.set_defaults(handler=_accept)


def add_repair(commands: argparse._SubParsersAction) -> None:
    repair = commands.add_parser(
        "repair", help="undo another engine's stale rewrite of a log, which reads see through"
    )
    repair.add_argument("log", help="the log's path")
    repair.set_defaults(handler=_repair)


def add_restore(commands: argparse._SubParsersAction) -> None:
    restore = commands.add_parser(
        "restore", help="restore a log to a Delta version, undoing every later commit"
    )
    restore.add_argument("log", help="the log's path")
    restore.add_argument("--to-version", type=int, required=True, help="the version to restore")
    restore.set_defaults(handler=_restore)


def add_consumers(commands: argparse._SubParsersAction) -> None:
    consumers = commands.add_parser(
        "consumers", help="a log's registered consumers: lag, tombstones held; reset, delete"
    )
    consumers.add_argument("log", help="the log's path")
    consumers.add_argument("--checkpoint-table", help="default: beside the log")
    consumers.add_argument("--consumer", metavar="ID", help="the consumer to reset or delete")
    what = consumers.add_mutually_exclusive_group()
    what.add_argument("--reset", metavar="OFFSETS", help="earliest, latest, or JSON per partition")
    what.add_argument("--delete", action="store_true", help="unregister the consumer")
    consumers.set_defaults(handler=_consumers)


def _accept(args: argparse.Namespace) -> int:
    """Accept the log's records as another engine left them (`accept_foreign_changes`)."""
    from sinks import CompactedStateSink

    version = CompactedStateSink(args.log).accept_foreign_changes(args.through_version)
    out(f"accept: {args.log}: commits through version {version} accepted as they are")
    return 0


def _repair(args: argparse.Namespace) -> int:
    """Commit the undo of the log's stale rewrites, if it has any (`LogTable.repair`)."""
    from sinks import CompactedStateSink

    log = CompactedStateSink(args.log).log_table  # refuses what is not a compacted log
    undo = log.repair()
    after = log.snapshot()
    assert after is not None
    version = after.version
    if undo is None:
        out(f"repair: {args.log}: nothing to repair (version {version})")
    else:
        out(f"repair: {args.log}: {undo.summary()} (now version {version})")
    return 0


def _restore(args: argparse.Namespace) -> int:
    """Bring the log back to ``--to-version`` (`CompactedStateSink.restore`)."""
    from sinks import CompactedStateSink

    version = CompactedStateSink(args.log).restore(args.to_version)
    out(f"restore: {args.log}: back at version {args.to_version}'s records (now version {version})")
    return 0


def _consumers(args: argparse.Namespace) -> int:
    """List a log's registered consumers, or reset or delete one (Kafka's consumer-groups)."""
    from streaming.consumers import consumer_report, delete_consumer, reset_offsets

    if (args.reset or args.delete) and not args.consumer:
        raise ConfigError("--reset and --delete need --consumer ID")
    check_is_log(args.log)
    if args.delete:
        deleted = delete_consumer(args.log, args.consumer, args.checkpoint_table)
        out(f"consumers: {args.consumer} deleted ({deleted} row(s)); it holds nothing now")
    elif args.reset:
        positions = reset_offsets(args.log, args.consumer, args.reset, args.checkpoint_table)
        out(f"consumers: {args.consumer} reset to {positions}")
    else:
        report = consumer_report(args.log, args.checkpoint_table)
        for consumer in report:
            out(consumer.line())
        if not report:
            out(f"consumers: no registered consumer reads {args.log}")
    return 0
