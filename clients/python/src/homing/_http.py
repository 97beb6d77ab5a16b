"""One place that turns HTTP calls to the homing server into JSON values or `HomingError`s, so
the client and the worker read errors the same way and never print the API token.

A server reached without a proxy, over HTTP (the usual worker beside its server) or HTTPS (one
behind a TLS terminator), is called through the standard library's `http.client` on one
kept-alive connection: httpx spent 0.7-1.1 ms of CPU per call on this path against about
0.2 ms, and a single-slot worker makes one call per job. HTTPS trusts what httpx would trust
(its `create_ssl_context`: SSL_CERT_FILE or SSL_CERT_DIR when set, else certifi's store), so the
path taken never changes which servers are accepted. Proxied servers, URLs with credentials and
host names that are not ASCII go through httpx, which brings its proxy handling, authentication
and IDNA 2008."""

from __future__ import annotations

import errno
import http.client
import json
import os
import select
import socket
import ssl
import urllib.parse
import urllib.request
from typing import Any, Optional

import httpx

from ._errors import ApiError, Unreachable

USER_AGENT = "homing-python/0.1.0"


class Http:
    """A thread-confined connection to one homing server (not shared between the worker's
    threads: each thread that talks to the server gets its own `Http`)."""

    def __init__(self, url: str, token: Optional[str], timeout: float = 30.0) -> None:
        headers = {"User-Agent": USER_AGENT}
        if token:
            headers["Authorization"] = f"Bearer {check_token(token)}"
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._headers = headers
        parts = urllib.parse.urlsplit(self.url)
        self._direct: Optional[Direct] = None
        self._client: Optional[httpx.Client] = None
        # On the httpx path, each path's whole URL parsed once: a worker calls the same few
        # paths (its session's complete, reserve and heartbeat) for every job, and parsing and
        # joining a URL was a tenth of the Python time of a call through httpx.
        self._urls: dict[str, httpx.URL] = {}
        # A host name that is not ASCII is left to httpx: the standard library encodes it by
        # IDNA 2003 (`faß.de` becomes `fass.de`, another host), httpx by IDNA 2008.
        if (parts.scheme in ("http", "https") and parts.hostname and parts.hostname.isascii()
                and parts.username is None and not proxied(parts.scheme, parts.hostname)):
            self._direct = Direct(parts.scheme == "https", parts.hostname, parts.port,
                                  parts.path)
        else:
            self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        if self._client is not None:
            self._client.close()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Optional[dict[str, str]] = None,
        timeout: Optional[float] = None,
        headers: Optional[dict[str, str]] = None,
    ) -> Any:
        """Sends one request; returns the decoded JSON body (None for an empty one). Raises
        `Unreachable` when no answer came and `ApiError` for a non-2xx answer."""
        try:
            if self._direct is not None:
                status, content, reason = self._direct.request(
                    method, target(path, params), *encoded(body, self._headers, headers),
                    self.timeout if timeout is None else timeout)
            else:
                resp = self._httpx().request(
                    method,
                    self._url(path),
                    json=body,
                    params=params,
                    headers=headers,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
                status, content, reason = resp.status_code, resp.content, resp.reason_phrase
        except (OSError, http.client.HTTPException, httpx.TransportError) as e:
            raise Unreachable(f"homing server at {self.url} unreachable: {describe(e)}") from e
        if status >= 400:
            raise api_error(status, content, reason)
        if not content:
            return None
        try:
            return json.loads(content)
        except ValueError as e:
            raise ApiError(status, "bad_response", f"the server's answer to {method} "
                           f"{path} is not JSON") from e

    def _httpx(self) -> httpx.Client:
        assert self._client is not None
        return self._client

    def _url(self, path: str) -> httpx.URL:
        url = self._urls.get(path)
        if url is None:
            if len(self._urls) >= 64:
                self._urls.clear()
            url = self._urls[path] = httpx.URL(self.url + path)
        return url


def target(path: str, params: Optional[dict[str, str]]) -> str:
    return path + "?" + urllib.parse.urlencode(params) if params else path


def encoded(
    body: Any, common: dict[str, str], extra: Optional[dict[str, str]],
) -> tuple[Optional[bytes], dict[str, str]]:
    """The request's body and headers on the http.client path."""
    headers = dict(common)
    content = None
    if body is not None:
        # As httpx 0.28 encodes `json=`: compact, UTF-8, and no NaN (not JSON).
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":"),
                             allow_nan=False).encode()
        headers["Content-Type"] = "application/json"
    if extra:
        headers.update(extra)
    return content, headers


class Joined(http.client.HTTPConnection):
    """Writes a request's head and its body in one write when asked to (`join`). http.client
    writes them in two, and with the TCP_NODELAY it sets that is two segments: the server wakes
    twice to read one request. Joined, a one-slot worker's round took about 5 % less CPU in the
    worker and in the server (BENCHMARKS.md). Only the public `send` is overridden: a head
    held for a body that does not follow is written by `flush`."""

    join = False
    head: Optional[bytes] = None

    def send(self, data: Any) -> None:
        if self.head is not None:
            head, self.head = self.head, None
            if isinstance(data, bytes):
                data = head + data
            else:
                super().send(head)
        elif self.join and isinstance(data, bytes) and data.endswith(b"\r\n\r\n"):
            self.join = False
            self.head = data
            return
        super().send(data)

    def flush(self) -> None:
        self.join = False
        if self.head is not None:
            head, self.head = self.head, None
            super().send(head)


class JoinedTls(Joined, http.client.HTTPSConnection):
    pass


class Direct:
    """One kept-alive HTTP/1.1 connection (over TLS for HTTPS), made again when the server has
    closed it."""

    def __init__(self, tls: bool, host: str, port: Optional[int], prefix: str) -> None:
        self.tls = tls
        self.host = host
        self.port = port or (443 if tls else 80)
        self.prefix = prefix.rstrip("/")
        self.conn: Optional[Joined] = None
        # Made at the first connection, then kept: loading the certificate store takes
        # milliseconds.
        self.context: Optional[ssl.SSLContext] = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def request(
        self, method: str, target: str, content: Optional[bytes], headers: dict[str, str],
        timeout: float,
    ) -> tuple[int, bytes, str]:
        conn = self.conn
        # A connection the server closed while it was idle (its keep-alive ended, or it
        # restarted) reads as ready: sending on it would fail with the request perhaps unsent.
        if conn is not None and (conn.sock is None or readable(conn.sock)):
            self.close()
            conn = None
        if conn is None:
            conn = self.conn = self.connection(timeout)
        elif conn.sock is not None:
            conn.sock.settimeout(timeout)
        conn.timeout = timeout
        try:
            try:
                # A large body is written apart rather than copied behind its head.
                conn.join = content is not None and len(content) <= 1 << 16
                conn.request(method, self.prefix + target, body=content, headers=headers)
                conn.flush()
            except OSError as e:
                early = answer_already_sent(conn) if closed_by_server(e) else None
                if early is None:
                    raise
                self.close()
                return early
            resp = conn.getresponse()
            data = resp.read()
        except BaseException:
            self.close()
            raise
        if resp.will_close:
            self.close()
        return resp.status, data, resp.reason

    def connection(self, timeout: float) -> Joined:
        if not self.tls:
            return Joined(self.host, self.port, timeout=timeout)
        if self.context is None:
            self.context = trusted()
        return JoinedTls(self.host, self.port, timeout=timeout, context=self.context)


def trusted() -> ssl.SSLContext:
    """The TLS context httpx would use (the same certificates trusted), speaking HTTP/1.1."""
    try:
        ctx = httpx.create_ssl_context()
    except (OSError, ValueError) as e:
        # Loading a file that is not there says only "No such file or directory". httpx 0.28
        # reads SSL_CERT_FILE when set, else SSL_CERT_DIR, else certifi's store (before 0.28
        # it skipped a file that was not there, so this is only reached for a broken one).
        named = next((f"{k}={os.environ[k]}" for k in ("SSL_CERT_FILE", "SSL_CERT_DIR")
                      if os.environ.get(k)), "certifi's store")
        raise OSError(f"cannot load the trusted certificates ({named}): {describe(e)}") from e
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def closed_by_server(e: OSError) -> bool:
    """Whether a failed send means the server closed the connection (and may have answered
    first). Not a timeout: reading an answer then would wait as long again."""
    return (isinstance(e, (ConnectionError, ssl.SSLEOFError))
            or e.errno == getattr(errno, "EPROTOTYPE", -1))  # macOS, a send racing a close


def answer_already_sent(
    conn: http.client.HTTPConnection,
) -> Optional[tuple[int, bytes, str]]:
    """After a send failed because the server closed: the answer it sent before, if any. A
    server may answer before reading the whole body (a 413 refusing a body over its limit is
    answered from the declared length), and that answer is what the caller needs, not
    "unreachable"."""
    if conn.sock is None:
        return None
    try:
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.reason
    except (OSError, http.client.HTTPException):
        return None


def check_token(token: str) -> str:
    """The token, or ValueError when it cannot go into a header."""
    # The server reads the header as visible ASCII; anything else could never match.
    if not all("!" <= c <= "~" for c in token):
        raise ValueError("the API token must be visible ASCII characters (no spaces, no "
                         "control or non-ASCII characters)")
    return token


def readable(sock: socket.socket) -> bool:
    """Whether an idle connection has something to read, which can only be its end (or bytes
    the server should not have sent): either way it is not to be used again. `poll` where
    there is one: `select` refuses descriptors from 1024 up, which would mean a new connection
    for every call in a process with many files open."""
    try:
        if hasattr(select, "poll"):
            p = select.poll()
            p.register(sock, select.POLLIN)
            return bool(p.poll(0))
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def proxied(scheme: str, host: str) -> bool:
    """Whether a call to `host` over `scheme` may go through a proxy: one in the environment
    (HTTP_PROXY or HTTPS_PROXY by scheme, ALL_PROXY, less NO_PROXY) or, on macOS and Windows, in
    the system's settings, as the standard library reads them. Such calls are left to httpx."""
    proxies = urllib.request.getproxies()
    if not (proxies.get(scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(host)


def describe(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}" if text != type(e).__name__ else text


def api_error(status: int, content: bytes, reason: str) -> ApiError:
    text = content.decode("utf-8", "replace")
    code, message = "http_error", text[:500] or reason
    try:
        err = json.loads(content).get("error", {})
        code = str(err.get("code", code))
        message = str(err.get("message", message))
    except (ValueError, AttributeError):
        pass
    return ApiError(status, code, message)
