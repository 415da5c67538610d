"""``status``: Kafka's cleaner gauges per log and partition, as a table, JSON or a plot.

Reads Delta metadata and the checkpoint table only: no Spark session. The gauges
are measured by `streaming.status.gauges` and `streaming.status.status_history`, and drawn by
`streaming.status.status_render`. Each log is measured under its own topic config (a job
file's settings override it), and the report says where each value comes from.
"""

from __future__ import annotations

import argparse

from streaming.cli.common import EXIT_FAILED, add_log_selection, add_remote, err, out, refs


def add_status(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser("status", help="cleaner gauges per log and partition")
    add_log_selection(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument("--plot", metavar="FILE.png", help="draw dirty ratio and size over time")
    add_remote(status)
    status.set_defaults(handler=_status)


def _status(args: argparse.Namespace) -> int:
    from sinks.log import normalize_uri
    from streaming.status import history, log_status, plot_history, render_json, render_table
    from streaming.status.status_render import check_plotting

    if args.plot:
        check_plotting()  # before any work: matplotlib is an extra
    selected = refs(args)
    found = {normalize_uri(ref.spec.path) for ref in selected}
    missing = [path for path in args.logs if normalize_uri(path) not in found]
    sinks = [ref.sink() for ref in selected]  # each applies its log's topic config
    statuses = []
    for ref, sink in zip(selected, sinks, strict=True):
        status = log_status(sink, settings_inferred=ref.inferred)
        if status is not None:
            statuses.append(status)
        else:
            missing.append(ref.spec.path)
    if missing and not statuses:
        raise FileNotFoundError(f"no compacted log at {', '.join(missing)}")
    out(render_json(statuses) if args.json else render_table(statuses))
    if missing:
        err(f"status: no compacted log at {', '.join(missing)}")
        return EXIT_FAILED
    if args.plot:
        series = {sink.path: history(sink) for sink in sinks}
        ratios = {sink.config.min_cleanable_dirty_ratio for sink in sinks}
        plot_history(series, args.plot, threshold=ratios.pop() if len(ratios) == 1 else None)
        err(f"status: plot written to {args.plot}")
    return 0
