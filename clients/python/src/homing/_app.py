"""`App`: the registry of a program's tasks, and the client calls (`enqueue`, `get`, `wait`,
`cancel`, schedules, workflows) that any Python program uses to hand work to homing and read
what became of it."""

from __future__ import annotations

import importlib
import inspect
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Optional, TypeVar, Union, overload
from urllib.parse import quote

from ._errors import ApiError
from ._http import Http, check_token

DEFAULT_URL = "http://127.0.0.1:8787"
TERMINAL = frozenset({"succeeded", "failed", "dead", "cancelled"})

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Job:
    """A job as the server stores it (`GET /v1/jobs/{id}`); `raw` keeps every field."""

    id: str
    task: str
    queue: str
    state: str
    args: Any
    result: Any
    error: Optional[str]
    attempts: int
    crashes: int
    epoch: int
    progress: Any
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Job:
        return cls(
            id=str(d["id"]),
            task=str(d["task"]),
            queue=str(d["queue"]),
            state=str(d["state"]),
            args=d.get("args"),
            result=d.get("result"),
            error=d.get("error"),
            attempts=int(d.get("attempts", 0)),
            crashes=int(d.get("crashes", 0)),
            epoch=int(d.get("epoch", 0)),
            progress=d.get("progress"),
            raw=d,
        )


@dataclass(frozen=True)
class NewWorkflow:
    """A workflow just created: its id and each step's job id by step name."""

    id: str
    steps: dict[str, str]


@dataclass(frozen=True)
class Workflow:
    """A workflow as the server shows it (`GET /v1/workflows/{id}`): its state (running,
    succeeded, failed, cancelled) and each step's job id and state; `raw` keeps every field."""

    id: str
    name: str
    state: str
    steps: dict[str, dict[str, Any]]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.state != "running"

    def job_ids(self) -> dict[str, str]:
        """Each step's job id, by step name."""
        return {name: str(s["job"]) for name, s in self.steps.items()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Workflow:
        return cls(
            id=str(d["id"]),
            name=str(d.get("name", "")),
            state=str(d["state"]),
            steps=dict(d.get("steps") or {}),
            raw=d,
        )


@dataclass(frozen=True)
class Schedule:
    """A periodic schedule as the server shows it (`GET /v1/schedules/{name}`,
    docs/schedules.md): what each tick enqueues, its `spec` (`{"kind": "cron", "expr",
    "timezone"}` or `{"kind": "every", "interval"}`), whether it is paused, and its next and
    last ticks (RFC 3339 text, or None); `raw` keeps every field."""

    name: str
    task: str
    args: Any
    queue: str
    spec: dict[str, Any]
    missed: str
    paused: bool
    next_tick: Optional[str]
    last_tick: Optional[str]
    last_job: Optional[str]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Schedule:
        return cls(
            name=str(d["name"]),
            task=str(d["task"]),
            args=d.get("args"),
            queue=str(d.get("queue", "default")),
            spec=dict(d.get("spec") or {}),
            missed=str(d.get("missed", "latest")),
            paused=bool(d.get("paused", False)),
            next_tick=d.get("next_tick"),
            last_tick=d.get("last_tick"),
            last_job=d.get("last_job"),
            raw=d,
        )


@dataclass(frozen=True)
class Queue:
    """A queue's settings (`GET /v1/queues/{name}`, docs/limits.md): whether it is paused and
    its cluster-wide `limits` (`concurrency`, `rate` such as `"10/1s"`, `key_arg`; empty when
    it has none); `raw` keeps every field."""

    name: str
    paused: bool
    limits: dict[str, Any]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Queue:
        return cls(
            name=str(d["queue"]),
            paused=bool(d.get("paused", False)),
            limits=dict(d.get("limits") or {}),
            raw=d,
        )


def segment(value: str) -> str:
    """`value` as one path segment: a name or id with `/` in it, or that is `.` or `..` (a
    valid schedule name, which HTTP clients would otherwise resolve as a relative path), stays
    one segment, so the server decides it by its own rules instead of the call reaching
    another endpoint."""
    if not value:
        raise ValueError("a name or id must not be empty")
    text = quote(str(value), safe="")
    return text.replace(".", "%2E") if text in (".", "..") else text


def every_text(every: Union[int, float, str, timedelta]) -> str:
    """A schedule's interval as the server reads it: whole seconds as a number or a
    `timedelta`, or a duration text such as `"90s"`, `"15m"`, `"1h"` (checked by the server)."""
    if isinstance(every, str):
        return every
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    try:
        whole = not isinstance(seconds, bool) and float(seconds).is_integer() and seconds >= 1
    except (OverflowError, TypeError, ValueError):
        whole = False
    if not whole:
        raise ValueError(
            f"every must be a whole number of seconds >= 1, or a text like '15m', not {every!r}"
        )
    return f"{int(seconds)}s"


# Fields of a schedule's body that set_schedule's own arguments set (and check).
SCHEDULE_FIELDS = frozenset(
    {"task", "args", "queue", "cron", "timezone", "every", "missed", "allow_unknown_task"}
)


@dataclass(frozen=True)
class Task:
    """A function registered with `@app.task`; calling it calls the function directly."""

    fn: Callable[..., Any]
    name: str
    queue: str
    max_retries: Optional[int]
    retry_delay: Optional[float]
    time_limit: Optional[float]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def declaration(self) -> dict[str, Any]:
        """The defaults a worker declares for this task when it registers its session."""
        return {
            "name": self.name,
            "max_retries": self.max_retries,
            "retry_delay_ms": millis(self.retry_delay),
            "time_limit_ms": millis(self.time_limit),
        }


def current_traceparent() -> Optional[str]:
    """The `traceparent` of the active OpenTelemetry span, through the globally configured
    propagator; None when the optional `opentelemetry` package is absent or no span is active.
    Imported by name so that the package stays optional, for type checkers too."""
    try:
        propagate: Any = importlib.import_module("opentelemetry.propagate")
    except ImportError:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    value = carrier.get("traceparent")
    return value if isinstance(value, str) and value else None


def millis(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else round(seconds * 1000)


class App:
    """A homing application: where the server is, and the tasks this program runs.

    `App()` reads `HOMING_URL` (default http://127.0.0.1:8787) and `HOMING_API_TOKEN`.
    """

    def __init__(self, url: Optional[str] = None, *, token: Optional[str] = None) -> None:
        self.url = (url or os.environ.get("HOMING_URL") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.environ.get("HOMING_API_TOKEN")
        # A token read from a file keeps its line break; inside a header it would be refused
        # in whichever thread first called the server.
        self.token = check_token(token.strip()) if token else None
        self.tasks: dict[str, Task] = {}
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"App(url={self.url!r}, tasks={sorted(self.tasks)!r})"

    def http(self) -> Http:
        """This thread's connection to the server (made on first use)."""
        h: Optional[Http] = getattr(self._local, "http", None)
        if h is None:
            h = Http(self.url, self.token)
            self._local.http = h
        return h

    @overload
    def task(self, fn: F) -> Task: ...

    @overload
    def task(
        self,
        *,
        name: Optional[str] = None,
        queue: str = "default",
        max_retries: Optional[int] = None,
        retry_delay: Optional[float] = None,
        time_limit: Optional[float] = None,
    ) -> Callable[[F], Task]: ...

    def task(
        self,
        fn: Optional[F] = None,
        *,
        name: Optional[str] = None,
        queue: str = "default",
        max_retries: Optional[int] = None,
        retry_delay: Optional[float] = None,
        time_limit: Optional[float] = None,
    ) -> Union[Task, Callable[[F], Task]]:
        """Registers a function as a task. It is called as `fn(ctx, **args)`; `async def`
        functions run on the worker's event loop, plain ones on its threads. `retry_delay` and
        `time_limit` are in seconds; they and `max_retries` apply to jobs that did not set
        their own at enqueue."""
        if max_retries is not None and max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        for label, value in (("retry_delay", retry_delay), ("time_limit", time_limit)):
            if value is not None and value < 0:
                raise ValueError(f"{label} must be >= 0 seconds")

        def register(f: F) -> Task:
            task_name = name or f"{f.__module__}.{f.__qualname__}"
            if task_name in self.tasks:
                raise ValueError(f"task '{task_name}' is registered twice")
            t = Task(f, task_name, queue, max_retries, retry_delay, time_limit)
            self.tasks[task_name] = t
            return t

        return register(fn) if fn is not None else register

    def enqueue(
        self,
        task: Union[str, Task],
        args: Optional[dict[str, Any]] = None,
        *,
        queue: Optional[str] = None,
        countdown: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        priority: Optional[int] = None,
        unique_for: Optional[float] = None,
        options: Optional[dict[str, Any]] = None,
        traceparent: Optional[str] = None,
    ) -> Job:
        """Enqueues a job of any homing task (Rust or Python), by name or `Task`. `countdown`
        delays its first run by that many seconds. With an `idempotency_key` already used, the
        existing job is returned. `priority` (-1000..1000, default 0): higher starts first within
        the queue. `unique_for` (seconds): while an equal job (same task, queue and args, also
        enqueued with `unique_for`) is waiting or running, or finished less than that long ago,
        that job is returned instead of a new one (docs/limits.md). Without `queue`, a task this
        App defines goes to its own queue, any other task to the server's default. `options`
        adds other fields of `POST /v1/jobs` as they are (`max_retries`, `time_limit`,
        `on_success`, `on_failure`, `callback_url`...).
        `traceparent` (a W3C trace context) makes the job's enqueue and runs part of that trace
        (docs/traces.md); without it, the current OpenTelemetry context is sent when the
        `opentelemetry` package is installed and a span is active."""
        if not isinstance(task, Task):
            task = self.tasks.get(task, task)
        if isinstance(task, Task):
            name = task.name
            queue = queue or task.queue
        else:
            name = task
        body: dict[str, Any] = dict(options or {})
        body.update(task=name, args={} if args is None else args)
        if queue is not None:
            body["queue"] = queue
        if countdown is not None:
            if countdown < 0:
                raise ValueError("countdown must be >= 0 seconds")
            body["countdown"] = millis(countdown)
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        if priority is not None:
            body["priority"] = priority
        if unique_for is not None:
            if unique_for <= 0:
                raise ValueError("unique_for must be > 0 seconds")
            body["unique_for"] = millis(unique_for)
        tp = traceparent if traceparent is not None else current_traceparent()
        headers = {"traceparent": tp} if tp else None
        return Job.from_json(self.http().call("POST", "/v1/jobs", body, headers=headers))

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[str]:
        """Enqueues up to 10000 jobs in one request (`POST /v1/jobs/batch`, docs/batch.md) and
        returns their ids in the same order. Each job is a dict of `enqueue`'s parameters:
        `task` (a name or `Task`), `args`, `queue`, `countdown` (seconds), `idempotency_key`,
        and any other field of `POST /v1/jobs` as it is. All or nothing: a bad job raises
        `ApiError` whose message starts with `job <index>: ` and none is stored. A job whose
        idempotency key is already used, or used earlier in the list, gives the existing id."""
        body_jobs: list[dict[str, Any]] = []
        for i, spec in enumerate(jobs):
            job = dict(spec)
            task = job.get("task")
            if not isinstance(task, Task) and isinstance(task, str):
                task = self.tasks.get(task, task)
            if isinstance(task, Task):
                job["task"] = task.name
                if job.get("queue") is None:
                    job["queue"] = task.queue
            job.setdefault("args", {})
            countdown = job.get("countdown")
            if countdown is not None:
                if not isinstance(countdown, (int, float)) or countdown < 0:
                    raise ValueError(f"job {i}: countdown must be >= 0 seconds")
                job["countdown"] = millis(countdown)
            body_jobs.append(job)
        d = self.http().call("POST", "/v1/jobs/batch", {"jobs": body_jobs})
        return [str(j["id"]) for j in d["jobs"]]

    def workflow(self, name: str, steps: dict[str, dict[str, Any]]) -> NewWorkflow:
        """Creates a workflow (docs/workflows.md): `steps` maps each step's name to its job,
        `{"task": ..., "args": {...}, "queue": ..., "after": ["other step"], "run_on": "any"}`
        plus any field of `POST /v1/jobs`. A `Task` of this App may stand for its name, and a
        step of such a task without a queue goes to the task's own queue. All or nothing: a
        cycle, an unknown step or a bad job raises `ApiError` and creates nothing. Returns the
        workflow's id and each step's job id; a step sees its parents in `ctx.parents`."""
        body_steps: dict[str, dict[str, Any]] = {}
        for step, spec in steps.items():
            spec = dict(spec)
            task = spec.get("task")
            if isinstance(task, Task):
                spec["task"] = task.name
                spec.setdefault("queue", task.queue)
            elif isinstance(task, str) and task in self.tasks:
                spec.setdefault("queue", self.tasks[task].queue)
            body_steps[step] = spec
        d = self.http().call("POST", "/v1/workflows", {"name": name, "steps": body_steps})
        return NewWorkflow(
            id=str(d["id"]), steps={k: str(v) for k, v in (d.get("steps") or {}).items()}
        )

    def get_workflow(self, workflow_id: str) -> Workflow:
        """Reads a workflow: its state and each step's job and state."""
        return Workflow.from_json(
            self.http().call("GET", f"/v1/workflows/{segment(workflow_id)}")
        )

    def cancel_workflow(self, workflow_id: str) -> Workflow:
        """Cancels a workflow: steps not yet started are cancelled, running ones are asked to
        stop (as `cancel` asks a job). Returns the workflow as it is right after."""
        return Workflow.from_json(
            self.http().call("POST", f"/v1/workflows/{segment(workflow_id)}/cancel")
        )

    def get(self, job_id: str) -> Job:
        """Reads a job."""
        return Job.from_json(self.http().call("GET", f"/v1/jobs/{segment(job_id)}"))

    def jobs(
        self,
        *,
        state: Optional[str] = None,
        queue: Optional[str] = None,
        task: Union[str, Task, None] = None,
        page_size: int = 100,
    ) -> Iterator[Job]:
        """Jobs, newest first, filtered by `state` (scheduled, waiting, queued, running,
        succeeded, failed, dead, cancelled), `queue` and `task`, read a page at a time (1-1000)
        as the loop goes; stop the loop when you have seen enough. A bad filter raises
        `ApiError` 400 at the first step."""
        if not 1 <= page_size <= 1000:
            raise ValueError("page_size must be 1 to 1000")
        params = {"limit": str(page_size)}
        name = task.name if isinstance(task, Task) else task
        for key, value in (("state", state), ("queue", queue), ("task", name)):
            if value is not None:
                params[key] = value
        return (Job.from_json(d) for d in self._pages("/v1/jobs", params, "jobs", "next_cursor",
                                                      "cursor"))

    def _pages(self, path: str, params: dict[str, str], items: str, next_key: str,
               next_param: str) -> Iterator[dict[str, Any]]:
        """The items of a paged list, a page at a time as the caller's loop goes: each page's
        `next_key` goes back as `next_param` until it is null."""
        while True:
            page = self.http().call("GET", path, params=params)
            yield from page.get(items) or []
            after = page.get(next_key)
            if after is None:
                return
            params = {**params, next_param: str(after)}

    def cancel(self, job_id: str) -> Job:
        """Cancels a job. One that has not started is `cancelled` at once; a running one is
        asked to stop (`raw["cancel_requested"]`; its task sees `ctx.cancelled()`) and turns
        `cancelled` when its worker gives it up: `wait` for that. A finished job raises
        `ApiError` 409."""
        return Job.from_json(self.http().call("POST", f"/v1/jobs/{segment(job_id)}/cancel"))

    def retry(self, job_id: str) -> Job:
        """Runs a failed, dead or cancelled job again (same id, queued now); any other state
        raises `ApiError` 409."""
        return Job.from_json(self.http().call("POST", f"/v1/jobs/{segment(job_id)}/retry"))

    def get_queue(self, queue: str) -> Queue:
        """Reads a queue's settings: paused or not, and its limits."""
        return Queue.from_json(self.http().call("GET", f"/v1/queues/{segment(queue)}"))

    def pause_queue(self, queue: str) -> Queue:
        """Pauses a queue: its jobs wait (none is lost) and no worker starts them until
        `resume_queue`; jobs already running finish."""
        self.http().call("POST", f"/v1/queues/{segment(queue)}/pause")
        return self.get_queue(queue)

    def resume_queue(self, queue: str) -> Queue:
        """Resumes a paused queue."""
        self.http().call("POST", f"/v1/queues/{segment(queue)}/resume")
        return self.get_queue(queue)

    def set_queue_limits(
        self,
        queue: str,
        *,
        concurrency: Optional[int] = None,
        rate: Optional[str] = None,
        key_arg: Optional[str] = None,
    ) -> Queue:
        """Sets a queue's cluster-wide limits, held across every worker (docs/limits.md):
        `concurrency` jobs running at once, `rate` as `"COUNT/PERIOD"` (`"10/1s"`,
        `"100/1m"`, or `"10/s"`), each per value of the job argument `key_arg` when given (say, per
        tenant). The call replaces the queue's limits whole: with no argument it clears them.
        A bad value raises `ApiError` (400, or 422 for a malformed rate) with the reason."""
        body: dict[str, Any] = {}
        if concurrency is not None:
            body["concurrency"] = concurrency
        if rate is not None:
            body["rate"] = rate
        if key_arg is not None:
            body["key_arg"] = key_arg
        return Queue.from_json(self.http().call("PUT", f"/v1/queues/{segment(queue)}", body))

    def set_schedule(
        self,
        name: str,
        task: Union[str, Task],
        args: Optional[dict[str, Any]] = None,
        *,
        cron: Optional[str] = None,
        timezone: Optional[str] = None,
        every: Union[int, float, str, timedelta, None] = None,
        queue: Optional[str] = None,
        missed: Optional[str] = None,
        allow_unknown_task: bool = False,
        options: Optional[dict[str, Any]] = None,
    ) -> Schedule:
        """Creates or replaces the schedule `name` (docs/schedules.md): each tick enqueues one
        job of `task` with `args`, exactly once however many processes run. Give exactly one
        of `cron` (5 fields, or 6 with seconds first, read in `timezone`, an IANA zone, default
        UTC) and `every` (whole seconds as a number or `timedelta`, or a text such as `"15m"`).
        `missed` says what to do with ticks missed while nothing ran: `"latest"` (default),
        `"skip"` or `"all:N"`. Without `queue`, a task this App defines goes to its own queue.
        `options` adds the tick's job options as the server reads them: `max_retries`,
        `retry_policy`, `max_crashes`, `time_limit` (milliseconds, or a text such as `"30s"`),
        `on_success`, `on_failure`, `callback_url`.

        Setting a schedule again with the same spec keeps its cursor (so it is safe at every
        deploy) and whether it is paused. Giving both or neither of `cron` and `every`, an
        `every` that is not whole seconds, or an option that one of the arguments sets raises
        `ValueError`; a bad cron, zone, interval or option raises `ApiError` with the server's
        reason, as does a task no worker has registered (422) unless `allow_unknown_task`."""
        if (cron is None) == (every is None):
            raise ValueError("give exactly one of cron and every")
        taken = SCHEDULE_FIELDS.intersection(options or {})
        if taken:
            raise ValueError(f"set {', '.join(sorted(taken))} with set_schedule's own arguments")
        if not isinstance(task, Task):
            task = self.tasks.get(task, task)
        body: dict[str, Any] = dict(options or {})
        if isinstance(task, Task):
            body["task"] = task.name
            queue = queue if queue is not None else task.queue
        else:
            body["task"] = task
        body["args"] = {} if args is None else args
        if cron is not None:
            body["cron"] = cron
            if timezone is not None:
                body["timezone"] = timezone
        elif every is not None:
            if timezone is not None:
                raise ValueError("timezone applies to cron schedules only")
            body["every"] = every_text(every)
        if queue is not None:
            body["queue"] = queue
        if missed is not None:
            body["missed"] = missed
        if allow_unknown_task:
            body["allow_unknown_task"] = True
        return Schedule.from_json(
            self.http().call("PUT", f"/v1/schedules/{segment(name)}", body)
        )

    def get_schedule(self, name: str) -> Schedule:
        """Reads a schedule; one that does not exist raises `ApiError` 404."""
        return Schedule.from_json(self.http().call("GET", f"/v1/schedules/{segment(name)}"))

    def schedules(self, page_size: int = 1000) -> Iterator[Schedule]:
        """Every schedule, by name, read a page at a time as the loop goes (a page holds at
        most `page_size`, 1-10000, and ends before 4 MiB of stored definitions)."""
        if not 1 <= page_size <= 10000:
            raise ValueError("page_size must be 1 to 10000")
        params = {"limit": str(page_size)}
        return (Schedule.from_json(d)
                for d in self._pages("/v1/schedules", params, "schedules", "next", "after"))

    def pause_schedule(self, name: str) -> Schedule:
        """Pauses a schedule: it enqueues nothing until resumed."""
        return Schedule.from_json(
            self.http().call("POST", f"/v1/schedules/{segment(name)}/pause")
        )

    def resume_schedule(self, name: str) -> Schedule:
        """Resumes a schedule from the current second (ticks that fell while it was paused are
        not owed)."""
        return Schedule.from_json(
            self.http().call("POST", f"/v1/schedules/{segment(name)}/resume")
        )

    def delete_schedule(self, name: str) -> bool:
        """Deletes a schedule; False when there was none (jobs it already made are kept)."""
        try:
            self.http().call("DELETE", f"/v1/schedules/{segment(name)}")
        except ApiError as e:
            # Only the schedule's own absence: a URL that reached no route is also a 404
            # `not_found`, and must not read as "deleted already".
            if e.status == 404 and e.message.startswith("no schedule named"):
                return False
            raise
        return True

    def wait(self, job_id: str, timeout: Optional[float] = None) -> Job:
        """Waits until the job is finished (succeeded, failed, dead or cancelled) and returns
        it; raises `TimeoutError` after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.05
        while True:
            job = self.get(job_id)
            if job.finished:
                return job
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"job {job_id} is still {job.state} after {timeout}s"
                    )
                pause = min(pause, left)
            time.sleep(pause)
            pause = min(pause * 1.5, 0.5)
