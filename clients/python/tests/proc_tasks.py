"""Tasks the process tests run in real `python -m homing worker` processes."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import httpx

from homing import App, Context, Fatal, Retry

app = App()

# Not `default`: `homing up` runs its own Rust worker there, which would take these jobs and
# dead-letter them as tasks it does not know.
QUEUE = "py"


@app.task(name="py.add", queue=QUEUE)
def add(ctx: Context, a: int, b: int) -> dict[str, Any]:
    return {"sum": a + b, "attempt": ctx.attempt, "epoch": ctx.epoch, "job": ctx.job_id,
            "key": ctx.idempotency_key}


@app.task(name="py.trace", queue=QUEUE)
def trace(ctx: Context) -> Any:
    return ctx.traceparent


@app.task(name="py.async_add", queue=QUEUE)
async def async_add(ctx: Context, a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@app.task(name="py.flaky", queue=QUEUE, max_retries=3, retry_delay=0.1)
def flaky(ctx: Context, fails: int) -> dict[str, int]:
    if ctx.attempt < fails:
        raise Retry(f"attempt {ctx.attempt} fails on purpose", delay=0.1)
    return {"attempt": ctx.attempt}


@app.task(name="py.boom", queue=QUEUE, max_retries=0)
def boom(ctx: Context) -> None:
    raise ValueError("kaboom from python")


@app.task(name="py.boom_once", queue=QUEUE, max_retries=2, retry_delay=0.1)
def boom_once(ctx: Context) -> dict[str, int]:
    if ctx.attempt == 0:
        raise KeyError("kaboom on the first attempt")
    return {"attempt": ctx.attempt}


@app.task(name="py.fatal", queue=QUEUE, max_retries=5)
def fatal(ctx: Context) -> None:
    raise Fatal("this input can never work")


@app.task(name="py.set", queue=QUEUE)
def not_json(ctx: Context) -> Any:
    return {1, 2, 3}


@app.task(name="py.wide", queue=QUEUE)
def wide(ctx: Context, n: Any) -> dict[str, int]:
    return {"n": int(n)}


@app.task(name="py.sleep", queue=QUEUE)
def sleep(ctx: Context, seconds: float) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.cancelled():
            raise RuntimeError("cancelled while sleeping")
        ctx.progress({"left": round(deadline - time.monotonic(), 2)})
        time.sleep(0.05)
    return {"slept": seconds, "pid": os.getpid(), "epoch": ctx.epoch}


@app.task(name="py.call", queue=QUEUE, max_retries=5, retry_delay=0.1)
def call(ctx: Context, url: str, hold: float = 0.0) -> dict[str, Any]:
    """Calls an external witness that counts calls per Idempotency-Key (the job's id), then
    holds the job for `hold` seconds."""
    r = httpx.post(url, headers={"Idempotency-Key": ctx.job_id}, timeout=10)
    r.raise_for_status()
    time.sleep(hold)
    return {"key": ctx.job_id, "pid": os.getpid(), "epoch": ctx.epoch}


@app.task(name="py.gather", queue=QUEUE)
def gather(ctx: Context) -> dict[str, Any]:
    """A workflow's final step: what it saw of its parents and of its workflow."""
    return {
        "parents": {name: [p["state"], p.get("result")] for name, p in ctx.parents.items()},
        "step": (ctx.workflow or {}).get("step"),
    }
