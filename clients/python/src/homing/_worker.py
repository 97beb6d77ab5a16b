"""The worker: runs an `App`'s tasks for a homing server over the remote worker protocol.

Everything the worker holds is also held by the server (a session, reserved deliveries, running
jobs fenced by their epoch), so this process may die at any moment and nothing is lost: the
server reclaims its jobs once its heartbeats stop. What this process must get right is the
other side of the fence:

- heartbeats run on their own thread, whatever the tasks do, and list every job held;
- once the server says the session is presumed dead (410), none of its results are sent: the
  jobs belong to another run now; the worker registers a new session;
- a completion whose answer was lost is sent again until answered (the server says
  `already_applied` for a repeat);
- on SIGTERM/SIGINT it stops reserving, gives running jobs a grace period, releases the rest
  and ends its session.

Threads: the main thread (signals, shutdown), one reserving, one heartbeating, one sending
completions and progress, `concurrency` threads for plain functions, one keeping their time
limits, and one event loop thread for `async def` tasks. Slots are counted across both kinds of
task. A plain function's thread sends its own completion when nothing else is waiting to be
sent: handing it to the sender and the next job back was two thread wake-ups per job, about a
tenth of a single-slot worker's time.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import json
import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from types import FrameType
from typing import Any, Optional

from ._app import App, Task
from ._context import Context
from ._deadlines import Deadlines
from ._errors import ApiError, Fatal, Retry, Snooze, Unreachable

log = logging.getLogger("homing.worker")

VERSION = "homing-python 0.1.0"
MAX_ERROR = 8 * 1024
EXIT_OK = 0
EXIT_CONFIG = 2


class WorkerError(Exception):
    """A mistake the worker cannot run past (bad token, bad options): it exits with this reason."""


@dataclass
class Held:
    """A job this process holds under one session generation."""

    job: dict[str, Any]
    gen: int
    task: Optional[Task]
    ctx: Optional[Context] = None
    # Why the job must stop, if it must: "cancelled" (by a user), "lost" (session presumed
    # dead), "shutdown" (past the grace period, released), "timeout" (time limit).
    stop: Optional[str] = None
    # The asyncio task running it, for async tasks (cancelled when the job must stop).
    future: Optional[asyncio.Future[Any]] = None
    state: str = "reserved"
    # Whether it counts against the concurrency: from reserve until its completion is answered,
    # so that a worker killed at any moment holds at most `concurrency` jobs whose handlers ran.
    slot: bool = False

    @property
    def job_id(self) -> str:
        return str(self.job["job_id"])

    @property
    def epoch(self) -> int:
        return int(self.job["epoch"])


@dataclass
class Stats:
    ran: int = 0
    applied: int = 0
    already_applied: int = 0
    stale: int = 0
    dropped: int = 0
    released: int = 0


def backoff(attempt: int) -> float:
    return float(min(10.0, 0.25 * (2 ** min(attempt, 6))))


def gone(e: ApiError) -> bool:
    """The server no longer knows the session: expired (410), or never registered on this
    deployment (404 unknown_session, e.g. after its store was reset)."""
    return e.status == 410 or (e.status == 404 and e.code == "unknown_session")


def sendable(text: str) -> str:
    """The text with anything UTF-8 cannot carry (lone surrogates, as from a file name that is
    not UTF-8) written as escapes: an error message must reach the server whatever it says."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_text(e: BaseException) -> str:
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    if len(text) > MAX_ERROR:
        text = "…" + text[-(MAX_ERROR - 1):]
    return sendable(text)


def as_json(value: Any) -> Any:
    """The value as plain JSON, or ValueError/TypeError saying why it is not (a lone surrogate
    in a string is not: UTF-8 cannot carry it; a pair written as two surrogates is one
    character)."""
    text = json.dumps(value, allow_nan=False)
    plain = json.loads(text)
    if "\\ud" in text:
        json.dumps(plain, ensure_ascii=False).encode("utf-8")
    return plain


class Worker:
    def __init__(
        self,
        app: App,
        *,
        queues: list[str],
        concurrency: int,
        heartbeat_interval: float,
        grace: float = 30.0,
        wait: float = 5.0,
    ) -> None:
        if concurrency < 1:
            raise WorkerError("--concurrency must be at least 1")
        if heartbeat_interval <= 0:
            raise WorkerError("--heartbeat-interval must be positive")
        if not queues:
            raise WorkerError("no queue to consume")
        self.app = app
        self.queues = queues
        self.concurrency = concurrency
        self.interval = heartbeat_interval
        self.grace = grace
        self.wait = wait
        mutex = threading.RLock()
        self.lock = threading.Condition(mutex)
        self.session: Optional[str] = None
        self.gen = 0
        self.held: dict[str, Held] = {}
        self.busy = 0
        self.stopping = threading.Event()
        self.finished = threading.Event()
        self.fatal: Optional[str] = None
        # Completions and progress to send, guarded by `lock`; `sending` counts the sends in
        # flight (the sender's and task threads' own), so that a task thread sends its own
        # completion only when nothing sent before it can still be on its way.
        self.outbox: collections.deque[tuple[str, Held, Any]] = collections.deque()
        self.outbox_ready = threading.Condition(mutex)
        self.sending = 0
        self.runq: queue.Queue[Held] = queue.Queue()
        self.deadlines: Deadlines[Held] = Deadlines(self.timed_out)
        # Each task's signature, worked out once (every job's args are checked against it);
        # by name, as a task's function need not be hashable.
        self.signatures: dict[str, inspect.Signature] = {}
        self.stats = Stats()
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.force = False

    # ---- sessions -------------------------------------------------------------------------

    def register(self) -> bool:
        """Registers a session, retrying while the server is unreachable. False if the worker
        started stopping meanwhile."""
        body = {
            "queues": self.queues,
            "concurrency": self.concurrency,
            "heartbeat_interval_ms": round(self.interval * 1000),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": VERSION,
            "tasks": [t.declaration() for t in self.app.tasks.values()],
        }
        attempt = 0
        while not self.stopping.is_set():
            try:
                r = self.app.http().call("POST", "/v1/remote/sessions", body, timeout=30)
            except Unreachable as e:
                delay = backoff(attempt)
                log.warning("%s; retrying in %.1fs", e, delay)
            except ApiError as e:
                if e.status in (401, 403):
                    self.die(f"the server refused the API token: {e.message} "
                             "(set HOMING_API_TOKEN)")
                    return False
                if e.status == 404:
                    self.die(f"the server at {self.app.url} has no remote worker protocol "
                             f"(POST /v1/remote/sessions: {e.message}); is it a homing server?")
                    return False
                if e.status < 500:
                    self.die(f"the server refused this worker's registration: {e.message}")
                    return False
                delay = backoff(attempt)
                log.warning("registration failed: %s; retrying in %.1fs", e, delay)
            else:
                with self.lock:
                    self.gen += 1
                    self.session = str(r["session"])
                    server_interval = r.get("heartbeat_interval_ms")
                    if isinstance(server_interval, int) and server_interval > 0:
                        self.interval = server_interval / 1000
                    self.lock.notify_all()
                log.info(
                    "session %s registered at %s: queues %s, concurrency %d, tasks %s, ttl %sms",
                    self.session, self.app.url, ",".join(self.queues), self.concurrency,
                    ",".join(sorted(self.app.tasks)), r.get("ttl_ms"),
                )
                return True
            attempt += 1
            self.stopping.wait(delay)
        return False

    def session_lost(self, gen: int, why: str) -> None:
        """The server presumed session `gen` dead: abandon its jobs (their results will not be
        sent) and let the reserver register a new session."""
        with self.lock:
            if gen != self.gen or self.session is None:
                return
            old = self.session
            self.session = None
            abandoned = [h for h in self.held.values() if h.gen == gen]
            for h in abandoned:
                self.stop_job(h, "lost")
            self.lock.notify_all()
        log.warning(
            "session %s presumed dead by the server (%s): abandoning %d job(s), registering again",
            old, why, len(abandoned),
        )

    def forget(self, h: Held, notify: bool = True) -> None:
        """The job left this process (answered, dropped or refused): free its slot (called with
        the lock held). `notify=False` leaves waking the waiters to the caller."""
        if self.held.get(h.job_id) is h:
            del self.held[h.job_id]
        if h.slot:
            h.slot = False
            self.busy -= 1
            if notify:
                self.lock.notify_all()

    def post(self, kind: str, h: Held, payload: Any) -> None:
        """Queues a completion or progress for the sender (called with the lock held)."""
        self.outbox.append((kind, h, payload))
        self.outbox_ready.notify()

    def die(self, reason: str) -> None:
        with self.lock:
            if self.fatal is None:
                self.fatal = reason
        self.stopping.set()

    def stop_job(self, h: Held, why: str) -> None:
        """Asks a held job to stop (called with the lock held)."""
        if h.stop is None or why == "lost":
            h.stop = why
        fut, loop = h.future, self.loop
        if fut is not None and loop is not None:
            loop.call_soon_threadsafe(fut.cancel)

    # ---- threads ---------------------------------------------------------------------------

    def heartbeat_loop(self) -> None:
        failures = 0
        next_at = time.monotonic()
        while not self.finished.is_set():
            next_at += self.interval
            self.finished.wait(max(0.0, next_at - time.monotonic()))
            if self.finished.is_set():
                return
            with self.lock:
                sid, gen = self.session, self.gen
                held = [{"job_id": h.job_id, "epoch": h.epoch}
                        for h in self.held.values() if h.gen == gen]
            if sid is None:
                continue
            try:
                r = self.app.http().call(
                    "POST", f"/v1/remote/sessions/{sid}/heartbeat", {"held": held},
                    timeout=max(1.0, self.interval),
                )
            except Unreachable as e:
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    log.warning("heartbeat failed (%d in a row): %s", failures, e)
                next_at = max(next_at, time.monotonic())
                continue
            except ApiError as e:
                next_at = max(next_at, time.monotonic())
                if gone(e):
                    self.session_lost(gen, "heartbeat expired")
                elif e.status in (401, 403):
                    self.die(f"the server refused the API token: {e.message}")
                else:
                    log.warning("heartbeat failed: %s", e)
                continue
            if failures:
                log.info("heartbeats reach the server again")
            failures = 0
            cancel = (r.get("cancel") or []) if isinstance(r, dict) else []
            if cancel:
                with self.lock:
                    for jid in cancel:
                        h = self.held.get(str(jid))
                        if h is not None and h.gen == gen:
                            log.info("job %s: cancellation requested", jid)
                            self.stop_job(h, "cancelled")

    def reserve_loop(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            with self.lock:
                sid, gen = self.session, self.gen
            if sid is None:
                if not self.register():
                    return
                continue
            with self.lock:
                while self.busy >= self.concurrency and not self.stopping.is_set():
                    self.lock.wait(0.5)
                free = self.concurrency - self.busy
                if self.session != sid:
                    continue
            if self.stopping.is_set():
                return
            try:
                r = self.app.http().call(
                    "POST", f"/v1/remote/sessions/{sid}/reserve",
                    {"max": min(free, 1000), "wait_ms": round(self.wait * 1000)},
                    timeout=self.wait + 15,
                )
            except Unreachable as e:
                delay = backoff(failures)
                failures += 1
                log.warning("reserve failed: %s; retrying in %.1fs", e, delay)
                self.stopping.wait(delay)
                continue
            except ApiError as e:
                if gone(e):
                    self.session_lost(gen, "reserve refused")
                    continue
                if e.status in (401, 403):
                    self.die(f"the server refused the API token: {e.message}")
                    return
                delay = backoff(failures)
                failures += 1
                log.warning("reserve failed: %s; retrying in %.1fs", e, delay)
                self.stopping.wait(delay)
                continue
            failures = 0
            for job in (r or {}).get("jobs", []):
                self.accept(job, gen)

    def accept(self, job: dict[str, Any], gen: int) -> None:
        task = self.app.tasks.get(str(job.get("task")))
        h = Held(job=job, gen=gen, task=task)
        with self.lock:
            if gen != self.gen:
                # Reserved under a session presumed dead meanwhile: the server reclaims it.
                log.info("job %s dropped: reserved under an expired session", h.job_id)
                return
            self.held[h.job_id] = h
            # Stopping, or no slot left (a refill whose completion must be sent again kept its
            # slot): hand it back unstarted.
            if self.stopping.is_set() or self.busy >= self.concurrency:
                h.state = "completing"
                self.post("complete", h, {"outcome": "released"})
                return
            self.busy += 1
            h.slot = True
        if task is None:
            known = ", ".join(sorted(self.app.tasks)) or "none"
            self.finish(h, {"outcome": "fatal", "error":
                            f"unknown task '{job.get('task')}': this worker does not define it "
                            f"(it runs: {known})"})
            return
        h.ctx = Context(job, lambda v: self.progress(h, v), lambda: h.stop is not None)
        args = job.get("args")
        if args is None:
            args = {}
        problem = None
        if not isinstance(args, dict):
            problem = ("the job's args must be a JSON object (keyword arguments), "
                       f"not {type(args).__name__}")
        else:
            try:
                sig = self.signatures.get(task.name)
                if sig is None:
                    sig = self.signatures[task.name] = inspect.signature(task.fn)
                sig.bind(h.ctx, **args)
            except TypeError as e:
                problem = f"task '{task.name}' cannot take these args: {e}"
        if problem is not None:
            self.finish(h, {"outcome": "fatal", "error": problem})
            return
        h.state = "running"
        self.stats.ran += 1
        if task.is_async:
            assert self.loop is not None
            asyncio.run_coroutine_threadsafe(self.run_async(h, args), self.loop)
        else:
            self.runq.put(h)

    def thread_loop(self) -> None:
        while True:
            h = self.runq.get()
            assert h.task is not None and h.ctx is not None
            limit = self.time_limit(h)
            deadline = None if limit is None else self.deadlines.arm(h, limit)
            try:
                value = h.task.fn(h.ctx, **(h.job.get("args") or {}))
                report = self.returned(h, value)
            except BaseException as e:  # every failure of a task is reported
                report = self.raised(h, e)
            finally:
                if deadline is not None:
                    self.deadlines.disarm(deadline)
            inline = self.finish(h, report, inline=True)
            if inline is not None:
                self.send_inline(h, inline)

    async def run_async(self, h: Held, args: dict[str, Any]) -> None:
        assert h.task is not None and h.ctx is not None
        fut = asyncio.ensure_future(h.task.fn(h.ctx, **args))
        with self.lock:
            h.future = fut
            if h.stop is not None:
                fut.cancel()
        limit = self.time_limit(h)
        try:
            value = await asyncio.wait_for(fut, timeout=limit)
            report = self.returned(h, value)
        except asyncio.TimeoutError:
            h.stop = h.stop or "timeout"
            report = {"outcome": "error", "error": f"time limit of {limit}s exceeded"}
        except asyncio.CancelledError as e:
            report = self.raised(h, e)
        except Exception as e:
            report = self.raised(h, e)
        self.finish(h, report)

    def time_limit(self, h: Held) -> Optional[float]:
        ms = h.job.get("time_limit_ms")
        if isinstance(ms, (int, float)) and ms > 0:
            return ms / 1000
        return h.task.time_limit if h.task is not None else None

    def timed_out(self, h: Held) -> None:
        with self.lock:
            if h.stop is None:
                h.stop = "timeout"

    def returned(self, h: Held, value: Any) -> dict[str, Any]:
        try:
            return {"outcome": "succeeded", "result": as_json(value)}
        except (TypeError, ValueError, RecursionError) as e:
            return {"outcome": "fatal", "error":
                    f"task '{h.job.get('task')}' returned a value that is not JSON "
                    f"({type(value).__name__}): {e}"}

    def raised(self, h: Held, e: BaseException) -> dict[str, Any]:
        try:
            if isinstance(e, Fatal):
                # str(): `raise Fatal(err)` with an exception object is common.
                return {"outcome": "fatal", "error": sendable(str(e.message))}
            if isinstance(e, Snooze):
                return {"outcome": "snooze", "delay_ms": round(e.delay * 1000)}
            if isinstance(e, Retry):
                r: dict[str, Any] = {"outcome": "error", "error": sendable(str(e.message))}
                if e.delay is not None:
                    r["retry_delay_ms"] = round(e.delay * 1000)
                return r
        except Exception:  # noqa: S110 - whatever is wrong with it, the failure is reported
            pass
        return {"outcome": "error", "error": error_text(e)}

    def finish(
        self, h: Held, report: dict[str, Any], inline: bool = False,
    ) -> Optional[dict[str, Any]]:
        """A task ended: decide what to tell the server, given why it may have been stopped.
        With `inline`, the report the caller is to send itself (`send_inline`) when nothing is
        queued or being sent, so that it cannot overtake an earlier progress report; None when
        the report was queued for the sender or is not to be sent."""
        with self.lock:
            if h.gen != self.gen or h.stop == "lost":
                self.forget(h)
                self.stats.dropped += 1
                log.warning("job %s: outcome %s not sent: its session was presumed dead",
                            h.job_id, report["outcome"])
                return None
            if h.state == "completing":
                # Already released at the end of the grace period.
                return None
            if h.stop == "timeout":
                # Past its limit the run's result does not count, even a success (as a Rust
                # handler, which is stopped at its limit).
                limit = self.time_limit(h)
                report = {"outcome": "error", "error": f"time limit of {limit}s exceeded"}
            elif report["outcome"] != "succeeded":
                if h.stop == "cancelled":
                    report = {"outcome": "cancelled"}
                elif h.stop == "shutdown":
                    report = {"outcome": "released"}
            h.state = "completing"
            if inline and not self.outbox and not self.sending:
                self.sending += 1
                return report
            self.post("complete", h, report)
            return None

    def send_inline(self, h: Held, report: dict[str, Any]) -> None:
        """Sends one completion from the task's own thread (`finish` counted it in `sending`);
        the job that refills its slot comes back in the answer and is usually run next by this
        same thread, with no hand-off. The slot stays held until the answer, as with the sender,
        so a thread busy sending takes no capacity a slot does not already account for."""
        self.send_counted([(h, report)])

    def send_counted(self, done: list[tuple[Held, dict[str, Any]]]) -> None:
        """Sends completions whose send is counted in `sending`, and uncounts it. A mistake of
        this module (not a failure to reach the server: those are retried inside) drops them,
        and the server reclaims their jobs: trying again would fail the same way, and a dead
        sending thread would leave every later completion unsent."""
        try:
            if done:
                self.send_completions(done)
        except Exception:
            log.exception("sending %d completion(s) failed; dropping them (the server "
                          "reclaims their jobs)", len(done))
            with self.lock:
                for h, _ in done:
                    self.forget(h)
                    self.stats.dropped += 1
        finally:
            with self.lock:
                self.sending -= 1
                self.wake()

    def wake(self) -> None:
        """Wakes the threads waiting on the lock when one of them may be waiting for what just
        changed (called with the lock held): the reserver for a free slot, and once stopping,
        the shutdown for sends to end. A completion whose answer refilled its slot changes
        neither, and waking the reserver for nothing was a thread switch per job."""
        if self.busy < self.concurrency or self.stopping.is_set():
            self.lock.notify_all()

    def progress(self, h: Held, value: Any) -> None:
        try:
            value = as_json(value)
        except (TypeError, ValueError, RecursionError) as e:
            raise TypeError(f"progress must be JSON: {e}") from e
        with self.lock:
            self.post("progress", h, value)

    # ---- sending ---------------------------------------------------------------------------

    def sender_loop(self) -> None:
        while True:
            with self.lock:
                while not self.outbox:
                    self.outbox_ready.wait()
                items = [self.outbox.popleft() for _ in range(min(256, len(self.outbox)))]
                self.sending += 1
            latest: dict[str, tuple[Held, Any]] = {}
            done: list[tuple[Held, dict[str, Any]]] = []
            for kind, h, payload in items:
                if kind == "progress":
                    latest[h.job_id] = (h, payload)
                else:
                    done.append((h, payload))
            for h, value in latest.values():
                self.send_progress(h, value)
            self.send_counted(done)

    def send_progress(self, h: Held, value: Any) -> None:
        with self.lock:
            sid = self.session if h.gen == self.gen and h.job_id in self.held else None
        if sid is None:
            return
        try:
            r = self.app.http().call(
                "POST", f"/v1/remote/sessions/{sid}/progress",
                {"job_id": h.job_id, "epoch": h.epoch, "progress": value}, timeout=10,
            )
        except Exception as e:
            # Progress is best effort: whatever went wrong, the completions behind it go on.
            log.warning("job %s: progress not recorded: %s", h.job_id, e)
            return
        if isinstance(r, dict) and r.get("status") == "stale":
            log.warning("job %s: progress refused as stale (epoch %d)", h.job_id, h.epoch)

    def send_completions(self, done: list[tuple[Held, dict[str, Any]]]) -> None:
        attempt = 0
        while True:
            with self.lock:
                current = self.gen
                sid = self.session
                keep = []
                for h, report in done:
                    if h.gen == current and h.stop != "lost":
                        keep.append((h, report))
                    else:
                        self.forget(h)
                        self.stats.dropped += 1
                        log.warning("job %s: outcome %s not sent: its session was presumed dead",
                                    h.job_id, report["outcome"])
                done = keep
            if not done:
                return
            if sid is None:
                # Session presumed dead between the check and now: the loop above drops them.
                if self.finished.wait(0.1):
                    return
                continue
            body: dict[str, Any] = {"results": [
                {"job_id": h.job_id, "epoch": h.epoch, "lease": h.job.get("lease"), **report}
                for h, report in done
            ]}
            # The slots these completions free are filled in the same round trip: their
            # successors come back with the answer (one call per job instead of two). Only
            # these slots: the reserver's own calls never count them as free.
            with self.lock:
                refill = 0 if self.stopping.is_set() or sid != self.session else \
                    sum(1 for h, _ in done if h.slot)
            if refill:
                body["reserve"] = {"max": min(refill, 1000), "wait_ms": 0}
            try:
                r = self.app.http().call(
                    "POST", f"/v1/remote/sessions/{sid}/complete", body, timeout=30,
                )
            except (Unreachable, ApiError) as e:
                if isinstance(e, ApiError) and gone(e):
                    self.session_lost(current, "completion refused")
                    continue
                if isinstance(e, ApiError) and e.status < 500 and e.status not in (408, 429):
                    log.error("completion of %d job(s) refused: %s; the server will reclaim them",
                              len(done), e)
                    with self.lock:
                        for h, _ in done:
                            self.forget(h)
                    return
                delay = backoff(attempt)
                attempt += 1
                log.warning("completion of %d job(s) not acknowledged (%s); sending again in %.1fs",
                            len(done), e, delay)
                if self.finished.wait(delay):
                    return  # the worker has ended: its session goes with it
                continue
            answers = {str(a.get("job_id")): a for a in (r or {}).get("results", [])}
            again = []
            with self.lock:
                for h, report in done:
                    status = answers.get(h.job_id, {}).get("status")
                    if status == "unstored" or status is None:
                        # The store could not write it (or the answer skipped it): the job
                        # stays running under this session; the same report goes again.
                        again.append((h, report))
                        continue
                    if status == "stale":
                        self.stats.stale += 1
                        log.warning("job %s: outcome %s refused as stale (epoch %d): the job was "
                                    "reclaimed and runs elsewhere", h.job_id, report["outcome"],
                                    h.epoch)
                    elif status == "already_applied":
                        self.stats.already_applied += 1
                    else:
                        self.stats.applied += 1
                    if report["outcome"] == "released":
                        self.stats.released += 1
                    log.debug("job %s: %s %s", h.job_id, report["outcome"], status)
                    self.forget(h, notify=False)
                # Taken in the same hold of the lock as the slots were freed, so the reserver
                # never sees them free in between.
                for job in (r or {}).get("jobs", []) if refill else []:
                    self.accept(job, current)
                self.wake()
            if not again:
                return
            done = again
            delay = backoff(attempt)
            attempt += 1
            log.warning("%d completion(s) not stored yet; sending again in %.1fs", len(done), delay)
            if self.finished.wait(delay):
                return

    # ---- running and stopping --------------------------------------------------------------

    def flush(self, limit: float) -> None:
        """Waits (at most `limit` seconds) until every completion is acknowledged or dropped."""
        until = time.monotonic() + limit
        with self.lock:
            while (self.outbox or self.sending or any(
                    h.state == "completing" and h.gen == self.gen for h in self.held.values())) \
                    and time.monotonic() < until:
                self.lock.wait(0.2)

    def on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.stopping.is_set():
            log.warning("second %s: releasing running jobs now", signal.Signals(signum).name)
            self.force = True
        else:
            log.info("%s: stopping (no new jobs; %.0fs grace for running ones)",
                     signal.Signals(signum).name, self.grace)
        self.stopping.set()
        with self.lock:
            self.lock.notify_all()

    def run(self) -> int:
        """Runs until a signal (exit 0) or a mistake it cannot run past (exit 2)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.on_signal)
            signal.signal(signal.SIGINT, self.on_signal)
        if any(t.is_async for t in self.app.tasks.values()):
            loop = asyncio.new_event_loop()
            self.loop = loop
            threading.Thread(target=loop.run_forever, name="homing-loop", daemon=True).start()
        for i in range(self.concurrency):
            threading.Thread(target=self.thread_loop, name=f"homing-task-{i}", daemon=True).start()
        threading.Thread(target=self.sender_loop, name="homing-sender", daemon=True).start()
        threading.Thread(target=self.heartbeat_loop, name="homing-heartbeat", daemon=True).start()
        reserver = threading.Thread(target=self.reserve_loop, name="homing-reserve", daemon=True)
        reserver.start()
        while not self.stopping.wait(0.5):
            pass
        if self.fatal is not None:
            self.finished.set()
            log.error("%s", self.fatal)
            return EXIT_CONFIG
        self.shutdown(reserver)
        return EXIT_OK

    def shutdown(self, reserver: threading.Thread) -> None:
        deadline = time.monotonic() + self.grace
        with self.lock:
            while self.busy > 0 and not self.force and time.monotonic() < deadline:
                self.lock.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            late = [h for h in self.held.values() if h.state == "running" and h.gen == self.gen]
            for h in late:
                self.stop_job(h, "shutdown")
                h.state = "completing"
                self.post("complete", h, {"outcome": "released"})
        if late:
            log.warning("grace period over: releasing %d running job(s)", len(late))
        # A reserve long poll in flight is not waited for (it may wait up to --poll): the
        # session ends now, and whatever that poll still reserves is handed back unstarted by
        # the server, which sees the session ended; an answer that still reaches this process
        # is released like any job reserved while stopping.
        reserver.join(0.1)
        self.flush(30)
        with self.lock:
            sid = self.session
        if sid is not None:
            try:
                self.app.http().call("DELETE", f"/v1/remote/sessions/{sid}", timeout=10)
            except (Unreachable, ApiError) as e:
                log.warning("could not end session %s (%s): the server reclaims it after its ttl",
                            sid, e)
        if reserver.is_alive():
            # An answer the server sent just before the session ended: release its jobs too.
            reserver.join(0.5)
            self.flush(10)
        self.finished.set()
        s = self.stats
        log.info("stopped: %d job(s) run, %d completion(s) applied, %d already applied, %d stale, "
                 "%d dropped, %d released", s.ran, s.applied, s.already_applied, s.stale,
                 s.dropped, s.released)
