"""The console entry point ``compacted-sink``: jobs, the cleaner loop, status, export, replay, demo.

Usable as a Databricks python-wheel task (entry point ``compacted-sink``, the
subcommand and its options as parameters): inside a cluster the active
SparkSession is used; with ``--remote sc://…`` (or ``SPARK_REMOTE``) a Spark
Connect session (Databricks Connect too); elsewhere a local one is started. Results go to stdout,
progress lines to stderr. Exit codes: 0 done, 1 failed (or a verification did
not match), 2 bad configuration (the message names the key and the file), 130
interrupted (Ctrl-C). A
failing command prints one line, ``compacted-sink <command>: <what went wrong>``;
``--verbose`` adds the traceback.

Commands that only read Delta metadata or the state (``status``, ``lookup``, ``export``,
``clean --once`` when nothing is cleanable) start no Spark session: they use
delta-rs and pyarrow (`sinks.read_state`).

Each sub-command lives in a module of this package that adds its parser and
handles it: ``run`` and ``demo`` in `query`, ``clean`` and ``vacuum`` in
`cleaning`, ``accept``, ``repair``, ``restore`` and ``consumers`` in `log_admin`, ``status`` in
`status`, ``lookup`` in `lookup` (binary keys and values as text: `binary_text`),
``configs`` in `configs`, ``export`` and ``replay`` in
`recovery`; what they share is in `common`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable, Sequence

from sinks.errors import CompactedSinkError, ConfigError
from streaming.cli import cleaning, configs, erasure, log_admin, lookup, query, recovery, status
from streaming.cli.common import EXIT_CONFIG, EXIT_FAILED, EXIT_INTERRUPTED, python_cause

_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    query.add_run,
    cleaning.add_clean,
    cleaning.add_vacuum,
    log_admin.add_accept,
    log_admin.add_repair,
    log_admin.add_restore,
    log_admin.add_consumers,
    status.add_status,
    lookup.add_lookup,
    erasure.add_erase,
    erasure.add_erasure_status,
    configs.add_configs,
    recovery.add_export,
    recovery.add_replay,
    query.add_demo,
)
"""Each sub-command's parser, in the order ``--help`` lists them."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print(f"compacted-sink {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # every failure ends as one line (and an exit code)
        print(f"compacted-sink {args.command}: {failure_message(e)}", file=sys.stderr)
        if args.verbose:
            traceback.print_exc()
        return EXIT_CONFIG if isinstance(e, ConfigError) else EXIT_FAILED


def failure_message(error: BaseException) -> str:
    """One line for ``error``: the sink's own message, or the first line of anything else.

    Spark's errors carry their logical plan and JVM stack after the first line;
    an error a Spark job raised from this package's code is reported by that
    error's own message (the class name and text Spark quotes in its first lines),
    any other Python error under py4j's or Spark's wrapping by its own last line
    (`streaming.cli.common.python_cause`).
    """
    if isinstance(error, ConfigError):
        return f"configuration error: {error}"
    if isinstance(error, CompactedSinkError):
        return f"{type(error).__name__}: {error}"
    text = str(error).strip()
    for line in text.splitlines():
        for name in _SINK_ERRORS:
            marker = f"{name}: "
            if marker in line:
                return f"{name}: {line.split(marker, 1)[1].strip()}"
    cause = python_cause(text)
    if cause is not None:
        return cause
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _sink_error_names() -> tuple[str, ...]:
    import sinks

    return tuple(
        name
        for name in sinks.__all__
        if isinstance(getattr(sinks, name), type)
        and issubclass(getattr(sinks, name), CompactedSinkError)
    )


_SINK_ERRORS = _sink_error_names()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compacted-sink",
        description="Run, clean, inspect, export and replay compacted logs.",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print the traceback of a failure too"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_subcommand in _SUBCOMMANDS:
        add_subcommand(commands)
    return parser
