"""The task `homing chaos --worker-kind python` runs in its Python workers: the Python twin of
the Rust load's `builtin.http` job. It calls the chaos counter with the job's idempotency key
(the job id) and returns the counter's answer as `builtin.http` does ({"status", "body"}), so
the checker reads a Python job's result exactly as a Rust one's: the body names the key and the
call number that produced it. The chaos tool writes this file into its run directory."""

from __future__ import annotations

import threading
from typing import Any, Optional

import httpx

from homing import App, Context, Retry

app = App()
_local = threading.local()


def _client() -> httpx.Client:
    c: Optional[httpx.Client] = getattr(_local, "client", None)
    if c is None:
        c = httpx.Client(timeout=10.0)
        _local.client = c
    return c


@app.task(name="chaos.call", queue="chaos")
def call(ctx: Context, url: str, timeout: str = "10s") -> dict[str, Any]:
    try:
        r = _client().get(url, headers={"Idempotency-Key": ctx.idempotency_key})
    except httpx.HTTPError as e:
        raise Retry(f"counter unreachable: {e}") from e
    if r.status_code >= 400:
        raise Retry(f"counter answered {r.status_code}")
    return {"status": r.status_code, "body": r.json()}
