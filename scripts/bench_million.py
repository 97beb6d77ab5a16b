"""The measurement behind scripts/bench-million (run it through that script): a backlog of N jobs
(a million by default) enqueued first, then drained by W `homing worker` processes beside a
`homing server` (API, dashboard, maintenance), all on one store.

While the workers drain, once a second: the resident memory (VmRSS) of the server and of each
worker, and the latency of what a person watching would ask, over HTTP keep-alive: the API's
list (`GET /v1/jobs?limit=25`) and one dashboard refresh (the page `GET /`, then the calls its
refresh makes: whoami, queues, workers, jobs, schedules, workflows, audit, timed one after the
other, so the figure is an upper bound of the browser's parallel calls). The drain's throughput
is N over the time from the first start to the last finish, read from the job records; the rate
in each tenth of the drain shows whether it holds up as the table grows.

After the drain: the store's bytes per finished job (the SQLite file and its WAL, checkpointed,
over the jobs in it). Then the pruner's cost: a further --prune-jobs backlog is drained twice,
first with the server's retention at `forever` (nothing deleted), then with a retention that
makes every job already finished (the million and the first batch) due, so the pruner deletes
them while the second batch drains; it prints both throughputs and how fast the pruner deleted.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

DASHBOARD_CALLS = ["/v1/whoami", "/v1/queues", "/v1/workers", "/v1/jobs?limit=25",
                   "/v1/schedules", "/v1/workflows?limit=10", "/v1/audit?limit=20"]


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"bench-million: {name} is missing (Debian package {package})")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def pct(v: list[float], p: float) -> float:
    if not v:
        return float("nan")
    s = sorted(v)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class Api:
    """One keep-alive connection to the server; times each GET in milliseconds."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def get(self, path: str) -> tuple[float, Any]:
        t = time.perf_counter()
        try:
            self.conn.request("GET", path)
            r = self.conn.getresponse()
            body = r.read()
        except (OSError, http.client.HTTPException):
            # A dropped keep-alive connection: one retry on a new one, timed as well.
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            self.conn.request("GET", path)
            r = self.conn.getresponse()
            body = r.read()
        ms = (time.perf_counter() - t) * 1000
        if r.status != 200:
            raise SystemExit(f"GET {path}: HTTP {r.status}: {body[:500]!r}")
        ctype = r.getheader("content-type") or ""
        return ms, json.loads(body) if ctype.startswith("application/json") else None


@dataclass
class Samples:
    t: list[float] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    server_mb: list[float] = field(default_factory=list)
    worker_mb: list[list[float]] = field(default_factory=list)
    list_ms: list[float] = field(default_factory=list)
    page_ms: list[float] = field(default_factory=list)
    refresh_ms: list[float] = field(default_factory=list)
    stored: list[int] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    per_call: dict[str, list[float]] = field(default_factory=dict)


class Deployment:
    def __init__(self, a: argparse.Namespace, dir: Path) -> None:
        self.a = a
        self.dir = dir
        self.redis: Optional[subprocess.Popen[bytes]] = None
        db = dir / "homing.db"
        self.db = db
        self.store = f"sqlite://{db}"
        self.broker = self.store
        if a.backend == "redis-sqlite":
            sock = dir / "redis.sock"
            self.redis = subprocess.Popen(
                [tool("redis-server", "redis-server"), "--port", "0", "--unixsocket", str(sock),
                 "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction",
                 "--dir", str(dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while not sock.exists():
                if time.monotonic() > deadline:
                    raise SystemExit("redis-server did not start")
                time.sleep(0.02)
            self.broker = f"redis+unix://{sock}"
        self.env = {**os.environ, "HOMING_BROKER": self.broker, "HOMING_STORE": self.store,
                    "HOMING_LOG": os.environ.get("HOMING_LOG", "warn")}
        self.log = open(dir / "homing.log", "ab")
        self.server: Optional[subprocess.Popen[bytes]] = None
        self.port = 0
        self.run([a.homing, "migrate"])

    def run(self, cmd: list[str]) -> str:
        p = subprocess.run(cmd, env=self.env, cwd=self.dir, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr[-2000:]}")
        return p.stdout

    def start_server(self, retention: str) -> Api:
        self.port = free_port()
        self.server = subprocess.Popen(
            [self.a.homing, "server", "--listen", f"127.0.0.1:{self.port}", "--retention",
             retention], env=self.env, cwd=self.dir, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while True:
            try:
                api = Api(self.port)
                api.get("/healthz")
                return api
            except (OSError, SystemExit, http.client.HTTPException):
                if time.monotonic() > deadline or self.server.poll() is not None:
                    raise SystemExit(
                        f"homing server did not start; see {self.dir}/homing.log") from None
                time.sleep(0.1)

    def stop_server(self) -> None:
        if self.server is not None:
            stop([self.server])
            self.server = None

    def enqueue(self, n: int) -> tuple[str, float]:
        out = self.run([self.a.homing, "bench", "--enqueue-only", "--jobs", str(n), "--json"])
        r = json.loads(out.strip().splitlines()[-1])
        return str(r["queue"]), float(r["enqueue_per_s"])

    def close(self) -> None:
        self.stop_server()
        if self.redis is not None:
            stop([self.redis])
        self.log.close()


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def queue_counts(queues: Any) -> dict[str, tuple[int, int]]:
    """(unfinished, finished) jobs of each queue, from GET /v1/queues."""
    out = {}
    for q in queues["queues"]:
        done = sum(int(q[k]) for k in ("succeeded", "failed", "dead", "cancelled"))
        out[str(q["queue"])] = (sum(int(q[k]) for k in ("queued", "running", "scheduled")), done)
    return out


def drain(d: Deployment, api: Api, queue: str, n: int, watch: bool,
          every: float) -> tuple[float, Samples]:
    """Starts the workers on `queue`, samples every `every` seconds until none of its N jobs is
    left unfinished, stops the workers. Returns the drain's jobs/s: from the job records (first
    start to last finish) when they are all still there, else (a pruner deleting them) N over
    the time from the workers' start to the first sample that saw the queue empty."""
    a = d.a
    t0 = time.monotonic()
    workers = [subprocess.Popen(
        [a.homing, "worker", "--queue", queue, "--concurrency", str(a.concurrency),
         "--no-maintenance"], env=d.env, cwd=d.dir, stdout=d.log, stderr=d.log)
        for _ in range(a.workers)]
    s = Samples()
    try:
        while True:
            time.sleep(every)
            if watch:
                ms, _ = api.get("/")
                s.page_ms.append(ms)
                total = ms
                queues: Any = None
                for path in DASHBOARD_CALLS:
                    ms, body = api.get(path)
                    s.per_call.setdefault(path, []).append(ms)
                    total += ms
                    if path == "/v1/queues":
                        queues = body
                s.refresh_ms.append(total)
                ms, _ = api.get("/v1/jobs?limit=25")
                s.list_ms.append(ms)
            else:
                _, queues = api.get("/v1/queues")
            counts = queue_counts(queues)
            left, finished = counts.get(queue, (n, 0))
            now = time.monotonic() - t0
            s.t.append(now)
            s.finished.append(n - left)
            s.stored.append(sum(u + f for u, f in counts.values()))
            s.load.append(loadavg())
            if d.server is not None:
                s.server_mb.append(rss_mb(d.server.pid) or float("nan"))
            s.worker_mb.append([rss_mb(w.pid) or float("nan") for w in workers])
            if left == 0 and finished > 0:
                break
            if any(w.poll() is not None for w in workers):
                raise SystemExit(f"a worker exited; see {d.dir}/homing.log")
            if now > a.timeout:
                raise SystemExit(f"timed out: {n - left} of {n} finished")
    finally:
        stop(workers)
    with sqlite3.connect(f"file:{d.db}?mode=ro", uri=True, timeout=60) as c:
        first, last, count = c.execute(
            "SELECT min(started_at), max(finished_at), count(*) FROM jobs WHERE queue = ?",
            (queue,)).fetchone()
    if count == n:
        return n / max((last - first) / 1e6, 1e-6), s
    return n / s.t[-1], s


def deciles(s: Samples, n: int) -> list[str]:
    """The drain's rate in each tenth, from the samples (jobs/s)."""
    out = []
    marks = [n * k // 10 for k in range(11)]
    times: list[float] = []
    for m in marks:
        for t, f in zip(s.t, s.finished):
            if f >= m:
                times.append(t)
                break
    for k in range(1, len(times)):
        dt = times[k] - times[k - 1]
        out.append(f"{(marks[k] - marks[k - 1]) / dt:,.0f}" if dt > 0 else "-")
    return out


def db_bytes(d: Deployment) -> int:
    return sum(p.stat().st_size for p in d.dir.glob("homing.db*"))


def checkpoint(d: Deployment) -> None:
    with sqlite3.connect(str(d.db), timeout=60) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def summary(label: str, v: list[float]) -> str:
    v = [x for x in v if x == x]
    if not v:
        return f"{label}: no samples"
    return (f"{label}: p50 {pct(v, 50):.1f} / p99 {pct(v, 99):.1f} / max {max(v):.1f} "
            f"({len(v)} samples)")


def rss_line(label: str, v: list[float]) -> str:
    v = [x for x in v if x == x]
    if not v:
        return f"{label}: no samples"
    q = max(1, len(v) // 10)
    return (f"{label}: first {statistics.mean(v[:q]):.1f}, last {statistics.mean(v[-q:]):.1f}, "
            f"min {min(v):.1f}, max {max(v):.1f} MB")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog=(__doc__ or "").split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--homing", required=True, help="the homing binary")
    ap.add_argument("--jobs", type=int, default=1_000_000, help="the backlog (1000000)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    ap.add_argument("--concurrency", type=int, default=128, help="of each worker (128)")
    ap.add_argument("--backend", default="embedded", choices=["embedded", "redis-sqlite"])
    ap.add_argument("--prune-jobs", type=int, default=100_000,
                    help="jobs of each of the two pruner batches; 0 skips the pruner (100000)")
    ap.add_argument("--sample-every", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--dir", default="target/bench-million",
                    help="data directory, emptied first and deleted after unless --keep")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per drain")
    a = ap.parse_args()
    if a.jobs < 1 or a.workers < 1 or a.concurrency < 1 or a.prune_jobs < 0:
        ap.error("--jobs, --workers and --concurrency must be at least 1, --prune-jobs >= 0")

    dir = Path(a.dir).resolve() / a.backend
    shutil.rmtree(dir, ignore_errors=True)
    dir.mkdir(parents=True)
    d = Deployment(a, dir)
    try:
        print(f"bench-million: {a.jobs:,} no-op jobs, backend {a.backend}, {a.workers} workers "
              f"x concurrency {a.concurrency}, started "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
              f"{loadavg():.1f} on {os.cpu_count()} CPUs", flush=True)
        api = d.start_server("forever")
        t = time.monotonic()
        queue, enq = d.enqueue(a.jobs)
        print(f"enqueued {a.jobs:,} jobs in {time.monotonic() - t:.1f} s ({enq:,.0f} jobs/s, "
              "`homing bench --enqueue-only`, 500 per call)", flush=True)
        tput, s = drain(d, api, queue, a.jobs, True, a.sample_every)
        print(f"drained at {tput:,.0f} jobs/s (first start to last finish, from the records); "
              f"load average {min(s.load):.1f}-{max(s.load):.1f}")
        print("rate in each tenth of the drain, jobs/s: " + ", ".join(deciles(s, a.jobs)))
        print(rss_line("server RSS", s.server_mb))
        for i in range(a.workers):
            print(rss_line(f"worker {i + 1} RSS", [w[i] for w in s.worker_mb]))
        print(summary("GET /v1/jobs?limit=25 ms", s.list_ms))
        print(summary("GET / (dashboard page) ms", s.page_ms))
        print(summary("dashboard refresh (page + its 7 API calls, one after another) ms",
                      s.refresh_ms))
        for path, v in s.per_call.items():
            print("  " + summary(f"GET {path} ms", v))
        over = sum(1 for v in s.list_ms if v >= 100)
        print(f"list samples at or over 100 ms: {over} of {len(s.list_ms)}")
        d.stop_server()
        checkpoint(d)
        size = db_bytes(d)
        print(f"store after the drain: {size / 1e6:,.1f} MB for {a.jobs:,} finished jobs = "
              f"{size / a.jobs:,.0f} bytes per job (SQLite file, WAL checkpointed)", flush=True)

        if a.prune_jobs:
            # Both batches are timed the same way, by polling until the queue is empty (the
            # pruner deletes the second batch's records too), so their ratio is fair.
            m = a.prune_jobs
            api = d.start_server("forever")
            q1, _ = d.enqueue(m)
            _, s1 = drain(d, api, q1, m, False, 0.25)
            base = m / s1.t[-1]
            print(f"pruner off: {m:,} more jobs drained at {base:,.0f} jobs/s (polled every "
                  "0.25 s)", flush=True)
            d.stop_server()
            # Every job finished so far is older than the retention once the next batch runs.
            time.sleep(2)
            q2, _ = d.enqueue(m)
            old = a.jobs + m
            api = d.start_server("1s")
            t_prune = time.monotonic()
            _, s2 = drain(d, api, q2, m, False, 0.25)
            pruned = m / s2.t[-1]

            def old_left() -> int:
                _, queues = api.get("/v1/queues")
                return sum(u + f for q, (u, f) in queue_counts(queues).items() if q != q2)

            left = old_left()
            print(f"pruner on (retention 1s): {m:,} more jobs drained at {pruned:,.0f} jobs/s "
                  f"(x{pruned / base:.2f} of pruner off) while the pruner deleted "
                  f"{old - left:,} of the {old:,} older finished jobs", flush=True)
            while left > 0 and time.monotonic() - t_prune < a.timeout:
                time.sleep(1)
                left = old_left()
            took = time.monotonic() - t_prune
            print(f"pruner: {old - left:,} older jobs deleted {took:.0f} s after the server "
                  f"started ({(old - left) / took:,.0f}/s, paced batches; {left:,} left)")
            d.stop_server()
            checkpoint(d)
            print(f"store after pruning: {db_bytes(d) / 1e6:,.1f} MB (SQLite keeps freed pages "
                  "for reuse; the file does not shrink without VACUUM)")
    finally:
        d.close()
        if not a.keep:
            shutil.rmtree(dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
