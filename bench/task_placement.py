"""Where a Spark job's tasks ran, read from the application's monitoring REST API.

The driver's UI serves ``/api/v1/applications/<id>/...`` (``spark.ui.enabled``): ``jobs``
(each job's ``stageIds``), ``stages/<stage id>`` (the stage's attempts),
``stages/<stage id>/<attempt>/taskList`` (each task's ``executorId`` and ``host``) and
``allexecutors`` (each executor's log URLs, which on a standalone cluster point at the
web UI of the worker that launched it). The API is fed by Spark's listener bus, after
the job has returned to the driver: `tasks_of_jobs` waits until it has seen every task.

On a standalone cluster an executor's worker is found three ways, which must agree
(`executor_workers`): the worker's own JSON lists the executor under the application,
the executor's log URL is the worker's web UI, and the executor's directory
``<work dir>/<app id>/<executor id>`` is under the worker's work directory.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from bench.standalone_cluster import StandaloneWorker, get_json

TASK_LIST_LENGTH = 100_000  # the API's default page is 20 tasks
_DONE_JOBS = {"SUCCEEDED", "FAILED"}
_DONE_TASKS = {"SUCCESS", "FAILED", "KILLED"}


class SparkRest:
    """The monitoring REST API of one application, served by its driver's UI at ``ui``."""

    def __init__(self, ui: str, app_id: str) -> None:
        self.ui = ui.rstrip("/")
        self.app_id = app_id

    def get(self, path: str) -> Any:
        return get_json(f"{self.ui}/api/v1/applications/{self.app_id}/{path}", timeout_s=10)

    def last_job_id(self) -> int:
        """The highest job id so far (-1 before the first job)."""
        return max((j["jobId"] for j in self.get("jobs")), default=-1)

    def jobs_after(self, job_id: int) -> list[dict[str, Any]]:
        return sorted((j for j in self.get("jobs") if j["jobId"] > job_id), key=_job_id)

    def executors(self) -> list[dict[str, Any]]:
        """Every executor the application had, the driver included, alive or not."""
        return self.get("allexecutors")


def _job_id(job: dict[str, Any]) -> int:
    return job["jobId"]


def tasks_of_jobs(
    rest: SparkRest, jobs: Sequence[int], *, timeout_s: float = 60
) -> list[dict[str, Any]]:
    """Every task attempt of ``jobs``' stages, one dict each (job, stage, executor, times),
    once the REST API shows the jobs ended and each ran stage's tasks all finished."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks, complete = _read_tasks(rest, jobs)
        if complete:
            return tasks
        if time.monotonic() > deadline:
            raise TimeoutError(f"the REST API did not show jobs {list(jobs)} finished")
        time.sleep(0.5)


def _read_tasks(rest: SparkRest, jobs: Sequence[int]) -> tuple[list[dict[str, Any]], bool]:
    by_id = {j["jobId"]: j for j in rest.get("jobs")}
    tasks: list[dict[str, Any]] = []
    complete = True
    for job_id in jobs:
        job = by_id.get(job_id)
        if job is None or job["status"] not in _DONE_JOBS:
            return [], False
        for stage_id in job["stageIds"]:
            for stage in rest.get(f"stages/{stage_id}?details=false"):
                if stage["status"] in {"SKIPPED", "PENDING"}:
                    continue
                listed = rest.get(
                    f"stages/{stage_id}/{stage['attemptId']}/taskList?length={TASK_LIST_LENGTH}"
                )
                finished = [t for t in listed if t["status"] in _DONE_TASKS]
                if stage["status"] == "ACTIVE" or len(finished) < stage["numTasks"]:
                    complete = False
                tasks += [_task(job, stage, t) for t in listed]
    return tasks, complete


def _task(job: dict[str, Any], stage: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    metrics = task.get("taskMetrics") or {}
    return {
        "job_id": job["jobId"],
        "job_group": job.get("jobGroup"),
        "stage_id": stage["stageId"],
        "stage_attempt": stage["attemptId"],
        "stage_name": stage["name"],
        "task_id": task["taskId"],
        "index": task["index"],
        "attempt": task["attempt"],
        "status": task["status"],
        "executor_id": task["executorId"],
        "host": task["host"],
        "locality": task.get("taskLocality"),
        "launch_time": task.get("launchTime"),
        "duration_ms": task.get("duration"),
        "executor_run_time_ms": metrics.get("executorRunTime"),
        # The executor JVM's CPU only: the Python worker's time is not in it.
        "jvm_cpu_time_ms": round(metrics.get("executorCpuTime", 0) / 1e6),
    }


def tasks_per_executor(tasks: Iterable[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t["executor_id"]] = counts.get(t["executor_id"], 0) + 1
    return dict(sorted(counts.items()))


def executor_workers(
    rest: SparkRest, workers: Sequence[StandaloneWorker]
) -> dict[str, dict[str, Any]]:
    """Each executor (not the driver) with the worker that launched it, found three ways.

    Raises `AssertionError` when the three ways disagree or find no worker.
    """
    states = {w.index: (w, w.state()) for w in workers}
    placed = {}
    for executor in rest.executors():
        if executor["id"] == "driver":
            continue
        exec_id = executor["id"]
        listed = [
            w.index
            for w, state in states.values()
            for e in [*state.get("executors", []), *state.get("finishedexecutors", [])]
            if e.get("appid") == rest.app_id and str(e.get("id")) == exec_id
        ]
        log_url = (executor.get("executorLogs") or {}).get("stderr", "")
        by_log = [w.index for w in workers if log_url.startswith(f"{w.webui}/")]
        by_dir = [w.index for w in workers if (w.work_dir / rest.app_id / exec_id).is_dir()]
        assert len(listed) == 1 and listed == by_log == by_dir, (
            f"executor {exec_id}: worker JSON {listed}, log URL {by_log}, work dir {by_dir}"
        )
        worker, state = states[listed[0]]
        placed[exec_id] = {
            "worker_index": worker.index,
            "worker_id": state.get("id"),
            "worker_webui": worker.webui,
            "executor_dir": str(worker.work_dir / rest.app_id / exec_id),
            "host_port": executor.get("hostPort"),
            "cores": executor.get("totalCores"),
            "max_memory_mb": round(executor.get("maxMemory", 0) / 2**20),
            "active": executor.get("isActive"),
        }
    return dict(sorted(placed.items()))
