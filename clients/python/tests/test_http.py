"""The connection to the server (_http.py) against small socket servers: a kept-alive connection
the server closed while idle is made again, an answer that never comes ends in `Unreachable`
at the call's timeout, errors are read from the server's JSON (a 413 sent before the body was
read included), HTTPS is called the same way and trusts what httpx would, and a proxy in the
environment sends the calls through httpx."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from homing import App
from homing._errors import ApiError, Unreachable
from homing._http import Http, readable

from .listener import Listener
from .tls import Certs, make_certs


class Server(Listener):
    """Answers each request with `answer` and keeps the connection open; one idle for `linger`
    seconds it closes without saying so (as a server whose keep-alive ran out). `linger=None`
    never answers. With `tls`, over TLS."""

    def __init__(self, answer: bytes, linger: float | None,
                 tls: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> None:
        super().__init__(host)
        self.answer = answer
        self.linger = linger
        self.tls = tls
        self.requests: list[bytes] = []
        self.start()

    def handle(self, conn: socket.socket) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                return  # the client refused the certificate
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
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                 "all_proxy", "NO_PROXY", "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


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
    refusing(None)


def refusing(tls: ssl.SSLContext | None) -> None:
    """A server refuses a body over its limit from the declared length, and closes without
    reading it: the caller gets the 413, not "unreachable" (which a worker would retry for
    ever)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def refuse() -> None:
        conn, _ = listener.accept()
        if tls is not None:
            conn = tls.wrap_socket(conn, server_side=True)
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
    scheme = "https" if tls is not None else "http"
    http = Http(f"{scheme}://127.0.0.1:{listener.getsockname()[1]}", None)
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


def test_https_is_called_directly_on_a_kept_alive_connection(
    certs: Certs, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An HTTPS server (say a TLS terminator in front of `homing up`) is called through
    http.client as plain HTTP is, not through httpx (which asks for compressed answers): one
    connection for every call, made again after the server closed it while idle."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca))
    s = Server(reply("200 OK", b'{"ok": true}'), linger=0.3, tls=certs.server_context())
    http = Http(f"https://127.0.0.1:{s.port}/prefix", "secret")
    for _ in range(3):
        assert http.call("POST", "/v1/x", {"n": 1}) == {"ok": True}
    assert s.connections == 1
    assert s.requests[0].startswith(b"POST /prefix/v1/x HTTP/1.1\r\n")
    assert b"Authorization: Bearer secret\r\n" in s.requests[0]
    assert b"Accept-Encoding: identity\r\n" in s.requests[0]
    time.sleep(0.6)  # the server has closed the connection meanwhile, without a word
    assert http.call("GET", "/v1/y") == {"ok": True}
    assert s.connections == 2
    http.close()


def test_https_trusts_what_httpx_would(
    certs: Certs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """Without SSL_CERT_FILE the store is certifi's, which does not hold the tests' authority:
    the call fails as unreachable, naming the certificate, on both paths. SSL_CERT_DIR is read
    too, as httpx reads it."""
    s = Server(reply("200 OK", b"{}"), linger=5, tls=certs.server_context())
    with pytest.raises(Unreachable, match="CERTIFICATE_VERIFY_FAILED"):
        Http(f"https://127.0.0.1:{s.port}", None).call("GET", "/")
    # A name the certificate is not for: refused even with the authority trusted.
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca))
    other = Server(reply("200 OK", b"{}"), linger=5, tls=certs.server_context(),
                   host="127.0.0.2")
    with pytest.raises(Unreachable, match="CERTIFICATE_VERIFY_FAILED"):
        Http(f"https://127.0.0.2:{other.port}", None).call("GET", "/")
    monkeypatch.delenv("SSL_CERT_FILE")
    hashed = tmp_path / "certs"
    hashed.mkdir()
    shutil.copy(certs.ca, hashed / "ca.pem")
    subprocess.run(["openssl", "rehash", str(hashed)], check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_DIR", str(hashed))
    assert Http(f"https://127.0.0.1:{s.port}", None).call("GET", "/") == {}


def test_a_refusal_before_the_body_was_read_is_its_answer_over_https(
    certs: Certs, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca))
    refusing(certs.server_context())


def test_an_https_proxy_in_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTPS_PROXY sends HTTPS calls through httpx, which asks the proxy for a tunnel; it does
    not touch plain HTTP, and HTTP_PROXY does not touch HTTPS."""
    proxy = Server(reply("403 Forbidden", b'{"error": {"code": "no", "message": "no"}}'),
                   linger=5)
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
    with pytest.raises((ApiError, Unreachable)):
        Http("https://homing.invalid:8443", None).call("GET", "/v1/x")
    assert proxy.requests[0].startswith(b"CONNECT homing.invalid:8443 HTTP/1.1\r\n")
    direct = Server(reply("200 OK", b'{"via": "direct"}'), linger=5)
    assert Http(f"http://127.0.0.1:{direct.port}", None).call("GET", "/") == {"via": "direct"}
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    with pytest.raises(Unreachable):
        # Called directly: nothing listens there, and the proxy hears nothing of it.
        Http("https://127.0.0.1:1", None).call("GET", "/")
    assert len(proxy.requests) == 1


class Recording:
    """A socket that records what is written to it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.sock.sendall(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def test_a_request_with_a_small_body_is_one_write() -> None:
    """The head and a small body go in one write (http.client writes two, and the server
    wakes twice to read one request); a large body is written apart, and a body-less request
    is its head alone."""
    s = Server(reply("200 OK", b"{}"), linger=5)
    http = Http(f"http://127.0.0.1:{s.port}", None)
    assert http.call("GET", "/first") == {}
    conn = http._direct.conn if http._direct is not None else None
    assert conn is not None and conn.sock is not None
    rec = Recording(conn.sock)
    conn.sock = rec
    assert http.call("POST", "/small", {"n": 1}) == {}
    assert len(rec.writes) == 1 and rec.writes[0].endswith(b'\r\n\r\n{"n":1}'), rec.writes
    assert http.call("GET", "/none") == {}
    assert len(rec.writes) == 2 and rec.writes[1].endswith(b"\r\n\r\n")
    big = {"blob": "x" * (100 << 10)}
    assert http.call("POST", "/big", big) == {}
    assert len(rec.writes) == 4 and rec.writes[2].endswith(b"\r\n\r\n")
    assert s.requests[3].endswith(b'x"}') and len(s.requests) == 4
    http.close()


def test_odd_host_names_and_certificate_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """A host name that is not ASCII goes through httpx, which encodes it as IDNA 2008 does
    (the standard library would call `fass.de` for `faß.de`). A certificate file that cannot
    be loaded is named in the error."""
    assert Http("https://faß.invalid", None)._direct is None
    assert Http("http://faß.invalid", None)._direct is None
    assert Http("https://fass.invalid", None)._direct is not None
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(garbage))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))  # not read while SSL_CERT_FILE is set
    with pytest.raises(Unreachable, match=f"SSL_CERT_FILE={garbage}") as e:
        Http("https://127.0.0.1:1", None).call("GET", "/")
    assert "SSL_CERT_DIR" not in str(e.value)
