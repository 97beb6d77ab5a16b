"""The measurement behind scripts/bench-python (run it through that script): one Python worker
process draining no-op jobs through homing's remote worker protocol, against a stock Celery
worker with the seeds' settings, on the same machine in the same run.

Throughput is taken in the steady state, from outside both systems: the number of finished jobs
is polled (homing: the store's per-queue counts over the API; Celery: the queue's length plus
kombu's unacked hash in Redis) and the rate is the jobs finished between 10 % and 90 % of the
total divided by the time between those two moments, so neither worker's start-up counts."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import httpx

CELERY_APP = '''
import os
from celery import Celery

# The seeds' settings: Redis broker, no result backend, late ack, prefetch 1.
app = Celery("benchapp", broker=os.environ["CELERY_BROKER"])
app.conf.task_acks_late = True
app.conf.worker_prefetch_multiplier = 1
app.conf.task_reject_on_worker_lost = True
app.conf.task_ignore_result = True


@app.task(name="bench.noop")
def noop(**kwargs):
    return None
'''

HOMING_TASKS = '''
from homing import App

app = App()


@app.task(name="bench.noop", queue="pybench")
def noop(ctx, **kwargs):
    return None


@app.task(name="bench.anoop", queue="pybench")
async def anoop(ctx, **kwargs):
    return None
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, check: Callable[[], bool], limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            sys.exit(f"bench-python: timed out waiting for {what}")
        time.sleep(0.05)


def steady_rate(n: int, done: Callable[[], int], limit: float) -> float:
    """Jobs per second between 10 % and 90 % of `n` finished."""
    lo, hi = max(1, n // 10), n - n // 10
    t_lo: float | None = None
    t_hi: float | None = None
    d_lo = d_hi = 0
    deadline = time.monotonic() + limit
    while t_hi is None:
        d = done()
        now = time.monotonic()
        if t_lo is None and d >= lo:
            t_lo, d_lo = now, d
        if t_lo is not None and d >= hi:
            t_hi, d_hi = now, d
        if now > deadline:
            sys.exit(f"bench-python: only {d} of {n} jobs finished in {limit}s")
        time.sleep(0.02)
    assert t_lo is not None
    return (d_hi - d_lo) / max(t_hi - t_lo, 1e-6)


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def homing_round(url: str, dir: Path, n: int, task: str, concurrency: int, py: str) -> float:
    http = httpx.Client(base_url=url, timeout=30)
    body = {"task": task, "queue": "pybench", "args": {}, "allow_unknown_task": True}

    def post(_: int) -> None:
        r = http.post("/v1/jobs", json=body)
        r.raise_for_status()

    def finished() -> int:
        for q in http.get("/v1/queues").json()["queues"]:
            if q["queue"] == "pybench":
                return int(q["succeeded"]) + int(q["failed"]) + int(q["dead"])
        return 0

    base = finished()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(post, range(n)))
    env = {**os.environ, "HOMING_URL": url}
    env.pop("HOMING_API_TOKEN", None)
    w = subprocess.Popen([py, "-m", "homing", "worker", "bench_tasks", "--concurrency",
                          str(concurrency), "--log-level", "WARNING"], cwd=dir, env=env,
                         stdout=subprocess.DEVNULL, stderr=open(dir / "pyworker.log", "ab"))
    try:
        return steady_rate(n, lambda: finished() - base, 600)
    finally:
        stop(w)


def celery_round(sock: Path, dir: Path, n: int, py: str) -> float:
    env = {**os.environ, "CELERY_BROKER": f"redis+socket://{sock}"}
    produce = ("import benchapp\n"
               f"for _ in range({n}):\n"
               "    benchapp.app.send_task('bench.noop', queue='bench', kwargs={})\n")
    subprocess.run([py, "-c", produce], cwd=dir, env=env, check=True)

    def remaining() -> int:
        script = "return redis.call('llen', 'bench') + redis.call('hlen', 'unacked')"
        out = subprocess.run(["redis-cli", "-s", str(sock), "eval", script, "0"],  # noqa: S607
                             capture_output=True, text=True, check=True)
        return int(out.stdout.strip() or 0)

    w = subprocess.Popen([py, "-m", "celery", "-A", "benchapp", "worker", "-Q", "bench",
                          "--concurrency", "1", "--pool", "prefork", "--without-gossip",
                          "--without-mingle", "--without-heartbeat", "-l", "warning"],
                         cwd=dir, env=env, stdout=subprocess.DEVNULL,
                         stderr=open(dir / "celery.log", "ab"))
    try:
        return steady_rate(n, lambda: n - remaining(), 600)
    finally:
        stop(w)


def main() -> int:
    a = argparse.ArgumentParser()
    a.add_argument("--homing", required=True)
    a.add_argument("--python", required=True, help="python with the homing package")
    a.add_argument("--celery-python", required=True, help="python with Celery")
    a.add_argument("--jobs", type=int, default=2000)
    a.add_argument("--rounds", type=int, default=3)
    o = a.parse_args()
    for tool, pkg in (("redis-server", "redis-server"), ("redis-cli", "redis-tools")):
        if shutil.which(tool) is None:
            sys.exit(f"bench-python: {tool} is missing (Debian package {pkg})")
    dir = Path(tempfile.mkdtemp(prefix="homing-bench-python-"))
    (dir / "benchapp.py").write_text(CELERY_APP)
    (dir / "bench_tasks.py").write_text(HOMING_TASKS)
    sock = dir / "redis.sock"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", str(sock), "--save", "",  # noqa: S607
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        port = free_port()
        db = f"sqlite://{dir}/homing.db"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOMING_")}
        env.update(HOMING_BROKER=db, HOMING_STORE=db, HOMING_LOG="warn")
        procs.append(subprocess.Popen([o.homing, "up", "--listen", f"127.0.0.1:{port}"],
                                      env=env, cwd=dir, stdout=subprocess.DEVNULL,
                                      stderr=open(dir / "homing.log", "ab")))
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until("homing up", healthy)
        wait_until("redis-server", sock.exists)
        kinds: dict[str, list[float]] = {
            "homing, Python worker, 1 thread": [],
            "homing, Python worker, 8 threads": [],
            "homing, Python worker, async, 8 slots": [],
            "Celery 5.4, prefork 1 (seeds' settings)": [],
        }
        for r in range(o.rounds):
            kinds["homing, Python worker, 1 thread"].append(
                homing_round(url, dir, o.jobs, "bench.noop", 1, o.python))
            kinds["homing, Python worker, 8 threads"].append(
                homing_round(url, dir, o.jobs, "bench.noop", 8, o.python))
            kinds["homing, Python worker, async, 8 slots"].append(
                homing_round(url, dir, o.jobs, "bench.anoop", 8, o.python))
            kinds["Celery 5.4, prefork 1 (seeds' settings)"].append(
                celery_round(sock, dir, o.jobs, o.celery_python))
            print(f"round {r + 1}: " + ", ".join(f"{k}: {v[-1]:.0f}/s" for k, v in kinds.items()),
                  file=sys.stderr)
        celery = statistics.median(kinds["Celery 5.4, prefork 1 (seeds' settings)"])
        print(f"| worker ({o.jobs} no-op jobs, median of {o.rounds}) | jobs/s | vs Celery |")
        print("| --- | ---: | ---: |")
        for k, v in kinds.items():
            m = statistics.median(v)
            print(f"| {k} | {m:.0f} | {m / celery:.2f}x |")
        print(json.dumps({k: v for k, v in kinds.items()}), file=sys.stderr)
        return 0
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
