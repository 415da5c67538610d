"""results.json, RESULTS.md and the per-batch cost plot, from the figures `bench.run` gathered."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

from pyspark.sql import SparkSession

SYSTEM_ORDER = (
    "compacted_sink",
    "compacted_sink_inline",
    "compacted_sink_not_niced",
    "compacted_sink_dirty_075",
    "compacted_sink_dirty_020",
    "delta_spark_merge",
    "merge_per_batch",
    "rewrite_per_batch",
    "sink_cleaning_off",
    "append_only",  # sink_cleaning_off's name in results before 24 November 2026
    "delta_spark_append",
    "spark_parquet",
)
# What each system is, for RESULTS.md.
SYSTEM_NOTES = {
    "compacted_sink": "this sink, as the foreachBatch hook, cleaning in the background",
    "delta_spark_merge": "foreachBatch + delta-spark `MERGE INTO` (batch deduped in Spark, "
    "tombstones deleted, idempotent via the session's txnAppId/txnVersion)",
    "merge_per_batch": "foreachBatch + delta-rs MERGE, the batch deduped in Spark and "
    "collected to Arrow (`toArrow`)",
    "delta_spark_append": 'Spark\'s own Delta append (`df.write.format("delta").mode("append")`, '
    "txnAppId/txnVersion): the append floor",
    "spark_parquet": "Spark's plain Parquet append of the batch (no Delta)",
    "compacted_sink_dirty_075": "this sink with `min.cleanable.dirty.ratio` 0.75 "
    "(a user's tuning, as in Kafka): fewer bytes written, a longer log to replay",
    "compacted_sink_dirty_020": "this sink with `min.cleanable.dirty.ratio` 0.2: "
    "more passes, a state read within 1.25x of a compacted table's",
}
PLOT = "per_batch_cost.png"


def versions(spark: SparkSession) -> dict[str, str]:
    java = spark.sparkContext._jvm.java.lang.System.getProperty("java.version")  # type: ignore[union-attr]
    found = {"python": platform.python_version(), "spark": spark.version, "java": str(java)}
    for package in ("pyspark", "deltalake", "pyarrow", "numpy", "pandas", "matplotlib"):
        found[package] = version(package)
    return found


GOAL_KEYS = 1_000_000


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, with the measured figure and pass/miss.

    At 1e6 keys (the 512 B workloads are the goals' own; the 35 B ones are kept for
    comparison): ingest and bytes against MERGE, flat per-batch cost, replay against
    append-only. On every workload: the sink's p99 batch within 1.5× of append-only's
    and its dirty ratio held near ``min.cleanable.dirty.ratio`` (0.5); on the 35 B
    workloads its median batch within 1.15× of append-only's. Then the pass's efficiency.
    """
    rows = []
    for w in results["workloads"]:
        s = _systems(w)
        # The issue sets these at 1e6 keys x 512 B; the 35 B rows compare with earlier runs.
        aside = "(35 B, comparison) " if w.get("record_size", "35B") == "35B" else ""
        sink, merge, append = (
            s.get("compacted_sink"),
            s.get("merge_per_batch"),
            s.get("sink_cleaning_off") or s.get("append_only"),
        )
        if "delta_spark_merge" in s:
            rows += baseline_goals(w)
            continue
        if w["keys"] >= GOAL_KEYS and sink and merge:
            speed = merge["ingest_s"] / sink["ingest_s"]
            rows.append(
                _goal(w, aside + "ingest ≥ 2× faster than MERGE", f"{speed:.2f}×", speed >= 2)
            )
            fewer = merge["bytes_written"] / sink["bytes_written"]
            rows.append(
                _goal(w, aside + "≥ 3× fewer bytes than MERGE", f"{fewer:.2f}×", fewer >= 3)
            )
        if w["keys"] >= GOAL_KEYS and sink:
            growth = half_growth(sink["per_batch"])
            rows.append(
                _goal(
                    w,
                    aside + "per-batch cost flat (last half / first half ≤ 1.1)",
                    f"{growth:.2f} (mean batch seconds, background passes' load included)",
                    growth <= 1.1,
                )
            )
        if w["keys"] >= GOAL_KEYS and sink and append:
            faster = append["replay_s"] / sink["replay_s"]
            rows.append(
                _goal(
                    w, aside + "replay ≥ 5× faster than append-only", f"{faster:.2f}×", faster >= 5
                )
            )
        for goal, system in (
            ("p99 batch ≤ 1.5× append-only's", sink),
            (
                "(comparison) p99 batch ≤ 1.5× append-only's with log.cleaner.nice 0",
                s.get("compacted_sink_not_niced"),
            ),
        ):
            if system and append and "p99_batch_s" in system:
                p99 = system["p99_batch_s"] / append["p99_batch_s"]
                measured = (
                    f"{p99:.2f}× ({system['p99_batch_s']:.2f} s vs {append['p99_batch_s']:.2f} s)"
                )
                rows.append(_goal(w, goal, measured, p99 <= 1.5))
        ratios = steady_dirty_ratios((sink or {}).get("per_batch", []))
        if ratios:
            rows.append(
                _goal(
                    w,
                    "dirty ratio held near 0.5 (median ≤ 0.6 at batch ends, after the first pass)",
                    f"median {statistics.median(ratios):.2f}, max {max(ratios):.2f}",
                    statistics.median(ratios) <= 0.6,
                )
            )
        if w.get("record_size", "35B") == "35B" and sink and append:
            median = sink["p50_batch_s"] / append["p50_batch_s"] if "p50_batch_s" in sink else 0
            rows.append(
                _goal(
                    w,
                    "median batch ≤ 1.15× append-only's",
                    f"{median:.2f}× ({sink.get('p50_batch_s', 0):.2f} s vs "
                    f"{append.get('p50_batch_s', 0):.2f} s)",
                    0 < median <= 1.15,
                )
            )
    cleaner = results.get("cleaner")
    if cleaner:
        rows.append(
            {
                "workload": cleaner.get("source", ""),
                "goal": "cleaning pass efficiency ≥ 0.6",
                "measured": f"{cleaner['efficiency']:.2f}",
                "met": cleaner["efficiency"] >= 0.6,
            }
        )
    return rows


def baseline_goals(w: dict[str, Any]) -> list[dict[str, Any]]:
    """#34 point 5 and #33 point 2 on one workload run beside the delta-spark baselines:
    ingest and bytes against delta-spark MERGE and delta-rs MERGE fed from Spark, the
    sink's p99 batch against Spark's Delta append; and, for comparison, #33 point 1's
    median and p99 batch against Spark's plain Parquet write."""
    s = _systems(w)
    sink = s.get("compacted_sink")
    if not sink:
        return []
    rows = []
    for merge, label, times in (
        ("delta_spark_merge", "delta-spark MERGE", 2.0),
        ("merge_per_batch", "delta-rs MERGE fed from Spark", 1.0),
    ):
        other = s.get(merge)
        if not other:
            continue
        speed = other["ingest_s"] / sink["ingest_s"]
        rows.append(
            _goal(
                w,
                f"ingest ≥ {times:g}× {label}",
                f"{speed:.2f}× ({sink['ingest_s']:.0f} s vs {other['ingest_s']:.0f} s)",
                speed >= times,
            )
        )
        fewer = other["bytes_written"] / sink["bytes_written"]
        rows.append(
            _goal(
                w,
                f"≥ 3× fewer bytes written than {label}",
                f"{fewer:.2f}× ({sink['bytes_written'] / 1e6:.0f} MB vs "
                f"{other['bytes_written'] / 1e6:.0f} MB)",
                fewer >= 3,
            )
        )
    for floor, goal, ratio, key in (
        ("delta_spark_append", "p99 batch ≤ 1.2× Spark's Delta append", 1.2, "p99_batch_s"),
        (
            "spark_parquet",
            "(#33 pt 1, comparison) median batch ≤ 1.1× Spark's Parquet write",
            1.1,
            "p50_batch_s",
        ),
        (
            "spark_parquet",
            "(#33 pt 1, comparison) p99 batch ≤ 1.2× Spark's Parquet write",
            1.2,
            "p99_batch_s",
        ),
    ):
        other = s.get(floor)
        if not other:
            continue
        measured = sink[key] / other[key]
        rows.append(
            _goal(
                w,
                goal,
                f"{measured:.2f}× ({sink[key]:.2f} s vs {other[key]:.2f} s)",
                measured <= ratio,
            )
        )
    return rows


def steady_dirty_ratios(per_batch: list[dict[str, Any]]) -> list[float]:
    """The log's dirty ratio at the end of each batch from the one where the first pass ended.

    Before the first pass the whole log is dirty (ratio 1.0): that says nothing about
    how well background passes keep up.
    """
    first = next((i for i, b in enumerate(per_batch) if "clean" in b), None)
    if first is None:
        return []
    return [b["dirty_ratio"] for b in per_batch[first:] if "dirty_ratio" in b]


def half_growth(per_batch: list[dict[str, Any]]) -> float:
    """Mean batch seconds of the second half of the run over the first (batch 0 left out)."""
    times = [b["s"] for b in per_batch[1:]]
    if len(times) < 2:
        return 1.0
    half = len(times) // 2
    return statistics.fmean(times[half:]) / statistics.fmean(times[:half])


def _goal(w: dict[str, Any], goal: str, measured: str, met: bool) -> dict[str, Any]:
    return {"workload": w["name"], "goal": goal, "measured": measured, "met": met}


def cycles(per_batch: list[dict[str, Any]]) -> list[tuple[int, int, float]]:
    """(first batch, last batch, seconds per batch) of each cleaning cycle of the sink.

    A cycle is the batches after one pass up to and including the next pass: the
    appends that made the log dirty and the pass that cleaned them, which is the
    cost a batch really carries. Batch 0 is left out (JVM and Python-worker
    warm-up); batches after the last pass close no cycle yet.
    """
    found, start, spent = [], 1, 0.0
    for b in per_batch[1:]:
        spent += b["s"]
        if "clean" in b:
            found.append((start, b["batch"], spent / (b["batch"] - start + 1)))
            start, spent = b["batch"] + 1, 0.0
    return found


def cost_growth(per_batch: list[dict[str, Any]]) -> float:
    """How much a batch's cost grew over the run: late against early, passes amortized.

    With passes: mean per-batch cost of the cleaning cycles (`cycles`) that end
    in the second half of the run over those that end in the first half. Without
    (every other system): mean batch seconds of the last third over the first.
    """
    middle = len(per_batch) / 2
    found = cycles(per_batch)
    early = [c for _, last, c in found if last < middle]
    late = [c for _, last, c in found if last >= middle]
    if early and late:
        return statistics.fmean(late) / statistics.fmean(early)
    times = [b["s"] for b in per_batch[1:]]
    third = max(1, len(times) // 3)
    return statistics.fmean(times[-third:]) / statistics.fmean(times[:third])


def append_seconds(per_batch: list[dict[str, Any]]) -> list[float]:
    """Each batch's seconds without the pass it ran (the append alone)."""
    return [
        b["s"]
        - (
            0.0
            if b.get("clean", {}).get("background")
            else b.get("clean", {}).get("duration_s", 0.0)
        )
        for b in per_batch
    ]


def write(results: dict[str, Any], out: str) -> None:
    results["goals"] = goals(results)
    results["generated_utc"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=False)
    plot(results, os.path.join(out, PLOT))
    text = markdown(results)
    previous = results.get("previous")
    if previous:
        text += earlier_run(previous, out)
    with open(os.path.join(out, "RESULTS.md"), "w") as f:
        f.write(text)


def _under(out: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(out, path)


def keep_earlier(path: str, out: str) -> str:
    """``path`` itself, or, when it is the ``results.json`` this run will write over, a copy
    of it named by the day it was generated (``results-YYYY-MM-DD.json``), made now."""
    source = _under(out, path)
    if os.path.abspath(source) != os.path.abspath(os.path.join(out, "results.json")):
        return path
    with open(source) as f:
        day = json.load(f)["generated_utc"][:10]
    kept = f"results-{day}.json"
    shutil.copyfile(source, os.path.join(out, kept))
    return kept


def earlier_run(path: str, out: str) -> str:
    """The earlier run's RESULTS.md, kept below the new one with its headings one level down."""
    with open(_under(out, path)) as f:
        earlier = json.load(f)
    earlier.setdefault("goals", goals(earlier))
    body = markdown(earlier).split("\n", 1)[1]  # its own title goes
    body = "\n".join("#" + line if line.startswith("#") else line for line in body.split("\n"))
    # The earlier run's plot was drawn over by the new one: its figures stay in the tables.
    body = body.replace(f"![per-batch cost]({PLOT})", "(plot: see git history of bench/)")
    return (
        "\n---\n\n# Earlier run (kept for comparison; its figures are in "
        f"[{os.path.basename(path)}]({os.path.basename(path)}))\n" + body
    )


def plot(results: dict[str, Any], path: str) -> None:
    """Top row: batch wall time against table size; bottom row: against the batch number.

    Batch 0 is left out (JVM and Python-worker warm-up). Rings mark the sink's
    batches that ran a cleaning pass (the hook cleans in the same call).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = results["workloads"]
    fig, axes = plt.subplots(2, len(workloads), figsize=(5.5 * len(workloads), 8), squeeze=False)
    for column, w in enumerate(workloads):
        by_size, by_batch = axes[0][column], axes[1][column]
        for name in SYSTEM_ORDER:
            system = _systems(w).get(name)
            if not system:
                continue
            batches = system["per_batch"][1:]
            x = [b["table_bytes"] / 1e6 for b in batches]
            n = [b["batch"] for b in batches]
            y = [b["s"] for b in batches]
            points = by_size.scatter(x, y, s=12, label=name)
            color = points.get_facecolor()[0]
            by_batch.plot(n, y, marker=".", linewidth=1, color=color, label=name)
            rings = [i for i, b in enumerate(batches) if "clean" in b]
            if rings:
                for ax, xs in ((by_size, x), (by_batch, n)):
                    ax.scatter(
                        [xs[i] for i in rings],
                        [y[i] for i in rings],
                        s=60,
                        facecolors="none",
                        edgecolors=[color],
                        label=f"{name}: batch with a pass" if ax is by_size else None,
                    )
        title = f"{w['name']} ({w['batches']} × {w['records_per_batch']:,} records)"
        by_size.set_title(title)
        by_size.set_xlabel("table size after the batch (MB)")
        by_batch.set_xlabel("batch")
        for ax in (by_size, by_batch):
            ax.set_ylabel("batch wall time (s)")
            ax.grid(True, alpha=0.3)
    for ax in axes[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(results: dict[str, Any]) -> str:
    quick = " --quick" if results["mode"] == "quick" else ""
    lines = [
        "# Benchmark results",
        "",
        f"Generated {results['generated_utc']} by `python -m bench.run{quick}` "
        f"in {results['total_s'] / 60:.1f} min."
        + (
            " **This run is new**; the earlier run's figures are kept below it."
            if results.get("previous")
            else ""
        ),
        "",
        f"- Machine: {results['machine']}",
        f"- Load before: `{results['load_before']}`",
        f"- Load after: `{results['load_after']}`",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()),
        "- Spark: local[2], 2 shuffle partitions, zstd Parquet everywhere; sink with "
        "`min.cleanable.dirty.ratio` 0.5 and default `segment.bytes` (128 MiB).",
        "- Peak RSS: `VmHWM` reset before each system; *driver* is the Python process "
        "(delta-rs MERGE runs there), *JVM* is Spark's driver/executor JVM (its heap does not "
        "shrink, so it mostly reflects the largest job so far), *worker* the largest Python "
        "worker.",
        "- Bytes written: every byte of every file that appeared under the system's directory "
        "(data, Delta log, the sink's checkpoint table); write amplification = bytes written / "
        "input Parquet bytes.",
        *[f"- Note: {note}" for note in results.get("notes", [])],
        *[
            f"- System `{name}`: {SYSTEM_NOTES[name]}."
            for name in SYSTEM_ORDER
            if name in SYSTEM_NOTES and any(name in _systems(w) for w in results["workloads"])
        ],
        "",
        "## Goals",
        "",
        "| workload | goal | measured | met |",
        "|---|---|---|---|",
    ]
    for g in results.get("goals", []):
        lines.append(
            f"| {g['workload']} | {g['goal']} | {g['measured']} "
            f"| {'yes' if g['met'] else '**no**'} |"
        )
    for w in results["workloads"]:
        lines += [
            "",
            f"## {w['name']}: {w['keys']:,} keys, {w['skew']}, {w['batches']} batches × "
            f"{w['records_per_batch']:,} records of {w.get('record_size', '35B')}, "
            f"{w['tombstone_fraction']:.0%} tombstones",
            "",
            f"Input: {w['input_bytes'] / 1e6:.1f} MB of Parquet. Final states agree across "
            f"systems (count + checksum): {'yes' if w['states_agree'] else '**NO**'}. "
            f"History: {_records(w):,} records for {_live(w):,} live keys "
            f"({_records(w) / max(1, _live(w)):.1f}×), the ceiling of what compaction can "
            "save a replay.",
            "",
            "| system | ingest s | p50 batch s | p99 batch s | drain s | cost growth late / early "
            "| MB written | write amp. | table MB | files | replay s "
            "| peak RSS MB driver / JVM / worker | live keys |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name in SYSTEM_ORDER:
            s = _systems(w).get(name)
            if not s:
                continue
            median = statistics.median(b["s"] for b in s["per_batch"][1:] or s["per_batch"])
            lines.append(
                f"| {name} | {s['ingest_s']:.1f} | {s.get('p50_batch_s', median):.2f} "
                f"| {s.get('p99_batch_s', 0):.2f} | {s.get('drain_s', 0):.2f} "
                f"| {half_growth(s['per_batch']):.2f} | {s['bytes_written'] / 1e6:.1f} "
                f"| {s['write_amplification']:.2f} | {s['table_bytes'] / 1e6:.1f} | {s['files']} "
                f"| {s['replay_s']:.2f} | {s['peak_rss_mb']:.0f} / {s['jvm_peak_rss_mb']:.0f} / "
                f"{s['worker_peak_rss_mb']:.0f} | {s['live_keys']:,} |"
            )
        sink = _systems(w).get("compacted_sink")
        if sink:
            lines += _passes(sink)
    cleaner = results.get("cleaner")
    if cleaner:
        lines += [
            "",
            f"## Cleaner: one pass vs the I/O floor ({cleaner['source']}, never-cleaned log)",
            "",
            f"A forced pass over the append-only log: {cleaner['segments_read']} files, "
            f"{cleaner['bytes_read'] / 1e6:.1f} MB, {cleaner['records_read']:,} records read; "
            f"{cleaner['records_written']:,} records ({cleaner['bytes_written'] / 1e6:.1f} MB) "
            f"kept in {cleaner['segments_written']} file(s).",
            "",
            "| pass s | floor s | efficiency (floor / pass) | runs: pass / floor |",
            "|---|---|---|---|",
            f"| {cleaner['pass_s']:.2f} | {cleaner['floor_s']:.2f} | {cleaner['efficiency']:.2f} "
            f"| {', '.join(f'{x:.1f}' for x in cleaner['pass_runs_s'])} / "
            f"{', '.join(f'{x:.1f}' for x in cleaner['floor_runs_s'])} |",
        ]
    lines += [
        "",
        "## Per-batch cost against table size",
        "",
        f"![per-batch cost]({PLOT})",
        "",
        "Analysis, profiles and proposed fixes: [ANALYSIS.md](ANALYSIS.md) (in `bench/`).",
        "",
    ]
    return "\n".join(lines)


def _passes(sink: dict[str, Any]) -> list[str]:
    passes = [b for b in sink["per_batch"] if "clean" in b]
    if not passes:
        return []
    appends = append_seconds(sink["per_batch"])[1:]
    third = max(1, len(appends) // 3)
    lines = [
        "",
        "Appends alone (pass time taken out), median s: first third "
        f"{statistics.median(appends[:third]):.2f}, last third "
        f"{statistics.median(appends[-third:]):.2f}.",
        "",
        "Cleaning cycles (the batches after a pass up to the next pass, which cleans them): "
        + ", ".join(
            f"{first}–{last}: {cost:.2f} s/batch" for first, last, cost in cycles(sink["per_batch"])
        )
        + ".",
        "",
        f"Cleaning passes of the sink ({len(passes)}; *batch*: the batch in which the pass "
        "ended, on the cleaner thread when cleaning runs in the background), and what each "
        "recopied (every file below the first uncleanable offset is rewritten):",
        "",
        "| batch | pass s | MB read | of which clean MB | clean files | clean files with no "
        "superseded key | MB written | records read → kept |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b in passes:
        c = b["clean"]
        r = c.get("recopy", {})
        lines.append(
            f"| {b['batch']} | {c['duration_s']:.2f} | {c['bytes_read'] / 1e6:.1f} "
            f"| {r.get('clean_bytes_read', 0) / 1e6:.1f} | {r.get('clean_files_read', '')} "
            f"| {r.get('clean_files_without_superseded_key', '')} "
            f"| {c['bytes_written'] / 1e6:.1f} | {c['records_read']:,} → {c['records_written']:,} |"
        )
    return lines


def _systems(w: dict[str, Any]) -> dict[str, Any]:
    return w["systems"]


def _records(w: dict[str, Any]) -> int:
    return w["batches"] * w["records_per_batch"]


def _live(w: dict[str, Any]) -> int:
    return max((s["live_keys"] for s in _systems(w).values()), default=0)
