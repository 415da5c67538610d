"""What the sink needs from a SparkSession, on a classic session and on Spark Connect.

A `foreachBatch` function under Spark Connect runs in a Python process beside the
server with a Connect session: no `SparkContext`, no JVM gateway, no local
properties. Everything the sink asks of a session goes through here, so the rest
of the code never touches ``sparkContext``:

- `active_session`: the session a sink method without a DataFrame argument uses;
- `default_parallelism`: how many tasks run at once (a probe job under Connect);
- `warn_unsafe_beside_delta_spark`: says once (a paragraph per process, a line per further
  log) when the session's delta-spark could
  overwrite the sink's commits (`sinks.log.delta_spark_policy.unsafe_beside_delta_spark`);
- `hadoop_settings`: the session's Hadoop settings under a prefix (``fs.s3a.``), read
  once when a sink opens its log, so a lake configured in Spark is configured once;
- `streaming_query_id`: which streaming query runs a batch, the scope of the
  sink's exactly-once app id. A classic session says it in a local property; a
  Connect ``foreachBatch`` function is told nothing about its query (its session
  is a clone with no query id, no checkpoint location and no active queries), so
  the id is read from the query's checkpoint, which the sink must be given.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sinks.errors import QueryIdentityError
from sinks.log.delta_spark_policy import delta_spark_conf_keys, unsafe_beside_delta_spark
from sinks.log.location import LogLocation
from sinks.log.uris import join, normalize_uri
from sinks.warn_once import first_time

logger = logging.getLogger("compacted_sink")

QUERY_ID_PROPERTY = "sql.streaming.queryId"
# Rows of the probe job: enough that every slice of the range holds one.
_PROBE_ROWS = 1 << 16

_parallelism: dict[str, int] = {}
_parallelism_lock = threading.Lock()


def warn_unsafe_beside_delta_spark(spark: SparkSession, uri: str) -> str | None:
    """Log a warning when ``spark`` has delta-spark with a log store whose commits can
    overwrite the sink's on ``uri``'s store; the warning, or None. Called where the sink
    writes (an append), never where it only reads.

    The paragraph (the race and what to do) is said once per process; another log under an
    unsafe store gets one line naming it and its log store; a log already named, nothing.
    A warning rather than a refusal: delta-spark reading the log, or writing it while no
    sink commits, is safe, and the session cannot tell which it will do.
    """
    if not first_time(("delta-spark log store", uri)):
        return None
    conf = {key: spark.conf.get(key, None) for key in delta_spark_conf_keys(uri)}
    warning = unsafe_beside_delta_spark(uri, conf)
    if warning is None:
        return None
    if not first_time("delta-spark log store race"):
        race, _, _ = warning.partition(". A delta-spark commit")
        warning = f"{race}: the same race as the warning above says (said once per process)"
    logger.warning("%s", warning)
    return warning


def is_connect(spark: SparkSession) -> bool:
    """True when ``spark`` is a Spark Connect session (no SparkContext behind it)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def active_session() -> SparkSession:
    """The active (else default) session of this thread, classic or Spark Connect.

    ``SparkSession.active()`` looks only at Connect sessions once the process is in
    Connect mode (``SPARK_CONNECT_MODE_ENABLED``, set by ``builder.remote(...)`` and
    in the Connect server's Python workers), and only at classic ones otherwise;
    this asks the kind the process is in first, then the other.
    """
    from pyspark.sql.utils import is_remote

    kinds = [_connect_active, _classic_active]
    for find in kinds if is_remote() else reversed(kinds):
        session = find()
        if session is not None:
            return session
    raise RuntimeError("no active SparkSession: create one (classic or Spark Connect) first")


def _classic_active() -> SparkSession | None:
    try:
        from pyspark.sql.utils import is_remote_only
    except ImportError:  # pyspark 3.5: no Connect-only distribution, classic sessions exist
        pass
    else:
        if is_remote_only():
            return None
    session = SparkSession._instantiatedSession  # type: ignore[attr-defined]
    active = SparkSession._activeSession  # type: ignore[attr-defined]
    for candidate in (active, session):
        if candidate is not None and candidate._sc._jsc is not None:
            return candidate
    return None


def _connect_active() -> SparkSession | None:
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # the Connect client's packages are not installed
        return None
    active = ConnectSession.getActiveSession()
    if active is not None:
        return active
    default = getattr(ConnectSession, "_get_default_session", None)
    if default is not None:
        return default()
    # pyspark 3.5 keeps the default session in an attribute, and no stopped flag
    return getattr(ConnectSession, "_default_session", None)


def hadoop_settings(
    spark: SparkSession, prefix: str, passwords: Iterable[str] = ()
) -> dict[str, str]:
    """The Hadoop settings whose names start with ``prefix``, as the session's own file
    systems see them (full names, values as strings).

    Classic session: the session's Hadoop configuration (the cluster's ``core-site.xml``,
    ``spark.hadoop.*`` given at start, ``sparkContext.hadoopConfiguration()`` changes, then
    the session's own ``spark.conf.set(name, ...)``); the names in ``passwords`` are read
    through ``Configuration.getPassword``, so a secret kept in a Hadoop credential provider
    counts. Spark Connect: none. Its client has no JVM, and the server neither returns nor
    keeps an ``fs.s3a.*`` name the client sets (pyspark 4.3: ``getAll`` leaves it out,
    ``get`` answers ``SQL_CONF_NOT_FOUND``); what ``getAll`` does return passes
    ``spark.redaction.regex``, which masks secrets.
    """
    if is_connect(spark):
        return {}
    jvm = spark._jvm  # type: ignore[attr-defined]
    with _py4j_quiet():  # its DEBUG lines would show every value read, secrets included
        hadoop_conf = spark._jsparkSession.sessionState().newHadoopConf()  # type: ignore[attr-defined]
        found = {prefix + k: str(v) for k, v in hadoop_conf.getPropsWithPrefix(prefix).items()}
        for name in passwords:
            password = hadoop_conf.getPassword(name)
            if password is not None:
                found[name] = str(jvm.java.lang.String(password))
    return found


@contextmanager
def _py4j_quiet() -> Iterator[None]:
    """Py4J's loggers above DEBUG for the block: they log each answer from the JVM whole."""
    loggers = [logging.getLogger(n) for n in ("py4j", "py4j.clientserver", "py4j.java_gateway")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def default_parallelism(spark: SparkSession) -> int:
    """How many tasks the cluster runs at once (Spark's ``defaultParallelism``).

    Under Connect: ``spark.default.parallelism`` when set, else counted once per
    session by a probe job (``spark.range`` slices its rows by the default
    parallelism; the highest partition id tells how many there are).
    """
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        return int(configured)
    session_id = str(getattr(spark, "session_id", id(spark)))
    with _parallelism_lock:
        known = _parallelism.get(session_id)
    if known is not None:
        return known
    ids = spark.range(_PROBE_ROWS).select(F.spark_partition_id().alias("p"))
    row = ids.agg(F.max("p").alias("p")).first()
    counted = int(row["p"]) + 1 if row is not None and row["p"] is not None else 1
    with _parallelism_lock:
        _parallelism[session_id] = counted
    return counted


def streaming_query_id(
    spark: SparkSession,
    batch_id: int,
    *,
    checkpoint_location: LogLocation | str | None = None,
    explicit_sink_id: bool = False,
) -> str | None:
    """The id of the streaming query running ``batch_id``; None for a direct call.

    Classic session: the local property ``sql.streaming.queryId`` that Spark sets
    on the thread running the batch. Spark Connect has none, and tells a
    ``foreachBatch`` function nothing about its query; only the process shows it:
    the function runs in the server's foreachBatch worker (`in_foreach_batch_worker`),
    a direct call runs in the client. In the worker the id is the one the query
    keeps in ``<checkpoint_location>/metadata``, and the checkpoint must hold
    ``offsets/<batch_id>`` (the query plans a batch there before running it), which
    shows the checkpoint is the running query's. Without a checkpoint location the
    worker accepts an explicit sink id as the whole identity, and refuses otherwise
    (`QueryIdentityError` says what to set): a query restarted from a fresh
    checkpoint numbers its batches from 0 again, and only the query id tells those
    batches from the old query's committed ones.
    """
    if not is_connect(spark):
        return spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    if not in_foreach_batch_worker():
        return None
    if checkpoint_location is not None:
        return checkpoint_query_id(checkpoint_location, batch_id)
    if explicit_sink_id:
        return None
    raise QueryIdentityError(
        "under Spark Connect a foreachBatch function is not told which streaming query "
        f"runs batch {batch_id}, so the sink cannot tell a restarted query (whose committed "
        "batches it must skip) from a query on a fresh checkpoint (whose batch ids restart "
        "at 0). Set checkpoint_location= on the sink to the query's checkpointLocation "
        "(exactly once across restarts, and a fresh checkpoint is a new query), or give an "
        "explicit sink_id= that names this query alone (a new sink_id for every fresh "
        "checkpoint)"
    )


def in_foreach_batch_worker() -> bool:
    """True in the Python process where a Spark Connect server runs ``foreachBatch`` functions.

    That process runs pyspark's ``foreach_batch_worker`` module as ``__main__``; the
    server also gives its Python workers ``SPARK_CONNECT_LOCAL_URL``, which a
    client never has. Either sign counts, so a worker is never taken for a client.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", "") or ""
    return name.endswith("foreach_batch_worker") or "SPARK_CONNECT_LOCAL_URL" in os.environ


def checkpoint_query_id(checkpoint_location: LogLocation | str, batch_id: int) -> str:
    """The query id a streaming checkpoint records, checked to have planned ``batch_id``.

    Raises `QueryIdentityError` when the checkpoint has no ``metadata`` or no
    ``offsets/<batch_id>`` (not this query's checkpoint, or a direct call).
    """
    checkpoint = LogLocation.of(checkpoint_location)
    location = normalize_uri(checkpoint.uri)
    fs, root = replace(checkpoint, uri=location).filesystem()
    metadata = join(root, "metadata")
    try:
        with fs.open_input_stream(metadata) as f:
            text = f.read().decode()
        query_id = json.loads(text.splitlines()[0])["id"]
    except (FileNotFoundError, OSError, ValueError, KeyError, IndexError) as e:
        raise QueryIdentityError(
            f"checkpoint_location {location}: no readable streaming query metadata at "
            f"{join(location, 'metadata')} ({e}); it must be the checkpointLocation of the "
            "query that runs this sink"
        ) from e
    offsets = fs.get_file_info(join(root, "offsets", str(batch_id)))
    if offsets.type.name == "NotFound":
        raise QueryIdentityError(
            f"checkpoint_location {location} (query {query_id}) has not planned batch "
            f"{batch_id} (no {join(location, 'offsets', str(batch_id))}): it is not the "
            "checkpoint of the query running this batch, or the hook was called directly "
            "(give a direct call a sink without checkpoint_location and an explicit sink_id)"
        )
    return str(query_id)
