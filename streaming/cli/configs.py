"""``configs``: a log's topic config, described or changed, as Kafka's ``kafka-configs`` does.

``compacted-sink configs --path LOG --describe`` lists every topic-level setting with its
value and where it comes from (the log, or the default). ``--alter --add-config k=v[,k=v]
--delete-config k[,k]`` changes what the log stores in one Delta commit
(`sinks.log.log_config.alter_log_config`), validated first: an unknown key or an invalid
value fails naming the key, and nothing is committed. A deleted setting goes back to its
default. A value holding commas is given in brackets, as Kafka's tool takes it:
``--add-config cleanup.policy=[compact,delete]``. Reads and writes Delta metadata only:
no Spark session.
"""

from __future__ import annotations

import argparse

from sinks.errors import ConfigError
from streaming.cli.common import out


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


def _configs(args: argparse.Namespace) -> int:
    from sinks.config import CleanerConfig, resolve
    from sinks.log import LogTable, alter_log_config, normalize_uri
    from sinks.log.log_config import log_config

    log = LogTable(normalize_uri(args.path))
    if args.alter:
        add = parse_add_config(args.add_config)
        delete = [k for text in args.delete_config for k in _split(text)]
        if not add and not delete:
            raise ConfigError("--alter needs --add-config or --delete-config")
        out(f"configs: {alter_log_config(log, add=add, delete=delete).summary()}")
        return 0
    if args.add_config or args.delete_config:
        raise ConfigError("--add-config and --delete-config go with --alter")
    snapshot = log.snapshot(verify=False)
    if snapshot is None:
        raise FileNotFoundError(f"no compacted log at {log.uri}")
    stored = log_config(snapshot)
    resolved = resolve(stored, CleanerConfig(), log_path=log.uri)
    where = "stored on the log" if stored.recorded else "not stored on the log: defaults apply"
    out(f"configs for log {log.uri} (Delta v{snapshot.version}; {where}):")
    for key, value, source in resolved.describe():
        out(f"  {key}={value}  ({source})")
    return 0
