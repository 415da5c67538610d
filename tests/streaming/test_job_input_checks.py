"""What a job checks of its input before its query starts, and the types its files give.

Wrong ``key_columns`` (or a sequence column the input lacks) fail `start` with a
`JobConfigError` naming the job file, the key, the missing column and the input's columns,
before ``writeStream.start()``: no query checkpoint is left behind and nothing is written.
The JSON-lines ``files`` source gives ``key`` and ``value`` as BINARY, as Spark's Kafka
source and the Parquet files do, and the documents say so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pyspark.sql import types as T

from sinks.errors import JobConfigError
from streaming.inputs import kafka_shaped_files
from streaming.jobs import load_job, start

ROOT = Path(__file__).resolve().parents[2]

JOB = """
[source]
format = "files"
path = "{input}"

[sink]
path = "{lake}/users"
{sink}

[trigger]
available_now = true
"""


def _job(tmp_path: Path, sink: str):
    (tmp_path / "in").mkdir(exist_ok=True)
    lines = [{"key": "user-24", "value": "v", "partition": 0, "offset": 0, "seq": 1}]
    (tmp_path / "in" / "part-0.json").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "job.toml").write_text(
        JOB.format(input=tmp_path / "in", lake=tmp_path / "lake", sink=sink)
    )
    return load_job(tmp_path / "job.toml")


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        (
            'key_columns = ["user"]',
            "sink.key_columns: the input has no column 'user' (key_columns = ['user']); its "
            "columns are key, value, partition, offset; the query was not started and nothing "
            "was written",
        ),
        (
            'sequence_column = "seq"',  # JSON lines carry only the Kafka columns
            "sink.sequence_column: the input has no column 'seq'",
        ),
    ],
)
def test_wrong_columns_fail_before_the_query_starts(spark, tmp_path, sink, message):
    job = _job(tmp_path, sink)
    with pytest.raises(JobConfigError, match=re.escape(message)) as refused:
        start(spark, job, out=lambda line: None)
    assert str(refused.value).startswith(f"{tmp_path / 'job.toml'}: ")
    assert not (tmp_path / "lake").exists()  # no checkpoint, no log
    assert not spark.streams.active


def test_json_lines_give_binary_key_and_value_as_the_docs_say(spark, tmp_path):
    _job(tmp_path, "")
    df = kafka_shaped_files(spark, str(tmp_path / "in"), file_format="json")
    types = {f.name: f.dataType for f in df.schema.fields}
    assert types["key"] == T.BinaryType() and types["value"] == T.BinaryType()
    operations = (ROOT / "docs" / "operations.md").read_text()
    (sentence,) = re.findall(r"or `json` \(JSON lines[^)]*\)", operations)
    assert "stored as binary" in sentence, sentence
    assert "as text)" not in sentence
