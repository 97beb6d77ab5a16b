"""The measurement behind scripts/bench-peers (run it through that script, which installs the
peers): homing against BullMQ and Celery on the same machine, in one run, at the same job count,
worker processes and concurrency, alternating the systems run by run.

Every system is measured the same way: its worker processes are started first and waited for,
then N no-op jobs are added in bulk (500 per call) while the workers already drain them, and the
throughput is N over the time from the first add to the last job's finish. The CPU-seconds
(user + system) of every process of a run (workers, producer, the Redis/PostgreSQL servers the
run starts) are taken from this process's reaped children, as scripts/bench-compare does.

- homing: `homing bench --backends B --jobs N --workers W --concurrency C --idle-samples 0`,
  which starts its own throwaway servers and workers and reads first-created and last-finished
  from the job records. Every state change of every job is recorded durably in the store
  (SQLite WAL, synchronous=NORMAL; PostgreSQL fsync on) before it is acknowledged.
- BullMQ: W node processes each running one `Worker` of concurrency C with a no-op processor,
  jobs added with `Queue.addBulk`, on a redis-server of its own without persistence (`save ""`,
  `appendonly no`, as homing's bench runs its Redis): a job's record lives in Redis memory only,
  and a Redis restart loses every job. Completed jobs are kept (BullMQ's default).
- Celery: W `celery worker` processes with the prefork pool of C children each (so W x C OS
  processes, where homing and BullMQ run C slots in each of W processes), on a redis-server of
  its own without persistence and with no result backend (`task_ignore_result`): a finished task
  leaves no record at all. Tasks are sent with `send_task` through one producer connection
  (Celery has no bulk send). Two rows: Celery's defaults (the message is acknowledged before the
  task runs, prefetch 4 per child), and the seeds' settings (`task_acks_late`,
  `task_reject_on_worker_lost`, `worker_prefetch_multiplier=1`). To know when the last task
  finished, each task does one Redis INCR on a counter (Celery without a result backend has no
  other record of it): one round trip per task more than a pure no-op.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Optional

CELERY_APP = '''
import os
import time

import redis
from celery import Celery
from celery.signals import worker_ready

app = Celery("peersapp", broker=os.environ["CELERY_BROKER"])
# No result backend: a finished task leaves no record.
app.conf.task_ignore_result = True
app.conf.worker_hijack_root_logger = False
if os.environ.get("PEERS_SEEDS") == "1":
    # The seeds' settings: acknowledge after the task ran, give the task back when its child
    # dies, fetch one message per child at a time.
    app.conf.task_acks_late = True
    app.conf.task_reject_on_worker_lost = True
    app.conf.worker_prefetch_multiplier = 1

_redis = None


def _r():
    global _redis
    if _redis is None:
        _redis = redis.Redis(unix_socket_path=os.environ["PEERS_REDIS_SOCKET"])
    return _redis


@worker_ready.connect
def _ready(**kwargs):
    _r().incr("peers:ready")


@app.task(name="peers.noop")
def noop():
    # The only way to know when the last task finished without a result backend.
    if _r().incr("peers:done") == int(os.environ["PEERS_N"]):
        _r().set("peers:end", repr(time.time()))
'''

CELERY_PRODUCER = '''
import json
import os
import sys
import time

import redis
import peersapp

n = int(sys.argv[1])
r = redis.Redis(unix_socket_path=os.environ["PEERS_REDIS_SOCKET"])
app = peersapp.app
t0 = time.time()
with app.producer_or_acquire() as producer:
    for _ in range(n):
        app.send_task("peers.noop", queue="peers", producer=producer)
enqueued = time.time()
deadline = time.time() + 3600
while r.get("peers:end") is None:
    if time.time() > deadline:
        raise SystemExit("timed out: %s of %d tasks finished" % (r.get("peers:done"), n))
    time.sleep(0.05)
print(json.dumps({"t0": t0, "enqueued": enqueued, "end": float(r.get("peers:end"))}))
'''


BULLMQ = "BullMQ 6.7.0"
CELERY = "Celery 5.4 prefork, defaults"
CELERY_SEEDS = "Celery 5.4 prefork, seeds' settings"
RECORDS = {
    "homing embedded": "every state change in SQLite (WAL, synchronous=NORMAL)",
    "homing redis-sqlite": "every state change in SQLite (WAL, synchronous=NORMAL); Redis "
                           "carries the messages only",
    "homing redis-postgres": "every state change in PostgreSQL (fsync on, synchronous_commit on)",
    BULLMQ: "job records in Redis memory, no persistence (a Redis restart loses them)",
    CELERY: "nothing: no result backend; the message is acked before the task runs",
    CELERY_SEEDS: "nothing: no result backend; the message is acked after the task ran",
}


@dataclass
class Run:
    jobs_per_s: float
    cpu_s: float
    load: float


@dataclass
class System:
    name: str
    records: str
    run: Callable[[int], Run]


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class Redis:
    """A redis-server of the run's own on a unix socket, without persistence, reaped by us (so
    its CPU-seconds are counted)."""

    def __init__(self, dir: Path) -> None:
        self.sock = dir / "redis.sock"
        self.proc = subprocess.Popen(
            [tool("redis-server", "redis-server"), "--port", "0", "--unixsocket", str(self.sock),
             "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction",
             "--dir", str(dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self.sock.exists(), 10, "redis-server did not start")

    def stop(self) -> None:
        stop([self.proc])


def tool(name: str, package: str) -> str:
    """The full path of a command, or a clear error naming the Debian package that brings it."""
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"bench-peers: {name} is missing (Debian package {package})")
    return path


def wait_for(cond: Callable[[], bool], secs: float, what: str) -> None:
    deadline = time.monotonic() + secs
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(what)
        time.sleep(0.02)


def stop(procs: list[subprocess.Popen[bytes]], sig: int = signal.SIGTERM) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def measured(body: Callable[[Path], float]) -> Run:
    """Runs one measurement in a scratch directory: `body` returns the jobs/s; CPU-seconds are
    those of every child reaped meanwhile."""
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    # The bench's PostgreSQL runs as the postgres user and must reach its data directory below.
    work.chmod(0o755)
    load = loadavg()
    before = cpu_children()
    try:
        tput = body(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu = cpu_children() - before
    return Run(tput, cpu, max(load, loadavg()))


def rate(n: int, t0: float, end: float) -> float:
    """N over the time from the first add to the last finish (Unix seconds)."""
    return n / max(end - t0, 1e-6)


def homing_run(binary: str, backend: str, a: argparse.Namespace, conc: int) -> Callable[[int], Run]:
    def run(n: int) -> Run:
        def body(work: Path) -> float:
            cmd = [binary, "bench", "--backends", backend, "--jobs", str(n), "--workers",
                   str(a.workers), "--concurrency", str(conc), "--idle-samples", "0", "--json"]
            p = subprocess.run(cmd, cwd=work, env={**os.environ, "TMPDIR": str(work)},
                               capture_output=True, text=True, timeout=a.timeout)
            lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
            if p.returncode != 0 or not lines:
                raise SystemExit(f"homing bench failed ({p.returncode}): {p.stderr[-2000:]}")
            # First created to last finished, read by the bench from the job records.
            return float(json.loads(lines[-1])["throughput_per_s"])

        return measured(body)

    return run


def bullmq_run(node_dir: Path, a: argparse.Namespace, conc: int) -> Callable[[int], Run]:
    def run(n: int) -> Run:
        def body(work: Path) -> float:
            redis = Redis(work)
            workers: list[subprocess.Popen[bytes]] = []
            try:
                for _ in range(a.workers):
                    workers.append(subprocess.Popen(
                        [tool("node", "nodejs"), "bullmq-worker.mjs", "peers", str(conc),
                         str(redis.sock)],
                        cwd=node_dir, stdout=subprocess.PIPE))
                for w in workers:
                    assert w.stdout is not None
                    if w.stdout.readline().strip() != b"ready":
                        raise SystemExit("a BullMQ worker did not start")
                p = subprocess.run(
                    [tool("node", "nodejs"), "bullmq-producer.mjs", "peers", str(n), str(a.chunk),
                     str(redis.sock)], cwd=node_dir, capture_output=True, text=True,
                    timeout=a.timeout)
                if p.returncode != 0:
                    raise SystemExit(f"BullMQ producer failed: {p.stderr[-2000:]}")
                r = json.loads(p.stdout.strip().splitlines()[-1])
                return rate(n, r["t0"] / 1000, r["end"] / 1000)
            finally:
                stop(workers)
                redis.stop()

        return measured(body)

    return run


def celery_run(py: str, a: argparse.Namespace, conc: int, seeds: bool) -> Callable[[int], Run]:
    def run(n: int) -> Run:
        def body(work: Path) -> float:
            (work / "peersapp.py").write_text(CELERY_APP)
            redis = Redis(work)
            env = {**os.environ, "CELERY_BROKER": f"redis+socket://{redis.sock}",
                   "PEERS_REDIS_SOCKET": str(redis.sock), "PEERS_N": str(n),
                   "PEERS_SEEDS": "1" if seeds else "0", "PYTHONPATH": str(work)}
            try:
                with open(work / "celery.log", "ab") as log:
                    return celery_measure(py, a, conc, n, work, redis, env, log)
            finally:
                redis.stop()

        return measured(body)

    return run


def celery_measure(py: str, a: argparse.Namespace, conc: int, n: int, work: Path, redis: Redis,
                   env: dict[str, str], log: IO[bytes]) -> float:
    """Starts W Celery workers, waits for them, sends N tasks and waits for the last one."""
    redis_cli = tool("redis-cli", "redis-tools")
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(a.workers):
            workers.append(subprocess.Popen(
                [py, "-m", "celery", "-A", "peersapp", "worker", "-Q", "peers", "-n",
                 f"w{i}@%h", "--pool", "prefork", "--concurrency", str(conc),
                 "--without-gossip", "--without-mingle", "--without-heartbeat",
                 "-l", "warning"], cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=log))

        def ready() -> bool:
            out = subprocess.run([redis_cli, "-s", str(redis.sock), "get", "peers:ready"],
                                 capture_output=True, text=True)
            return out.stdout.strip() == str(a.workers)

        wait_for(ready, 300, f"the Celery workers did not start; see {work}/celery.log")
        p = subprocess.run([py, "-c", CELERY_PRODUCER, str(n)], cwd=work, env=env,
                           capture_output=True, text=True, timeout=a.timeout)
        if p.returncode != 0:
            raise SystemExit(f"Celery producer failed: {p.stderr[-2000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        return rate(n, float(r["t0"]), float(r["end"]))
    finally:
        # Warm shutdown: each main process reaps its children, so their CPU is counted.
        stop(workers)


def fmt(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog=(__doc__ or "").split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--homing", required=True, help="the homing binary")
    ap.add_argument("--node-dir", required=True, help="where BullMQ is installed")
    ap.add_argument("--celery-python", required=True, help="a python with Celery")
    ap.add_argument("--jobs", type=int, default=20000, help="no-op jobs per run (20000)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs of each system and concurrency; medians are printed (3)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    ap.add_argument("--concurrency", default="8,32,128",
                    help="concurrency of each worker process, a list (8,32,128)")
    ap.add_argument("--backends", default="embedded,redis-sqlite,redis-postgres",
                    help="homing backends to run (embedded,redis-sqlite,redis-postgres)")
    ap.add_argument("--peers", default="bullmq,celery,celery-seeds",
                    help="peers to run (bullmq,celery,celery-seeds)")
    ap.add_argument("--chunk", type=int, default=500,
                    help="jobs per addBulk call (500, as homing bench enqueues)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per run (3600)")
    ap.add_argument("--jsonl", metavar="FILE", help="also append every run to FILE")
    ap.add_argument("--from-jsonl", metavar="FILE",
                    help="run nothing: print the table of the runs recorded in FILE")
    a = ap.parse_args()
    try:
        concs = [int(c) for c in a.concurrency.split(",") if c]
    except ValueError:
        ap.error("--concurrency: a comma-separated list of numbers, e.g. 8,32,128")
    if a.jobs < 1 or a.rounds < 1 or a.workers < 1 or a.chunk < 1 or any(c < 1 for c in concs):
        ap.error("--jobs, --rounds, --workers, --chunk and --concurrency must be at least 1")
    backends = [b for b in a.backends.split(",") if b]
    peers = [p for p in a.peers.split(",") if p]
    for b in backends:
        if b not in ("embedded", "redis-sqlite", "redis-postgres"):
            ap.error(f"--backends: unknown {b!r} (embedded, redis-sqlite, redis-postgres)")
    for p in peers:
        if p not in ("bullmq", "celery", "celery-seeds"):
            ap.error(f"--peers: unknown {p!r} (bullmq, celery, celery-seeds)")

    if a.from_jsonl:
        return report_jsonl(a.from_jsonl)

    def systems(conc: int) -> list[System]:
        out = [System(f"homing {b}", RECORDS[f"homing {b}"], homing_run(a.homing, b, a, conc))
               for b in backends]
        if "bullmq" in peers:
            out.append(System(BULLMQ, RECORDS[BULLMQ], bullmq_run(Path(a.node_dir), a, conc)))
        if "celery" in peers:
            out.append(System(CELERY, RECORDS[CELERY], celery_run(a.celery_python, a, conc,
                                                                  False)))
        if "celery-seeds" in peers:
            out.append(System(CELERY_SEEDS, RECORDS[CELERY_SEEDS],
                              celery_run(a.celery_python, a, conc, True)))
        return out

    results: dict[tuple[int, str], list[Run]] = {}
    records: dict[str, str] = {}
    loads: list[float] = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for rnd in range(a.rounds):
        for conc in concs:
            syss = systems(conc)
            turn = rnd % len(syss)
            for s in syss[turn:] + syss[:turn]:
                r = s.run(a.jobs)
                records[s.name] = s.records
                loads.append(r.load)
                results.setdefault((conc, s.name), []).append(r)
                print(f"round {rnd + 1} c={conc} {s.name}: {r.jobs_per_s:,.0f} jobs/s, "
                      f"{r.cpu_s:.2f} CPU-s, load {r.load:.1f}", file=sys.stderr, flush=True)
                if a.jsonl:
                    with open(a.jsonl, "a") as f:
                        f.write(json.dumps({"round": rnd + 1, "concurrency": conc,
                                            "system": s.name, "jobs": a.jobs,
                                            "workers": a.workers, "jobs_per_s": r.jobs_per_s,
                                            "cpu_s": r.cpu_s, "load": r.load}) + "\n")

    names = [s.name for s in systems(concs[0])]
    report(results, names, concs, a.jobs, a.workers, started, loads)
    return 0


def report(results: dict[tuple[int, str], list[Run]], names: list[str], concs: list[int],
           jobs: int, workers: int, started: str, loads: list[float]) -> None:
    runs = min(len(v) for v in results.values())
    print(f"\n{jobs:,} no-op jobs, {workers} worker processes, {runs} runs of each (rounds "
          f"alternated), started {started}; load average (1 min) during the runs "
          f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs. Median jobs/s "
          "(lowest-highest); CPU-seconds of all processes per run, median.\n")
    print("How each records its jobs:")
    for n in names:
        print(f"- {n}: {RECORDS.get(n, '?')}")

    def med(conc: int, name: str) -> Optional[float]:
        rs = results.get((conc, name))
        return statistics.median(r.jobs_per_s for r in rs) if rs else None

    peer_names = [n for n in names if not n.startswith("homing")]
    for conc in concs:
        print(f"\nConcurrency {conc} per worker process\n")
        head = "| system | jobs/s | CPU-s |" + "".join(f" homing / {p} |" for p in peer_names)
        print(head)
        print("|---|---|---|" + "---|" * len(peer_names))
        for n in names:
            rs = results.get((conc, n))
            if not rs:
                continue
            v = [r.jobs_per_s for r in rs]
            cpu = statistics.median(r.cpu_s for r in rs)
            cells = ""
            for p in peer_names:
                m, pm = med(conc, n), med(conc, p)
                cells += f" {m / pm:.2f} |" if n.startswith("homing") and m and pm else " |"
            print(f"| {n} | {fmt(statistics.median(v))} ({fmt(min(v))}-{fmt(max(v))}) | "
                  f"{cpu:.2f} |{cells}")


def report_jsonl(path: str) -> int:
    """The same report from the runs a --jsonl file recorded (all of them, or the rounds an
    interrupted run finished)."""
    results: dict[tuple[int, str], list[Run]] = {}
    names: list[str] = []
    concs: list[int] = []
    loads: list[float] = []
    jobs = workers = 0
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            c, n = int(r["concurrency"]), str(r["system"])
            if n not in names:
                names.append(n)
            if c not in concs:
                concs.append(c)
            jobs, workers = int(r["jobs"]), int(r["workers"])
            loads.append(float(r["load"]))
            results.setdefault((c, n), []).append(
                Run(float(r["jobs_per_s"]), float(r["cpu_s"]), float(r["load"])))
    if not results:
        raise SystemExit(f"{path}: no runs recorded")
    names.sort(key=lambda n: (not n.startswith("homing"), list(RECORDS).index(n)
                              if n in RECORDS else 99))
    report(results, names, concs, jobs, workers, f"(from {path})", loads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
