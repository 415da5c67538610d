"""Jobs: a job file, the query it starts, its session, the registered logs and their cleaner loop.

`job`: the TOML job file; `runner`: the streaming query it describes; `session`:
a local or a Spark Connect session; `registry`: which logs a command works on;
`registered_logs_cleaner`: the ``clean`` command's loop over them; `demo`: the demo job.
"""

from sinks.errors import JobConfigError
from streaming.jobs.demo import DemoSettings
from streaming.jobs.job import JobConfig, LogSpec, load_job, parse_job
from streaming.jobs.registered_logs_cleaner import RegisteredLogsCleaner
from streaming.jobs.registry import LogRef, discover_logs
from streaming.jobs.runner import InFlightHook, start
from streaming.jobs.session import local_session, remote_session

__all__ = [
    "DemoSettings",
    "InFlightHook",
    "JobConfig",
    "JobConfigError",
    "LogRef",
    "LogSpec",
    "RegisteredLogsCleaner",
    "discover_logs",
    "load_job",
    "local_session",
    "parse_job",
    "remote_session",
    "start",
]
