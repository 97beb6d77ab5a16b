"""The worker's own logic against the in-memory protocol stand-in (fake_server.py): how each way
a task ends is reported, resending after a lost answer, rejoining after 410, shutdown."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from homing import App, Fatal, Retry, Snooze
from homing._worker import EXIT_CONFIG, EXIT_OK, Worker

from .conftest import free_port
from .fake_server import FakeServer

RELEASE = threading.Event()


def make_app(url: str, token: str | None = None) -> App:
    app = App(url, token=token)

    @app.task(name="t.ok", max_retries=2, retry_delay=30)
    def ok(ctx: Any, x: int) -> dict[str, Any]:
        ctx.progress({"step": 1})
        return {"double": x * 2, "job": ctx.job_id, "epoch": ctx.epoch}

    @app.task(name="t.async")
    async def aok(ctx: Any, x: int) -> int:
        await asyncio.sleep(0.01)
        return x + 1

    @app.task(name="t.boom")
    def boom(ctx: Any) -> None:
        raise ValueError("kaboom")

    @app.task(name="t.retry")
    def retry(ctx: Any) -> None:
        raise Retry("later", delay=1.5)

    @app.task(name="t.fatal")
    def fatal(ctx: Any) -> None:
        raise Fatal("no way")

    @app.task(name="t.snooze")
    async def snooze(ctx: Any) -> None:
        raise Snooze(2)

    @app.task(name="t.set")
    def not_json(ctx: Any) -> Any:
        return {1, 2}

    @app.task(name="t.nan")
    def nan(ctx: Any) -> Any:
        return float("nan")

    @app.task(name="t.block")
    def block(ctx: Any) -> str:
        RELEASE.wait(20)
        return "cancelled" if ctx.cancelled() else "done"

    @app.task(name="t.slow", time_limit=0.2)
    def slow(ctx: Any) -> str:
        time.sleep(0.5)
        return "too late"

    @app.task(name="t.aslow", time_limit=0.2)
    async def aslow(ctx: Any) -> str:
        await asyncio.sleep(5)
        return "too late"

    @app.task(name="t.surrogate")
    def surrogate(ctx: Any, raise_it: bool) -> str:
        name = b"caf\xe9.pdf".decode("utf-8", "surrogateescape")  # as os.listdir gives it
        if raise_it:
            raise ValueError(f"cannot read {name}")
        return name

    @app.task(name="t.fatal_obj")
    def fatal_obj(ctx: Any) -> None:
        try:
            int("nope")
        except ValueError as e:
            raise Fatal(e) from e  # type: ignore[arg-type]

    @app.task(name="t.pair")
    def pair(ctx: Any) -> str:
        return "\ud83d\ude00"  # a pair written as two surrogates: one character

    @app.task(name="t.poll")
    def poll(ctx: Any) -> str:
        while not ctx.cancelled():
            time.sleep(0.02)
        raise RuntimeError("stopped")

    return app


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer().start()
    yield s
    s.stop()


class Running:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.code: int | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        self.code = self.worker.run()

    def stop(self, timeout: float = 20) -> int | None:
        self.worker.on_signal(15, None)
        self.thread.join(timeout)
        return self.code


def start(app: App, kind: type[Worker] = Worker, **kw: Any) -> Running:
    opts: dict[str, Any] = {"queues": ["default"], "concurrency": 2,
                            "heartbeat_interval": 0.2, "grace": 5.0, "wait": 0.3}
    opts.update(kw)
    return Running(kind(app, **opts))


def test_outcomes(server: FakeServer) -> None:
    ids = {key: server.add(name, args) for key, name, args in [
        ("kwarg", "t.ok", {"y": 1}), ("t.async", "t.async", {"x": 1}),
        ("t.boom", "t.boom", None), ("t.retry", "t.retry", None),
        ("t.fatal", "t.fatal", None), ("t.snooze", "t.snooze", None),
        ("t.set", "t.set", None), ("t.nan", "t.nan", None), ("t.missing", "t.missing", None),
    ]}
    bad_args = server.add("t.ok", [1, 2])
    run = start(make_app(server.url))
    got = server.wait_outcomes(len(ids) + 1)
    assert run.stop() == EXIT_OK

    ok = got[ids["kwarg"]]
    assert ok["outcome"] == "fatal" and "cannot take these args" in ok["error"]
    assert got[ids["t.async"]] == {**got[ids["t.async"]], "outcome": "succeeded", "result": 2}
    boom = got[ids["t.boom"]]
    assert boom["outcome"] == "error"
    assert "Traceback" in boom["error"] and "ValueError: kaboom" in boom["error"]
    assert got[ids["t.retry"]]["outcome"] == "error"
    assert got[ids["t.retry"]]["retry_delay_ms"] == 1500
    assert got[ids["t.fatal"]] == {**got[ids["t.fatal"]], "outcome": "fatal", "error": "no way"}
    assert got[ids["t.snooze"]]["outcome"] == "snooze"
    assert got[ids["t.snooze"]]["delay_ms"] == 2000
    for name in ("t.set", "t.nan"):
        assert got[ids[name]]["outcome"] == "fatal"
        assert "not JSON" in got[ids[name]]["error"]
    assert got[ids["t.missing"]]["outcome"] == "fatal"
    assert "unknown task 't.missing'" in got[ids["t.missing"]]["error"]
    assert got[bad_args]["outcome"] == "fatal"
    assert "must be a JSON object" in got[bad_args]["error"]
    # Every completion carried its job's epoch and lease.
    for jid, r in got.items():
        assert r["epoch"] == 1 and r["lease"] == f"lease-{jid}"
    # The session declared its tasks' defaults and was ended at shutdown.
    reg = server.registrations[0]
    decl = {t["name"]: t for t in reg["tasks"]}
    assert decl["t.ok"] == {"name": "t.ok", "max_retries": 2, "retry_delay_ms": 30000,
                            "time_limit_ms": None}
    assert reg["concurrency"] == 2 and reg["queues"] == ["default"]
    assert len(server.deleted) == 1


def test_success_result_and_progress(server: FakeServer) -> None:
    jid = server.add("t.ok", {"x": 21})
    run = start(make_app(server.url))
    got = server.wait_outcomes(1)[jid]
    run.stop()
    assert got["outcome"] == "succeeded"
    assert got["result"] == {"double": 42, "job": jid, "epoch": 1}
    deadline = time.monotonic() + 5
    while jid not in server.progress and time.monotonic() < deadline:
        time.sleep(0.05)
    # Progress reported just before the end is still sent, before the completion (the
    # stand-in, as the server, refuses progress for a run that has ended).
    assert server.progress.get(jid) == {"step": 1}


def test_a_single_slot_sends_its_completions_from_the_task_thread(server: FakeServer) -> None:
    """A plain function's completion is sent by its own thread when nothing else is waiting to
    be sent (no hand-off to the sender and back), and progress reported just before the end
    still reaches the server before it."""
    sent_by: list[str] = []

    class Recording(Worker):
        def send_completions(self, done: list[tuple[Any, dict[str, Any]]]) -> None:
            sent_by.append(threading.current_thread().name)
            super().send_completions(done)

    plain = [server.add("t.boom") for _ in range(5)]
    with_progress = [server.add("t.ok", {"x": i}) for i in range(5)]
    run = start(make_app(server.url), Recording, concurrency=1)
    got = server.wait_outcomes(10)
    run.stop()
    assert all(got[j]["outcome"] == "error" for j in plain)
    assert all(got[j]["outcome"] == "succeeded" for j in with_progress)
    assert all(server.progress.get(j) == {"step": 1} for j in with_progress), server.progress
    assert sent_by.count("homing-task-0") >= 5, sent_by


def test_a_task_that_is_an_unhashable_callable_runs(server: FakeServer) -> None:
    # A callable object whose class defines __eq__ without __hash__ (a dataclass, say): its
    # signature is kept by task name, never by the object itself.
    from dataclasses import dataclass

    @dataclass
    class Scale:
        factor: int

        def __call__(self, ctx: Any, x: int) -> int:
            return x * self.factor

    app = make_app(server.url)
    app.task(name="t.scale")(Scale(3))
    jid = server.add("t.scale", {"x": 7})
    again = server.add("t.scale", {"x": 2})
    run = start(app)
    got = server.wait_outcomes(2)
    run.stop()
    assert (got[jid]["outcome"], got[jid]["result"]) == ("succeeded", 21), got[jid]
    assert got[again]["result"] == 6


def test_lost_answer_is_resent_and_already_applied(server: FakeServer) -> None:
    server.drop_answers = 1
    jid = server.add("t.ok", {"x": 1})
    run = start(make_app(server.url))
    server.wait_outcomes(1)
    deadline = time.monotonic() + 10
    while run.worker.stats.already_applied < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    run.stop()
    assert run.worker.stats.already_applied == 1
    assert server.complete_calls >= 2
    assert server.outcomes[jid]["outcome"] == "succeeded"


def test_unstored_completion_is_sent_again(server: FakeServer) -> None:
    server.unstore = 2
    jid = server.add("t.ok", {"x": 3})
    run = start(make_app(server.url))
    got = server.wait_outcomes(1)[jid]
    run.stop()
    assert got["outcome"] == "succeeded" and got["result"]["double"] == 6
    assert server.complete_calls >= 3
    assert run.worker.stats.applied == 1


def test_a_slot_is_held_until_the_completion_is_answered(server: FakeServer) -> None:
    server.answer_complete.clear()
    first, second = server.add("t.ok", {"x": 1}), server.add("t.ok", {"x": 2})
    run = start(make_app(server.url), concurrency=1)
    server.wait_outcomes(1)
    time.sleep(0.5)
    # The first job's completion is applied but not answered: a worker killed now would hold
    # it, so with concurrency 1 it must not have reserved the second yet.
    assert second not in server.running and len(server.queue) == 1
    server.answer_complete.set()
    got = server.wait_outcomes(2)
    run.stop()
    assert got[first]["result"]["double"] == 2 and got[second]["result"]["double"] == 4


def test_expired_session_drops_results_and_rejoins(server: FakeServer) -> None:
    RELEASE.clear()
    jid = server.add("t.block")
    run = start(make_app(server.url))
    deadline = time.monotonic() + 10
    while jid not in server.running and time.monotonic() < deadline:
        time.sleep(0.02)
    server.expire_next_heartbeat = True
    while len(server.registrations) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(server.registrations) == 2, "the worker did not register again after 410"
    RELEASE.set()
    time.sleep(0.5)
    assert jid not in server.outcomes, "a presumed-dead session's result was sent"
    assert run.worker.stats.dropped == 1
    # The new session keeps working.
    j2 = server.add("t.ok", {"x": 2})
    assert server.wait_outcomes(1)[j2]["outcome"] == "succeeded"
    run.stop()


def test_time_limit(server: FakeServer) -> None:
    slow, aslow = server.add("t.slow"), server.add("t.aslow")
    run = start(make_app(server.url))
    got = server.wait_outcomes(2)
    run.stop()
    for jid in (slow, aslow):
        assert got[jid]["outcome"] == "error"
        assert "time limit of 0.2s exceeded" in got[jid]["error"]


def test_cancel_request_reaches_the_task(server: FakeServer) -> None:
    jid = server.add("t.poll")
    server.cancel.add(jid)
    run = start(make_app(server.url))
    got = server.wait_outcomes(1)[jid]
    run.stop()
    assert got["outcome"] == "cancelled"


def test_shutdown_waits_for_running_jobs(server: FakeServer) -> None:
    RELEASE.clear()
    jid = server.add("t.block")
    run = start(make_app(server.url), grace=10.0)
    deadline = time.monotonic() + 10
    while run.worker.busy < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    run.worker.on_signal(15, None)
    time.sleep(0.3)
    assert jid not in server.outcomes
    RELEASE.set()
    run.thread.join(15)
    assert run.code == EXIT_OK
    assert server.outcomes[jid]["outcome"] == "succeeded"
    assert server.outcomes[jid]["result"] == "done"
    assert len(server.deleted) == 1


def test_shutdown_past_grace_releases(server: FakeServer) -> None:
    RELEASE.clear()
    jid = server.add("t.block")
    run = start(make_app(server.url), grace=0.3)
    deadline = time.monotonic() + 10
    while run.worker.busy < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run.stop() == EXIT_OK
    RELEASE.set()
    assert server.outcomes[jid]["outcome"] == "released"


def test_bad_token_exits_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    s = FakeServer(token="right").start()
    try:
        run = start(make_app(s.url, token="wrong"))
        run.thread.join(10)
        assert run.code == EXIT_CONFIG
        assert run.worker.fatal is not None and "API token" in run.worker.fatal
    finally:
        s.stop()


def test_server_down_at_start_is_retried(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    caplog.set_level(logging.WARNING, logger="homing.worker")
    run = start(make_app(f"http://127.0.0.1:{port}"))
    deadline = time.monotonic() + 10
    while not any("unreachable" in r.getMessage() and "retrying" in r.getMessage()
                  for r in caplog.records):
        assert time.monotonic() < deadline, "the worker did not say the server is unreachable"
        time.sleep(0.05)
    s = FakeServer(port=port).start()
    jid = s.add("t.async", {"x": 4})
    try:
        assert s.wait_outcomes(1, timeout=20)[jid]["result"] == 5
    finally:
        run.stop()
        s.stop()


def test_text_utf8_cannot_carry_is_reported_and_the_worker_goes_on(server: FakeServer) -> None:
    """A lone surrogate (a file name that is not UTF-8) cannot be sent: as a result the job
    fails as not JSON, in an error it is written as an escape; either way the worker goes on
    (before, the encoding error killed the thread sending completions, and every later job's
    completion waited for ever)."""
    returned = server.add("t.surrogate", {"raise_it": False})
    raised = server.add("t.surrogate", {"raise_it": True})
    later = [server.add("t.ok", {"x": i}) for i in range(3)]
    run = start(make_app(server.url), concurrency=1)
    got = server.wait_outcomes(5)
    run.stop()
    assert got[returned]["outcome"] == "fatal" and "not JSON" in got[returned]["error"]
    assert got[raised]["outcome"] == "error"
    assert "cannot read caf\\udce9.pdf" in got[raised]["error"]
    assert all(got[j]["outcome"] == "succeeded" for j in later)


def test_odd_messages_and_pairs_are_reported(server: FakeServer) -> None:
    """`raise Fatal(err)` with an exception object is reported with its text (before, the
    thread running it died and its job stayed held); a result holding a surrogate pair is the
    one character it writes."""
    fatal = server.add("t.fatal_obj")
    pair = server.add("t.pair")
    after = server.add("t.ok", {"x": 1})
    run = start(make_app(server.url), concurrency=1)
    got = server.wait_outcomes(3)
    run.stop()
    assert got[fatal]["outcome"] == "fatal" and "invalid literal" in got[fatal]["error"]
    assert got[pair] == {**got[pair], "outcome": "succeeded", "result": "\U0001f600"}
    assert got[after]["outcome"] == "succeeded"


@pytest.mark.parametrize(("task", "outcome"), [("t.boom", "error"), ("t.async", "succeeded")])
def test_a_failure_while_sending_drops_only_those_jobs(
    server: FakeServer, task: str, outcome: str,
) -> None:
    """A mistake of this module while sending (not the server unreachable, which is retried)
    drops the completions it was sending, and the server reclaims their jobs; the thread that
    sent them lives on and later jobs complete (a plain function's from its own thread, an
    async one's from the sender)."""
    args = {"x": 0} if task == "t.async" else None
    first = server.add(task, args)
    calls: list[str] = []

    class Failing(Worker):
        def send_completions(self, done: list[tuple[Any, dict[str, Any]]]) -> None:
            calls.append(threading.current_thread().name)
            if len(calls) == 1:
                raise RuntimeError("a bug in the sending")
            super().send_completions(done)

    run = start(make_app(server.url), Failing, concurrency=1)
    w = run.worker
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.02)
    later = [server.add(task, args) for _ in range(3)]
    got = server.wait_outcomes(3)
    run.stop()
    assert first not in got
    assert all(got[j]["outcome"] == outcome for j in later)
    assert w.stats.dropped == 1 and w.busy == 0
    expected = "homing-task-0" if task == "t.boom" else "homing-sender"
    assert calls[0] == expected, calls
