"""``configs``: a log's topic config, described or changed, as Kafka's ``kafka-configs`` does.

``compacted-sink configs --path LOG --describe`` lists every topic-level setting with its
value and where it comes from (the log, or the default). ``--alter --add-config k=v[,k=v]
--delete-config k[,k]`` changes what the log stores in one Delta commit
(`sinks.log.log_config.alter_log_config`), validated first: an unknown key or an invalid
value fails naming the key, and nothing is committed. A deleted setting goes back to its
default. A value holding commas is given in brackets, as Kafka's tool takes it:
``--add-config cleanup.policy=[compact,delete]``. ``--alter --from-describe FILE`` takes
a topic's config as ``kafka-configs --describe`` printed it (`sinks.config.parse_kafka_describe`):
the topic configs that apply here are set, Kafka's that do not (``segment.ms``,
``compression.type``, ...) are named once as ignored. Where a Kafka name means something
else here (``segment.bytes``), ``--describe`` says so beside its value. Reads and writes
Delta metadata only: no Spark session. A Delta table that is not a compacted log is
refused (`NotACompactedLogError`), as by every command.
"""

from __future__ import annotations

import argparse

from sinks.errors import ConfigError
from streaming.cli.common import check_is_log, out


def add_configs(commands: argparse._SubParsersAction) -> None:
    configs = commands.add_parser(
        "configs",
        help="describe or alter a log's topic config (Kafka's kafka-configs)",
        description="Describe or alter the topic-level settings a log stores.",
    )
    configs.add_argument("--path", required=True, metavar="LOG", help="the log's path")
    what = configs.add_mutually_exclusive_group(required=True)
    what.add_argument("--describe", action="store_true", help="list the settings and sources")
    what.add_argument("--alter", action="store_true", help="change the settings, in one commit")
    configs.add_argument(
        "--add-config",
        action="append",
        default=[],
        metavar="K=V[,K=V]",
        help="settings to set (Kafka's dotted names), e.g. delete.retention.ms=604800000",
    )
    configs.add_argument(
        "--from-describe",
        metavar="FILE",
        help="with --alter: a topic's config as `kafka-configs --describe` printed it ('-': stdin)",
    )
    configs.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="K[,K]",
        help="settings to delete: they return to their defaults",
    )
    configs.set_defaults(handler=_configs)


def parse_add_config(texts: list[str]) -> dict[str, str]:
    """``k=v,k=[a,b]`` (repeatable) as a mapping. Raises `ConfigError` naming the bad item."""
    settings: dict[str, str] = {}
    for text in texts:
        for item in _split(text):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--add-config {item!r}: expected KEY=VALUE")
            value = value.strip()
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            settings[key.strip()] = value
    return settings


def _split(text: str) -> list[str]:
    """Split on commas outside brackets."""
    items, depth, current = [], 0, []
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return [i.strip() for i in items if i.strip()]


def from_describe(text: str) -> tuple[dict[str, str], list[str]]:
    """The settings to alter from ``kafka-configs --describe`` output, and the Kafka topic
    configs in it that do not apply here (left out). Raises `ConfigError` naming a bad line
    or an unknown key. Pure."""
    from sinks.config import KAFKA_TOPIC_CONFIGS_NOT_APPLYING, parse_kafka_describe, topic_key

    settings: dict[str, str] = {}
    ignored = []
    for key, value in parse_kafka_describe(text).items():
        if key in KAFKA_TOPIC_CONFIGS_NOT_APPLYING:
            ignored.append(key)
        else:
            settings[topic_key(key)] = value
    return settings, sorted(ignored)


def _configs(args: argparse.Namespace) -> int:
    from sinks.config import MEANINGS_HERE, CleanerConfig
    from sinks.log import LogTable, alter_log_config, normalize_uri, resolve
    from sinks.log.log_config import log_config

    log = LogTable(normalize_uri(args.path))
    check_is_log(args.path)  # someone else's table or files: NotACompactedLogError
    if args.alter:
        add = parse_add_config(args.add_config)
        if args.from_describe:
            described, ignored = from_describe(_read(args.from_describe))
            add = {**described, **add}
            if ignored:
                out(f"configs: do not apply to a log on Delta, ignored: {', '.join(ignored)}")
        delete = [k for text in args.delete_config for k in _split(text)]
        if not add and not delete:
            raise ConfigError("--alter needs --add-config, --from-describe or --delete-config")
        out(f"configs: {alter_log_config(log, add=add, delete=delete).summary()}")
        return 0
    if args.add_config or args.delete_config or args.from_describe:
        raise ConfigError("--add-config, --from-describe and --delete-config go with --alter")
    snapshot = log.snapshot(verify=False)
    if snapshot is None:
        raise FileNotFoundError(f"no compacted log at {log.uri}")
    stored = log_config(snapshot)
    resolved = resolve(stored, CleanerConfig(), log_path=log.uri)
    where = "stored on the log" if stored.recorded else "not stored on the log: defaults apply"
    out(f"configs for log {log.uri} (Delta v{snapshot.version}; {where}):")
    for key, value, source in resolved.describe():
        meaning = MEANINGS_HERE.get(key)
        out(f"  {key}={value}  ({source}{'; ' + meaning if meaning else ''})")
    return 0


def _read(file: str) -> str:
    import sys
    from pathlib import Path

    return sys.stdin.read() if file == "-" else Path(file).read_text()
