"""The connection to the server (_http.py) against small socket servers: a kept-alive connection
the server closed while idle is made again, an answer that never comes ends in `Unreachable`
at the call's timeout, errors are read from the server's JSON (a 413 sent before the body was
read included), and a proxy in the environment sends plain HTTP through httpx."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from homing import App
from homing._errors import ApiError, Unreachable
from homing._http import Http, readable


class Server:
    """Answers each request with `answer` and keeps the connection open; one idle for `linger`
    seconds it closes without saying so (as a server whose keep-alive ran out). `linger=None`
    never answers."""

    def __init__(self, answer: bytes, linger: float | None) -> None:
        self.answer = answer
        self.linger = linger
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    try:
                        chunk = conn.recv(65536)
                    except socket.timeout:
                        return  # idle for `linger`: closed without a word
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(data) < length:
                    data += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + data[:length])
                data = data[length:]
                if self.linger is None:
                    time.sleep(30)
                    return
                conn.sendall(self.answer)
                conn.settimeout(self.linger)


def reply(status: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield


def test_a_connection_closed_while_idle_is_made_again() -> None:
    s = Server(reply("200 OK", b'{"ok": true}'), linger=0.05)
    http = Http(f"http://127.0.0.1:{s.port}", None)
    assert http.call("GET", "/a") == {"ok": True}
    time.sleep(0.3)  # the server has closed the connection meanwhile, without a word
    assert http.call("POST", "/b", {"n": 1}) == {"ok": True}
    assert s.connections == 2
    assert s.requests[1].startswith(b"POST /b HTTP/1.1\r\n")
    http.close()


def test_a_kept_alive_connection_is_used_again() -> None:
    s = Server(reply("200 OK", b"{}"), linger=5)
    http = Http(f"http://127.0.0.1:{s.port}/prefix/", "secret")
    for _ in range(3):
        assert http.call("GET", "/v1/x", params={"a": "b c"}) == {}
    assert s.connections == 1
    assert s.requests[0].startswith(b"GET /prefix/v1/x?a=b+c HTTP/1.1\r\n")
    assert b"Authorization: Bearer secret\r\n" in s.requests[0]
    http.close()


def test_no_answer_is_unreachable_at_the_timeout() -> None:
    s = Server(b"", linger=None)
    http = Http(f"http://127.0.0.1:{s.port}", None)
    began = time.monotonic()
    with pytest.raises(Unreachable, match="unreachable"):
        http.call("GET", "/slow", timeout=0.3)
    assert time.monotonic() - began < 5


def test_a_refused_connection_is_unreachable() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(Unreachable):
        Http(f"http://127.0.0.1:{port}", None).call("GET", "/")


def test_errors_are_read_from_the_answer() -> None:
    body = b'{"error": {"code": "not_found", "message": "no such job"}}'
    s = Server(reply("404 Not Found", body), linger=5)
    with pytest.raises(ApiError) as e:
        Http(f"http://127.0.0.1:{s.port}", None).call("GET", "/v1/jobs/x")
    assert (e.value.status, e.value.code, e.value.message) == (404, "not_found", "no such job")
    s2 = Server(reply("502 Bad Gateway", b"<html>upstream</html>"), linger=5)
    with pytest.raises(ApiError) as e:
        Http(f"http://127.0.0.1:{s2.port}", None).call("GET", "/")
    assert (e.value.status, e.value.code) == (502, "http_error")
    assert "upstream" in e.value.message
    s3 = Server(reply("200 OK", b"not json"), linger=5)
    with pytest.raises(ApiError, match="not JSON"):
        Http(f"http://127.0.0.1:{s3.port}", None).call("GET", "/")


def test_a_proxy_in_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy (here the small server) is sent the request in absolute form, as a proxy
    expects; NO_PROXY naming the host calls it directly."""
    proxy = Server(reply("200 OK", b'{"via": "proxy"}'), linger=5)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    assert Http("http://homing.invalid:8080", None).call("GET", "/v1/x") == {"via": "proxy"}
    assert proxy.requests[0].startswith(b"GET http://homing.invalid:8080/v1/x HTTP/1.1\r\n")
    direct = Server(reply("200 OK", b'{"via": "direct"}'), linger=5)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert Http(f"http://127.0.0.1:{direct.port}", None).call("GET", "/") == {"via": "direct"}
    assert len(proxy.requests) == 1


def test_a_refusal_before_the_body_was_read_is_its_answer() -> None:
    """A server refuses a body over its limit from the declared length, and closes without
    reading it: the caller gets the 413, not "unreachable" (which a worker would retry for
    ever)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def refuse() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            conn.sendall(reply("413 Payload Too Large",
                               b'{"error": {"code": "payload_too_large", "message": "over"}}'))
            time.sleep(0.2)

    threading.Thread(target=refuse, daemon=True).start()
    http = Http(f"http://127.0.0.1:{listener.getsockname()[1]}", None)
    try:
        with pytest.raises(ApiError) as e:
            http.call("POST", "/v1/big", {"blob": "x" * (32 << 20)}, timeout=10)
        assert (e.value.status, e.value.code) == (413, "payload_too_large")
    finally:
        listener.close()


def test_a_token_that_cannot_go_into_a_header_is_refused_at_once() -> None:
    assert App("http://127.0.0.1:1", token="secret\n").token == "secret"
    for bad in ("sec\nret", "sec ret", "café"):
        with pytest.raises(ValueError, match="API token"):
            App("http://127.0.0.1:1", token=bad)


def test_an_idle_connection_is_seen_closed_at_any_descriptor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`select` refuses descriptors from 1024 up (ValueError); taking that for a closed
    connection made a new connection for every call in a process with many files open. Here
    `select` refuses every descriptor, as it would those."""
    import select

    def refuses(*args: object) -> object:
        raise ValueError("filedescriptor out of range in select()")

    monkeypatch.setattr(select, "select", refuses)
    a, b = socket.socketpair()
    try:
        assert not readable(a)
        b.close()
        assert readable(a)
    finally:
        a.close()
