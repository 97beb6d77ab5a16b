"""What a running task sees of its job: who it is (id, epoch, attempt), a way to report
progress, and whether it has been asked to stop."""

from __future__ import annotations

from typing import Any, Callable, Optional


class Context:
    """Passed as the first argument of every task."""

    def __init__(
        self,
        job: dict[str, Any],
        report_progress: Callable[[Any], None],
        is_cancelled: Callable[[], bool],
    ) -> None:
        self.job_id: str = str(job["job_id"])
        self.task: str = str(job["task"])
        self.queue: str = str(job.get("queue") or "")
        self.epoch: int = int(job["epoch"])
        self.attempt: int = int(job.get("attempt") or 0)
        self.max_retries: Optional[int] = job.get("max_retries")
        # The key to hand to external systems (an Idempotency-Key header): the same on every
        # run and retry of the job (the server sends the job id, as Rust handlers get).
        self.idempotency_key: str = str(job.get("idempotency_key") or job["job_id"])
        # A workflow step's parents by step name ({"id", "task", "state", "result", "error"}),
        # as committed when the step became runnable; empty for a job that is not a step.
        self.parents: dict[str, dict[str, Any]] = dict(job.get("parents") or {})
        # The workflow this job is a step of ({"id", "step", "after", "run_on"}), or None.
        self.workflow: Optional[dict[str, Any]] = job.get("workflow")
        # The W3C trace context stored with the job (docs/traces.md), to send as the
        # `traceparent` header of the task's own calls so they join the job's trace; or None.
        self.traceparent: Optional[str] = job.get("traceparent")
        self._report_progress = report_progress
        self._is_cancelled = is_cancelled

    def __repr__(self) -> str:
        return f"Context(job_id={self.job_id!r}, task={self.task!r}, epoch={self.epoch})"

    def progress(self, value: Any) -> None:
        """Records the job's progress (any JSON value, e.g. `{"page": 1, "pages": 3}`). It is
        sent in the background: the call does not wait for the server."""
        self._report_progress(value)

    def cancelled(self) -> bool:
        """True once the job should stop: cancelled by a user, past its time limit, or no
        longer this worker's (presumed dead, or shutting down past its grace period). A task
        that returns a result anyway has it recorded, unless it passed its time limit or the
        job is no longer this worker's."""
        return self._is_cancelled()
