"""Fixtures that run the real `homing` binary (HOMING_BIN, built by scripts/test) and real
`python -m homing worker` processes."""

from __future__ import annotations

import itertools
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Optional

import httpx
import pytest

HERE = Path(__file__).parent


def homing_bin() -> str:
    path = os.environ.get("HOMING_BIN")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("HOMING_BIN must name a built homing binary (scripts/test sets it to "
                    "target/debug/homing after `cargo build -p homing-cli`)")
    return path


_next_port = itertools.count()
# A random start: processes started together have nearly consecutive pids.
_start_port = random.randrange(22000)


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (32768 and up by default): a
    port from that range can be taken by another process binding port 0, or as an outgoing
    connection's local port, between the choice and the server's bind, or while a server is down
    to be restarted on it."""
    low, span = 10000, 22000
    start = _start_port
    for _ in range(span):
        port = low + (start + next(_next_port)) % span
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free loopback port between {low} and {low + span}")


def eventually(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def worker_live(url: str, queue: str = "py") -> bool:
    """Some live worker consumes `queue` (as `GET /v1/workers` reports it)."""
    try:
        workers = httpx.get(f"{url}/v1/workers", timeout=5).json()["workers"]
    except (httpx.HTTPError, KeyError, ValueError):
        return False
    return any(queue in w.get("queues", []) and (w.get("alive") or w.get("status") == "live")
               for w in workers)


class Proc:
    def __init__(self, args: list[str], log: Path, env: dict[str, str],
                 cwd: Optional[Path] = None) -> None:
        self.log = log
        self.out: IO[bytes] = open(log, "ab")  # closed in stop()
        self.p = subprocess.Popen(args, stdout=self.out, stderr=subprocess.STDOUT, env=env,
                                  cwd=cwd, stdin=subprocess.DEVNULL)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        return self.p.wait(timeout)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
        self.out.close()


class Homing:
    """A `homing up` (server + embedded broker and store) on a free port."""

    def __init__(self, tmp: Path, token: Optional[str] = None, port: Optional[int] = None) -> None:
        self.tmp = tmp
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.procs: list[Proc] = []
        self.server: Optional[Proc] = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOMING_")}
        db = f"sqlite://{self.tmp}/homing.db"
        env.update(HOMING_BROKER=db, HOMING_STORE=db, HOMING_LOG="info")
        return env

    def start(self) -> Homing:
        env = self.env()
        if self.token:
            env["HOMING_API_TOKEN"] = self.token
        self.server = Proc([homing_bin(), "up", "--listen", f"127.0.0.1:{self.port}",
                            "--heartbeat-interval", "200ms"], self.tmp / "up.log", env)
        self.procs.append(self.server)

        def healthy() -> bool:
            try:
                return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                assert self.server is not None
                if self.server.p.poll() is not None:
                    raise AssertionError(f"homing up exited: {self.server.text()}") from None
                return False

        eventually("homing up to answer /healthz", healthy)
        return self

    def worker(self, *args: str, token: Optional[str] = None, name: str = "worker",
               module: str = "proc_tasks", cwd: Path = HERE,
               extra_env: Optional[dict[str, str]] = None) -> Proc:
        env = self.env()
        env["HOMING_URL"] = self.url
        env.update(extra_env or {})
        tok = token if token is not None else self.token
        if tok:
            env["HOMING_API_TOKEN"] = tok
        p = Proc([sys.executable, "-m", "homing", "worker", module,
                  "--heartbeat-interval", "200ms", "--poll", "1s", *args],
                 self.tmp / f"{name}-{len(self.procs)}.log", env, cwd=cwd)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


@pytest.fixture
def homing(tmp_path: Path) -> Iterator[Homing]:
    h = Homing(tmp_path).start()
    yield h
    h.stop()
