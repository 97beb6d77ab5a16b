"""One place that turns HTTP calls to the homing server into JSON values or `HomingError`s, so
the client and the worker read errors the same way and never print the API token."""

from __future__ import annotations

from typing import Any, Optional

import httpx

from ._errors import ApiError, Unreachable


class Http:
    """A thread-confined connection pool to one homing server (httpx clients are not shared
    between the worker's threads: each thread that talks to the server gets its own `Http`)."""

    def __init__(self, url: str, token: Optional[str], timeout: float = 30.0) -> None:
        headers = {"User-Agent": "homing-python/0.1.0"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.url = url.rstrip("/")
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        # Each path's whole URL, parsed once: a worker calls the same few paths (its session's
        # complete, reserve and heartbeat) for every job, and parsing and joining a URL was a
        # tenth of the Python time of a call.
        self._urls: dict[str, httpx.URL] = {}

    def close(self) -> None:
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
        url = self._urls.get(path)
        if url is None:
            if len(self._urls) >= 64:
                self._urls.clear()
            url = self._urls[path] = httpx.URL(self.url + path)
        try:
            resp = self._client.request(
                method,
                url,
                json=body,
                params=params,
                headers=headers,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as e:
            raise Unreachable(f"homing server at {self.url} unreachable: {describe(e)}") from e
        if resp.status_code >= 400:
            raise api_error(resp)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError as e:
            raise ApiError(resp.status_code, "bad_response", f"the server's answer to {method} "
                           f"{path} is not JSON") from e


def describe(e: Exception) -> str:
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}" if text != type(e).__name__ else text


def api_error(resp: httpx.Response) -> ApiError:
    code, message = "http_error", resp.text[:500] or resp.reason_phrase
    try:
        err = resp.json().get("error", {})
        code = str(err.get("code", code))
        message = str(err.get("message", message))
    except (ValueError, AttributeError):
        pass
    return ApiError(resp.status_code, code, message)
