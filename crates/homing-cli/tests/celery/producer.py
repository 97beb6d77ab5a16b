"""A Python Celery producer, as a Django or FastAPI app would be one: sends tasks with
apply_async (plain, with a countdown, with a priority) and waits for every result with
AsyncResult.get(). Used by tests/celery.rs; reads one JSON spec from argv[1]:

  {"broker": URL, "backend": URL, "queue": Q, "n": N, "kind": "noop" | "http" | "unknown" | "bench" (plain calls only),
   "url": URL (for http), "timeout": seconds}

Prints one JSON object: {"sent", "ok", "failures": [...], "ids": [...], "seconds"}.
"""
import json
import sys
import time

from celery import Celery
from celery.exceptions import NotRegistered

spec = json.loads(sys.argv[1])
app = Celery("producer", broker=spec["broker"], backend=spec["backend"])
app.conf.task_acks_late = True
app.conf.worker_prefetch_multiplier = 1


# Stubs: the producer only needs names; the work runs elsewhere (homing or a Python worker).
@app.task(name="builtin.noop")
def noop(*args, **kwargs):
    raise AssertionError("runs on the worker")


@app.task(name="builtin.http")
def http(**kwargs):
    raise AssertionError("runs on the worker")


@app.task(name="no.such.task")
def unknown(**kwargs):
    raise AssertionError("runs on the worker")


kind, q, n = spec["kind"], spec["queue"], spec["n"]
started = time.time()
sent = []
for i in range(n):
    opts = {"queue": q}
    if kind == "bench":
        sent.append((noop.apply_async(kwargs={"i": i}, **opts), {"i": i}))
        continue
    if i % 3 == 1:
        opts["countdown"] = 1
    elif i % 3 == 2:
        opts["priority"] = i % 10
    if kind == "noop":
        if i % 2:
            r = noop.apply_async(args=[i, "x"], kwargs={"k": i}, **opts)
            want = {"args": [i, "x"], "kwargs": {"k": i}}
        else:
            r = noop.apply_async(kwargs={"i": i, "name": "작업"}, **opts)
            want = {"i": i, "name": "작업"}
    elif kind == "http":
        r = http.apply_async(kwargs={"url": spec["url"], "timeout": "60s"}, **opts)
        want = None
    else:
        r = unknown.apply_async(kwargs={"i": i}, **opts)
        want = "NotRegistered"
    sent.append((r, want))

ok, failures = 0, []
for r, want in sent:
    try:
        got = r.get(timeout=spec.get("timeout", 120))
        if want is None or got == want:
            ok += 1
        else:
            failures.append({"id": r.id, "want": want, "got": got})
    except NotRegistered as e:
        if want == "NotRegistered" and r.state == "FAILURE":
            ok += 1
        else:
            failures.append({"id": r.id, "error": repr(e)})
    except Exception as e:  # noqa: BLE001 - reported to the Rust test
        failures.append({"id": r.id, "error": f"{type(e).__name__}: {e}", "state": r.state})
print(json.dumps({"sent": len(sent), "ok": ok, "failures": failures[:20],
                  "ids": [r.id for r, _ in sent], "seconds": time.time() - started}))
