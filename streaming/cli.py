"""The console entry point ``compacted-sink``: jobs, the cleaner loop, status, replay, demo."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compacted-sink", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="stream keyed updates into a local compacted log")
    demo.add_argument("--lake", default="lake-demo", help="lake directory (wiped first)")
    demo.add_argument("--batches", type=int, default=30)
    demo.add_argument("--rows-per-batch", type=int, default=1_000)
    demo.add_argument("--keys", type=int, default=2_000)
    demo.add_argument("--partitions", type=int, default=4)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.command == "demo":
        return _demo(args)
    parser.error(f"unknown command {args.command}")
    return 2


def _demo(args: argparse.Namespace) -> int:
    from streaming.demo import DemoSettings, run
    from streaming.session import local_session

    settings = DemoSettings(
        lake=args.lake,
        batches=args.batches,
        rows_per_batch=args.rows_per_batch,
        keys=args.keys,
        partitions=args.partitions,
    )
    ok = run(local_session("compacted-sink-demo"), settings, out=lambda line: print(line, flush=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
