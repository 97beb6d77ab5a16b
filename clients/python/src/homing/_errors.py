"""The exceptions a task raises to steer what happens to its job, and the client's errors.

A task ends in one of four ways besides returning: `Retry` (try again, optionally after a given
delay; counted against the job's retries), `Fatal` (fail now, no retry), `Snooze` (run again
after a delay without counting an attempt), or any other exception (retryable, with its
traceback stored as the job's error).
"""

from __future__ import annotations

from typing import Optional


class Retry(Exception):
    """Fail this attempt; homing retries the job (after `delay` seconds if given) while the job
    has retries left, and fails it otherwise."""

    def __init__(self, message: str = "retry requested", delay: Optional[float] = None) -> None:
        super().__init__(message)
        if delay is not None and delay < 0:
            raise ValueError("Retry delay must be >= 0 seconds")
        self.message = message
        self.delay = delay


class Fatal(Exception):
    """Fail the job now, whatever retries are left: retrying cannot help."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Snooze(Exception):
    """Put the job back to run again in `delay` seconds; no attempt is counted."""

    def __init__(self, delay: float) -> None:
        if delay < 0:
            raise ValueError("Snooze delay must be >= 0 seconds")
        super().__init__(f"snoozed for {delay}s")
        self.delay = delay


class HomingError(Exception):
    """An error talking to the homing server."""


class ApiError(HomingError):
    """The server answered with an error (`{"error": {"code", "message"}}`)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{message} (HTTP {status}, {code})")
        self.status = status
        self.code = code
        self.message = message


class Unreachable(HomingError):
    """The server could not be reached (connection refused, timeout, DNS)."""
