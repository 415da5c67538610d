"""Start a streaming job, kill it mid-stream, restart it, then replay the state elsewhere.

Run from the repository root::

    .venv/bin/python examples/kill_and_replay.py [--dir /tmp/kill-and-replay]

1. Writes Kafka-shaped Parquet files (2 partitions, keyed updates, some tombstones).
2. Starts ``compacted-sink run job.toml`` (one file per micro-batch) and kills it
   with SIGKILL once a few batches are committed.
3. Restarts the same job: it resumes from its checkpoint, writing every record
   exactly once (the sink skips batch ids it already committed).
4. Exports ``state()`` to Avro, verifies the export, replays it into a new log,
   and checks the new log's ``state()`` against a plain dict replay of the input.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from deltalake import DeltaTable

from streaming.inputs.kafka import write_kafka_files

ROOT = Path(__file__).resolve().parents[1]
FILES, ROWS, KEYS = 12, 500, 300
JOB = """
[source]
format = "files"
path = "input"
max_files_per_trigger = 1

[sink]
path = "lake/users"
key_columns = ["key"]
checkpoint_location = "lake/_chk/users"

[cleaner]
"min.cleanable.dirty.ratio" = 0.5
"""


def write_input(directory: Path) -> dict[bytes, bytes]:
    """The input files; returns the state a plain replay of them gives."""
    batches = []
    offsets = [0, 0]
    state: dict[bytes, bytes] = {}
    n = 0
    for _ in range(FILES):
        rows = []
        for _ in range(ROWS):
            key_id = n * 7919 % KEYS
            key, partition = f"user-{key_id}".encode(), key_id % 2
            value = None if n % 20 == 19 else f"v{n}".encode()
            rows.append(
                {
                    "key": key,
                    "value": value,
                    "topic": "users",
                    "partition": partition,
                    "offset": offsets[partition],
                    "timestamp": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=n),
                    "timestampType": 0,
                }
            )
            offsets[partition] += 1
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
            n += 1
        batches.append(rows)
    write_kafka_files(directory, batches)
    return state


def appended_batches(log: Path) -> int:
    try:
        history = DeltaTable(str(log)).history()
    except Exception:
        return 0
    return sum(1 for c in history if (c.get("compactedSink") or {}).get("operation") == "append")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "streaming.cli", *args]
    print(f"$ compacted-sink {' '.join(args)}", flush=True)
    done = subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True)
    for line in done.stderr.splitlines():
        if not _spark_noise(line):
            print(f"  {line}", flush=True)
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        raise SystemExit(f"compacted-sink {args[0]} failed with exit code {done.returncode}")
    return done


def _spark_noise(line: str) -> bool:
    """Spark's own start-up and log4j lines, as opposed to the command's progress lines."""
    noise = ("Using Spark's", "Setting default log level", "To adjust logging", "WARNING: ")
    return line.startswith(noise) or " WARN " in line or line.startswith("\t") or not line.strip()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/kill-and-replay")
    parser.add_argument("--kill-after", type=int, default=3, help="batches before SIGKILL")
    args = parser.parse_args()
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    expected = write_input(work / "input")
    (work / "job.toml").write_text(JOB)
    print(f"{FILES} input files of {ROWS} records over {KEYS} keys in {work / 'input'}")

    print("$ compacted-sink run job.toml   (continuous; killed mid-stream)", flush=True)
    job = subprocess.Popen(
        [sys.executable, "-m", "streaming.cli", "run", "job.toml"],
        cwd=work,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    while appended_batches(work / "lake" / "users") < args.kill_after:
        if job.poll() is not None:
            raise SystemExit("the job ended before it could be killed")
        time.sleep(0.5)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    print(f"killed the job (SIGKILL) after {appended_batches(work / 'lake' / 'users')} batches")

    (work / "job.toml").write_text(JOB + "\n[trigger]\navailable_now = true\n")
    cli("run", "job.toml", cwd=work)
    print(f"restarted: {appended_batches(work / 'lake' / 'users')} batches appended in all")
    cli("status", "--config", "job.toml", cwd=work)
    cli("export", "lake/users", "--to", "export", "--codec", "deflate", "--verify", cwd=work)
    cli("replay", "export", "--to", "lake/users-restored", "--verify", cwd=work)

    sys.path.insert(0, str(ROOT))
    from sinks import CompactedStateSink
    from streaming.jobs.session import local_session

    local_session("kill-and-replay-check")
    restored = CompactedStateSink(str(work / "lake" / "users-restored"), key_columns=("key",))
    state = {bytes(r["key"]): bytes(r["value"]) for r in restored.state().collect()}
    verdict = "matches" if state == expected else "DOES NOT match"
    print(f"restored state(): {len(state)} keys; {verdict} a dict replay of all input records")
    return 0 if state == expected else 1


if __name__ == "__main__":
    sys.exit(main())
