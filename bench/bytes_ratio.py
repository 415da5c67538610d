"""``python -m bench.bytes_ratio RESULTS.json [--out FILE]``: the sink's bytes against MERGE's,
batch by batch, measured and from first principles (issue #34 point 5, "≥ 3× fewer bytes").

The model. With ``min.cleanable.dirty.ratio`` r, a pass starts when the dirty bytes D reach
r of the log, D ≥ r/(1-r) × L (L the clean, compacted bytes), and writes about L again;
so each input byte is appended once and recopied about (1-r)/r times: the sink writes about
input / r. A MERGE rewrites every file a batch touches; with a batch of 100,000 keys spread
over every file (uniform, or Zipf through the hash permutation) that is the whole table T_n
each batch. The cumulative ratio after n batches is then about r × ΣT_k / Σb_k, and a batch's
own, in steady state, r × T_n / b. T_n is the live keys after n batches times the bytes a
live key takes in the MERGE's table: the expected distinct keys among n × records draws
(Σ_i 1 - (1 - p_i)^N over the key probabilities p_i), less the tombstoned share.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from bench.workload import _zipf_cdf

SINKS = {"compacted_sink": 0.5, "compacted_sink_dirty_075": 0.75}
MERGES = ("delta_spark_merge", "merge_per_batch")


def expected_distinct(keys: int, skew: str, draws: int) -> float:
    """The expected number of distinct keys among ``draws`` independent draws."""
    if skew == "uniform":
        return keys * -np.expm1(draws * np.log1p(-1.0 / keys))
    p = np.diff(_zipf_cdf(keys), prepend=0.0)
    return float(np.sum(-np.expm1(draws * np.log1p(-p))))


def rows(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """One row a batch: cumulative input, each system's cumulative bytes, the ratios."""
    systems = workload["systems"]
    merge = systems["delta_spark_merge"]
    batches = len(merge["per_batch"])
    batch_bytes = workload["input_bytes"] / workload["batches"]
    # Bytes a live key takes in MERGE's table, from its final table; the tombstoned share
    # of keys (a key's last record a tombstone) is the tombstone fraction.
    per_key = merge["table_bytes"] / merge["live_keys"]
    live_share = 1.0 - workload["tombstone_fraction"]
    model_table = [
        per_key
        * live_share
        * expected_distinct(
            workload["keys"], workload["skew"], (n + 1) * workload["records_per_batch"]
        )
        for n in range(batches)
    ]
    cumulative = {
        name: np.cumsum([b["bytes_written"] for b in systems[name]["per_batch"]])
        for name in (*SINKS, *MERGES)
        if name in systems
    }
    out = []
    for n in range(batches):
        row: dict[str, Any] = {
            "batch": n,
            "input_mb": (n + 1) * batch_bytes / 1e6,
            "merge_table_mb": merge["per_batch"][n]["table_bytes"] / 1e6,
            "model_table_mb": model_table[n] / 1e6,
            "merge_batch_mb": merge["per_batch"][n]["bytes_written"] / 1e6,
        }
        for name, ratio in SINKS.items():
            if name not in cumulative:
                continue
            row[f"{name}_mb"] = cumulative[name][n] / 1e6
            row[f"{name}_amp"] = cumulative[name][n] / ((n + 1) * batch_bytes)
            for other in MERGES:
                if other in cumulative:
                    row[f"{other}/{name}"] = cumulative[other][n] / cumulative[name][n]
            row[f"model/{name}"] = ratio * sum(model_table[: n + 1]) / ((n + 1) * batch_bytes)
            row[f"model_steady/{name}"] = ratio * model_table[n] / batch_bytes
        out.append(row)
    return out


def projection(workload: dict[str, Any], amplification: float, horizon: int = 400) -> int | None:
    """The first batch (0-based) at which the model's cumulative ratio reaches 3×, the sink
    writing ``amplification`` × its input, over ``horizon`` batches; None if it never does."""
    merge = workload["systems"]["delta_spark_merge"]
    per_key = merge["table_bytes"] / merge["live_keys"] * (1.0 - workload["tombstone_fraction"])
    batch_bytes = workload["input_bytes"] / workload["batches"]
    merged = 0.0
    for n in range(horizon):
        draws = (n + 1) * workload["records_per_batch"]
        merged += per_key * expected_distinct(workload["keys"], workload["skew"], draws)
        if merged / (amplification * (n + 1) * batch_bytes) >= 3.0:
            return n
    return None


def totals(workload: dict[str, Any]) -> dict[str, float]:
    """MERGE's bytes over the sink's for the whole run, the sink's drain included."""
    systems = workload["systems"]
    found = {}
    for name in SINKS:
        if name in systems:
            for other in (m for m in MERGES if m in systems):
                found[f"{other}/{name}"] = (
                    systems[other]["bytes_written"] / systems[name]["bytes_written"]
                )
    return found


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Bytes written: the sink against MERGE, batch by batch",
        "",
        "Generated by `python -m bench.bytes_ratio` from the run's results.json (model in the "
        "module's docstring). *batch*: 0-based. *cum.*: bytes written up to the end of the "
        "batch (a background pass's files count in the batch during which they appeared; "
        "the pass still running after the last batch, the drain, is in the totals only). "
        "*model*: r × ΣT_k / Σb_k with T_k the modelled live table (r = 0.5 for "
        "compacted_sink, 0.75 for compacted_sink_dirty_075); *steady*: the batch's own, "
        "r × T_n / b.",
        "",
    ]
    for workload in results["workloads"]:
        table = rows(workload)
        sinks = [n for n in SINKS if f"{n}_mb" in table[0]]
        lines += [f"## {workload['name']}", ""]
        header = ["batch", "input MB (cum.)", "MERGE table MB", "model table MB", "MERGE MB"]
        for name in sinks:
            header += [
                f"{name} MB (cum.)",
                f"delta-spark MERGE / {name} (cum.)",
                "delta-rs MERGE / same",
                "model (cum.)",
                "model (steady)",
            ]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in table:
            cells = [
                str(row["batch"]),
                f"{row['input_mb']:.0f}",
                f"{row['merge_table_mb']:.1f}",
                f"{row['model_table_mb']:.1f}",
                f"{row['merge_batch_mb']:.1f}",
            ]
            for name in sinks:
                cells += [
                    f"{row[f'{name}_mb']:.0f} ({row[f'{name}_amp']:.2f}× input)",
                    f"{row[f'delta_spark_merge/{name}']:.2f}×",
                    (
                        f"{row[f'merge_per_batch/{name}']:.2f}×"
                        if f"merge_per_batch/{name}" in row
                        else "–"
                    ),
                    f"{row[f'model/{name}']:.2f}×",
                    f"{row[f'model_steady/{name}']:.2f}×",
                ]
            lines.append("| " + " | ".join(cells) + " |")
        lines += [""]
        for key, value in totals(workload).items():
            lines.append(f"- Whole run, drain included, {key}: {value:.2f}×")
        crossing = next(
            (r["batch"] for r in table if r["delta_spark_merge/compacted_sink"] >= 3.0), None
        )
        lines.append(
            "- First batch where delta-spark MERGE / compacted_sink (cum.) ≥ 3×: "
            + (str(crossing) if crossing is not None else "none in this run")
        )
        measured = table[-1]["compacted_sink_amp"]
        for label, amplification in (("1/r = 2.00", 2.0), (f"{measured:.2f} (measured)", measured)):
            found = projection(workload, amplification)
            lines.append(
                f"- Model, the sink writing {label}× its input: cumulative ratio ≥ 3× from batch "
                + (str(found) if found is not None else "never within 400 batches")
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bytes_ratio", description=__doc__)
    parser.add_argument("results", help="a results.json written by bench.run")
    parser.add_argument("--out", default=None, help="a Markdown file (default: stdout)")
    args = parser.parse_args(argv)
    with open(args.results) as f:
        text = markdown(json.load(f))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
