"""A small in-memory stand-in for the server side of the remote worker protocol, for the unit
tests of the worker's own logic (outcome reports, rejoin after 410, resending a completion whose
answer was lost, shutdown). It keeps to the protocol's documented answers; the process tests in
test_process.py run the same package against a real `homing` binary."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional


class FakeServer:
    def __init__(self, token: Optional[str] = None, ttl: float = 3.0, port: int = 0) -> None:
        self.token = token
        self.ttl = ttl
        self.lock = threading.Condition()
        self.queue: list[dict[str, Any]] = []
        self.sessions: dict[str, float] = {}  # session -> heartbeat deadline
        self.registrations: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.running: dict[str, dict[str, Any]] = {}  # job id -> reserved job
        self.outcomes: dict[str, dict[str, Any]] = {}  # job id -> applied report
        self.complete_calls = 0
        self.progress: dict[str, Any] = {}
        self.cancel: set[str] = set()
        self.drop_answers = 0  # complete calls applied but answered by a dropped connection
        self.expire_next_heartbeat = False
        self.answer_complete = threading.Event()  # cleared: complete calls wait before answering
        self.answer_complete.set()
        self.unstore = 0  # completions answered "unstored" (not written) before one is applied
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, status: int, body: Any = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                self.handle_call("POST")

            def do_DELETE(self) -> None:
                self.handle_call("DELETE")

            def handle_call(self, method: str) -> None:
                if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
                    self.reply(401, {"error": {"code": "unauthorized",
                                               "message": "missing or wrong API token"}})
                    return
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                status, answer = server.route(method, self.path, body)
                if status == -1:
                    self.close_connection = True
                    self.connection.close()
                    return
                self.reply(status, answer)

        self.http = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def start(self) -> FakeServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    def add(self, task: str, args: Any = None, **extra: Any) -> str:
        job_id = str(uuid.uuid4())
        with self.lock:
            self.queue.append({"job_id": job_id, "task": task, "queue": "default",
                               "args": {} if args is None else args, "epoch": 1, "attempt": 0,
                               "max_retries": 3, "idempotency_key": None,
                               "time_limit_ms": None, "lease": f"lease-{job_id}", **extra})
            self.lock.notify_all()
        return job_id

    def wait_outcomes(self, n: int, timeout: float = 15.0) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self.lock:
            while len(self.outcomes) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"only {len(self.outcomes)} of {n} outcomes: "
                                         f"{self.outcomes}")
                self.lock.wait(left)
            return dict(self.outcomes)

    def alive(self, sid: str) -> bool:
        return sid in self.sessions and self.sessions[sid] >= time.monotonic()

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        with self.lock:
            if method == "POST" and path == "/v1/remote/sessions":
                sid = f"remote-{uuid.uuid4()}"
                self.sessions[sid] = time.monotonic() + self.ttl
                self.registrations.append(body)
                self.lock.notify_all()
                return 201, {"session": sid, "ttl_ms": int(self.ttl * 1000),
                             "heartbeat_interval_ms": body["heartbeat_interval_ms"]}
            if len(parts) < 4 or parts[:3] != ["v1", "remote", "sessions"]:
                return 404, {"error": {"code": "not_found", "message": path}}
            sid = parts[3]
            if method == "DELETE":
                self.sessions.pop(sid, None)
                self.deleted.append(sid)
                return 204, None
            call = parts[4]
            if call == "heartbeat":
                if self.expire_next_heartbeat:
                    self.expire_next_heartbeat = False
                    self.sessions[sid] = 0
                if not self.alive(sid):
                    return 410, {"error": {"code": "session_expired", "message": "expired"}}
                self.sessions[sid] = time.monotonic() + self.ttl
                mine = [h["job_id"] for h in body["held"] if h["job_id"] in self.cancel]
                return 200, {"alive": True, "ttl_ms": int(self.ttl * 1000), "cancel": mine}
            if call == "reserve":
                if not self.alive(sid):
                    return 410, {"error": {"code": "session_expired", "message": "expired"}}
                deadline = time.monotonic() + body["wait_ms"] / 1000
                while not self.queue and time.monotonic() < deadline:
                    self.lock.wait(deadline - time.monotonic())
                jobs = self.queue[: body["max"]]
                del self.queue[: len(jobs)]
                for j in jobs:
                    self.running[j["job_id"]] = {**j, "session": sid}
                return 200, {"jobs": jobs}
            if call == "complete":
                self.complete_calls += 1
                answers = []
                for r in body["results"]:
                    jid = r["job_id"]
                    applied = self.outcomes.get(jid)
                    if self.unstore > 0:
                        self.unstore -= 1
                        answers.append({"job_id": jid, "status": "unstored"})
                        continue
                    if applied is not None and applied["epoch"] == r["epoch"]:
                        status = "already_applied"
                    elif jid in self.running and self.running[jid]["epoch"] == r["epoch"]:
                        self.outcomes[jid] = r
                        del self.running[jid]
                        status = "applied"
                    else:
                        status = "stale"
                    answers.append({"job_id": jid, "status": status})
                self.lock.notify_all()
                if not self.answer_complete.is_set():
                    self.lock.release()
                    try:
                        self.answer_complete.wait(20)
                    finally:
                        self.lock.acquire()
                if self.drop_answers > 0:
                    self.drop_answers -= 1
                    return -1, None
                return 200, {"results": answers}
            if call == "progress":
                # As the real server: progress for a run that has ended is refused.
                if body["job_id"] not in self.running:
                    return 200, {"status": "stale"}
                self.progress[body["job_id"]] = body["progress"]
                return 200, {"status": "applied"}
        return 404, {"error": {"code": "not_found", "message": path}}
