"""delta-spark on a session beside the sink: what puts it there, and when the two can race.

The sink's put-if-absent keeps its own commits from overwriting anyone's, but not another
engine's from overwriting the sink's: delta-spark beside the sink is safe only with a log
store that is put-if-absent across processes (`unsafe_beside_delta_spark` names the ones that
are not, docs/operations.md, "Two engines committing at once"). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sinks.log.uris import Store, store_of

DELTA_SPARK_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_SPARK_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
DELTA_SPARK_CONF = {  # what puts delta-spark on a session
    "spark.sql.extensions": DELTA_SPARK_EXTENSION,
    "spark.sql.catalog.spark_catalog": DELTA_SPARK_CATALOG,
}
DELTA_SPARK_LOG_STORE = "spark.delta.logStore.{}.impl"
DELTA_SPARK_LOG_STORE_CLASS = "spark.delta.logStore.class"
_DELTA_SPARK_SCHEMES: dict[Store, tuple[str, ...]] = {
    "local": ("file",),
    "s3": ("s3", "s3a", "s3n"),
    "gcs": ("gs",),
    "azure": ("abfs", "abfss", "adl", "wasb", "wasbs"),
}
# What delta-spark 4.4 uses when no log store is configured (its DelegatingLogStore).
_DELTA_SPARK_DEFAULT = {"local": "HDFSLogStore", "s3": "S3SingleDriverLogStore"}
# Log stores whose commit files another process (the sink's delta-rs) can race, and why.
_UNSAFE_LOG_STORES: dict[tuple[Store, str], str] = {
    ("s3", "S3SingleDriverLogStore"): (
        "checks that a commit file is absent and then PUTs it unconditionally, which is "
        "exclusive only among the writers of one Spark driver"
    ),
    ("s3", "S3DynamoDBLogStore"): (
        "makes a commit exclusive through a DynamoDB table that delta-rs 1.x, the sink's "
        "committer, no longer uses, and then PUTs it unconditionally"
    ),
    ("local", "HDFSLogStore"): (
        "checks that a commit file is absent and then renames over it (the local file "
        "system's rename replaces a file), which is exclusive only inside its own JVM"
    ),
    ("local", "LocalLogStore"): (
        "checks that a commit file is absent and then renames over it, which is exclusive "
        "only inside its own JVM"
    ),
}


def unsafe_beside_delta_spark(uri: str, spark_conf: Mapping[str, str | None]) -> str | None:
    """Why delta-spark, as ``spark_conf`` sets it up, and the sink committing to ``uri`` at
    the same time can overwrite one another's commits; None when the session has no
    delta-spark, or its log store for the store of ``uri`` is put-if-absent across processes
    (GCS and Azure's, a custom one). Pure.

    ``spark_conf`` holds the session's ``spark.sql.extensions``,
    ``spark.sql.catalog.spark_catalog`` and delta-spark's log store keys
    (`delta_spark_conf_keys`); the sink's own commits are put-if-absent
    (`delta_storage_options`), so only delta-spark's side decides.
    """
    if not has_delta_spark(spark_conf):
        return None
    store = store_of(uri)
    unsafe: dict[str, list[str]] = {}  # log store -> the schemes it serves
    for scheme in _DELTA_SPARK_SCHEMES[store]:
        configured = spark_conf.get(DELTA_SPARK_LOG_STORE.format(scheme)) or spark_conf.get(
            DELTA_SPARK_LOG_STORE_CLASS
        )
        log_store = (configured or _DELTA_SPARK_DEFAULT.get(store, "")).rsplit(".", 1)[-1]
        if (store, log_store) in _UNSAFE_LOG_STORES:
            unsafe.setdefault(log_store, []).append(scheme)
    if not unsafe:
        return None
    reasons = "; ".join(
        f"its log store for {_paths(store, schemes)} ({log_store}) "
        f"{_UNSAFE_LOG_STORES[(store, log_store)]}"
        for log_store, schemes in unsafe.items()
    )
    return (
        f"log {uri}: this session has delta-spark, and {reasons}. A delta-spark commit "
        "(append, OPTIMIZE, DELETE, ...) made while the sink commits to this log can overwrite "
        "the sink's commit, and a batch or a pass is then lost without an error. Reading with "
        "delta-spark is safe; let it write to this log only while no sink or cleaner commits "
        'to it (see docs/operations.md, "Two engines committing at once").'
    )


def has_delta_spark(spark_conf: Mapping[str, str | None]) -> bool:
    """Whether session settings (``DELTA_SPARK_CONF``'s keys) put delta-spark on it. Pure."""
    extensions = spark_conf.get("spark.sql.extensions") or ""
    catalog = spark_conf.get("spark.sql.catalog.spark_catalog") or ""
    return DELTA_SPARK_EXTENSION in extensions or catalog == DELTA_SPARK_CATALOG


def _paths(store: Store, schemes: Iterable[str]) -> str:
    return "a local path" if store == "local" else ", ".join(f"{s}://" for s in schemes)


def delta_spark_conf_keys(uri: str) -> list[str]:
    """The session settings `unsafe_beside_delta_spark` reads for ``uri``."""
    schemes = _DELTA_SPARK_SCHEMES[store_of(uri)]
    return [
        *DELTA_SPARK_CONF,
        DELTA_SPARK_LOG_STORE_CLASS,
        *(DELTA_SPARK_LOG_STORE.format(s) for s in schemes),
    ]
