"""What the sub-commands of ``compacted-sink`` share: exit codes, output lines, options, a session.

Results go to stdout (`out`), progress lines to stderr (`err`). `session` is the one
place a command gets Spark: a Spark Connect session for ``--remote`` (or
``SPARK_REMOTE``), else the active one, else a local one; commands that read Delta
metadata only never call it.
"""

from __future__ import annotations

import argparse
import re
import sys

from sinks.errors import ConfigError

EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C ended


def out(line: str) -> None:
    print(line, flush=True)


def err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def add_log_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="*", help="log paths")
    parser.add_argument(
        "--config", action="append", default=[], help="job file(s) naming logs and their settings"
    )
    parser.add_argument(
        "--checkpoint-table",
        action="append",
        default=[],
        help="every log registered in this cleaner-offset checkpoint table",
    )


def add_remote(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--remote",
        metavar="URL",
        help="a Spark Connect server, sc://host:port (Databricks Connect: "
        "sc://<workspace>:443/;token=…;x-databricks-cluster-id=…); default: $SPARK_REMOTE",
    )


def remote_url(args: argparse.Namespace) -> str | None:
    import os

    from streaming.jobs.session import REMOTE_ENV

    return getattr(args, "remote", None) or os.environ.get(REMOTE_ENV) or None


def session(app: str, args: argparse.Namespace | None = None):
    """A Spark Connect session (--remote, SPARK_REMOTE); else the active one; else local."""
    url = remote_url(args) if args is not None else None
    if url:
        from streaming.jobs import remote_session

        try:
            return remote_session(url, app)
        except (ImportError, ValueError) as e:
            raise ConfigError(f"--remote {url}: {e}") from e
    from sinks.spark_session import active_session

    try:
        return active_session()
    except RuntimeError:
        pass
    from streaming.jobs import local_session

    return local_session(app)


def check_is_log(path: str) -> None:
    """Raise `NotACompactedLogError` when ``path`` holds a Delta table that is not a
    compacted log, or no Delta table but files the sink did not write: the check every
    command makes before it reads or writes a log (`sinks.log.ownership`; a missing or
    empty path is left to the command). Reads Delta metadata (or one LIST) only."""
    from sinks.log import LogTable, check_log_location, normalize_uri

    check_log_location(LogTable(normalize_uri(path)).location)


def refs(args: argparse.Namespace):
    """The logs a command's log selection names (`streaming.jobs.registry.discover_logs`)."""
    from streaming.jobs import discover_logs

    return discover_logs(
        paths=args.logs, job_files=args.config, checkpoint_tables=args.checkpoint_table
    )


def as_of(text: str | None):
    """``--as-of``: a Delta version when all digits, else a timestamp; None for now."""
    if text is None:
        return None
    return int(text) if text.isdigit() else text


_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)): ?(.*)$"
)
# What Spark and py4j wrap a Python error in: never the cause itself.
_WRAPPERS = ("PythonException", "Py4JJavaError", "Py4JException", "StreamingQueryException")


def python_cause(text: str) -> str | None:
    """The Python exception at the root of a Spark or py4j error's text, as Python prints its
    last line (``OverflowError: date value out of range``); None when the text holds no
    Python traceback. Pure.

    A foreachBatch function that raises reaches the driver as a `StreamingQueryException`
    around py4j's "An exception was raised by the Python Proxy. Return Message: Traceback
    ...", and an error in a Python worker (``mapInArrow``) as a ``PythonException`` holding
    that worker's traceback inside it: the root is the last exception line after the last
    traceback that is not one of those wrappers.
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if _TRACEBACK in line]
    for start in reversed(starts):
        found = None
        for line in lines[start + 1 :]:
            if line.startswith((" ", "\t")):
                continue
            match = _EXCEPTION_LINE.match(line.strip())
            if match and match.group(1).rsplit(".", 1)[-1] not in _WRAPPERS:
                found = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}".rstrip(
                    ": "
                )
        if found is not None:
            return found
    return None
