"""How the clients of an object store retry a failed request: one set of options for both.

Both clients retry a failed request by themselves, and one set of options tunes
both (`s3_retry_settings`): delta-rs's object_store retries 5xx answers (500, 503
SlowDown), connection errors and timeouts with exponential backoff (``max_retries``,
default 10; ``retry_timeout``, default 3 min; ``timeout``, the per-request timeout,
default 30 s; ``connect_timeout``, default 5 s); pyarrow's S3 file system is given the
AWS standard retry strategy with as many attempts (``max_retries`` + 1; pyarrow's own
default is 3) and the same connect timeout. What neither can retry is a request that
reached the store and whose answer was lost: a commit's conditional PUT then meets
its own commit (412), which `sinks.log.log_table` recognises by the commit's token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sinks.errors import ConfigError
from sinks.log.durations import duration_seconds
from sinks.log.store_options import store_option

DEFAULT_MAX_RETRIES = 10
"""object_store's default ``max_retries``; pyarrow is given as many (its own default is 2)."""


@dataclass(frozen=True)
class RetrySettings:
    """How a client retries a failed request: delta-rs's option names, pyarrow's units."""

    max_retries: int
    timeout_s: float | None
    connect_timeout_s: float | None


def s3_retry_settings(options: Mapping[str, str]) -> RetrySettings:
    """The retry settings ``options`` give (delta-rs's names: ``max_retries``, ``timeout``,
    ``connect_timeout``), with object_store's defaults. Raises `ConfigError` naming a bad key.

    pyarrow applies ``timeout`` only on Windows and macOS; on Linux its AWS SDK gives up
    on a request that receives nothing for 3 s and retries it.
    """
    raw = store_option(options, "s3", "max_retries")
    try:
        max_retries = DEFAULT_MAX_RETRIES if raw is None else int(raw)
        if max_retries < 0:
            raise ValueError(raw)
    except ValueError:
        raise ConfigError(f"max_retries: {raw!r} is not a number of retries (0 or more)") from None
    return RetrySettings(
        max_retries=max_retries,
        timeout_s=_seconds(options, "timeout"),
        connect_timeout_s=_seconds(options, "connect_timeout"),
    )


def _seconds(options: Mapping[str, str], name: str) -> float | None:
    raw = store_option(options, "s3", name)
    return None if raw is None else duration_seconds(name, raw)
