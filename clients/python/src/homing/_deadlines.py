"""Time limits of running tasks, kept by one thread. A `threading.Timer` per job started a
thread per job: with the server's default limit every job has one, and on a single-slot worker
draining short jobs the thread's start was about a tenth of the worker's CPU per job."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable, Generic, Optional, TypeVar

T = TypeVar("T")

log = logging.getLogger("homing.worker")

# The keeper wakes at least this often (seconds): a wait must stay below the platform's limit
# for a timeout, and a limit of days needs no finer wake-up.
MAX_SLEEP = 3600.0


class Deadlines(Generic[T]):
    """Calls `expired(item)` once an armed item's time is up, unless it was disarmed first.
    The thread starts with the first deadline and lives as long as the process. Disarming
    lets go of the item at once: the heap holds only times and handles."""

    def __init__(self, expired: Callable[[T], None], name: str = "homing-deadlines") -> None:
        self._expired = expired
        self._name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, T] = {}
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def arm(self, item: T, seconds: float) -> int:
        """Arms a deadline `seconds` from now; returns the handle `disarm` takes."""
        with self._cond:
            seq = next(self._seq)
            heapq.heappush(self._heap, (time.monotonic() + seconds, seq))
            self._armed[seq] = item
            # Disarmed entries stay in the heap until they reach its top; with long limits
            # (the server's default is minutes) they would pile up, so the heap is rebuilt
            # from the armed ones once most of it is dead.
            if len(self._heap) > 64 and len(self._heap) > 2 * len(self._armed):
                self._heap = [e for e in self._heap if e[1] in self._armed]
                heapq.heapify(self._heap)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            if self._heap[0][1] == seq:
                self._cond.notify()
        return seq

    def disarm(self, handle: int) -> None:
        with self._cond:
            self._armed.pop(handle, None)

    def pending(self) -> int:
        """How many entries the heap holds, armed or not (for tests)."""
        with self._cond:
            return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                when, seq = self._heap[0]
                left = when - time.monotonic()
                if left > 0:
                    self._cond.wait(min(left, MAX_SLEEP))
                    continue
                heapq.heappop(self._heap)
                item = self._armed.pop(seq)
            try:
                self._expired(item)
            except Exception:  # the keeper must outlive any one callback
                log.exception("a time limit's callback failed")
            del item
