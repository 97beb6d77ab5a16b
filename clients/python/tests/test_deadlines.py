"""The worker's time-limit keeper: one thread for every running task's deadline."""

from __future__ import annotations

import threading
import time

from homing._deadlines import Deadlines


def recorder() -> tuple[list[str], threading.Event, Deadlines[str]]:
    """A keeper that records what expired and sets the event at each."""
    fired: list[str] = []
    got = threading.Event()

    def expired(item: str) -> None:
        fired.append(item)
        got.set()

    return fired, got, Deadlines(expired)


def test_an_armed_deadline_expires_once_and_a_disarmed_one_never() -> None:
    fired, got, d = recorder()
    late = d.arm("late", 60)
    d.disarm(d.arm("gone", 0.05))
    d.arm("soon", 0.1)
    assert got.wait(10), "the deadline did not expire"
    time.sleep(0.2)
    assert fired == ["soon"]
    d.disarm(late)


def test_an_earlier_deadline_armed_later_wakes_the_keeper() -> None:
    fired, got, d = recorder()
    d.arm("an hour", 3600)
    time.sleep(0.05)  # the keeper now sleeps until the hour is up
    d.arm("now", 0.01)
    assert got.wait(10), "the earlier deadline did not wake the keeper"
    assert fired == ["now"]


def test_disarmed_deadlines_do_not_pile_up() -> None:
    # The server's default limit is long: each job's entry is disarmed long before it is due.
    d: Deadlines[int] = Deadlines(lambda _: None)
    for i in range(10_000):
        d.disarm(d.arm(i, 1800))
    assert d.pending() <= 64 + 2


def test_a_failing_callback_does_not_stop_the_keeper() -> None:
    fired: list[int] = []
    got = threading.Event()

    def expired(item: int) -> None:
        if item == 1:
            raise RuntimeError("boom")
        fired.append(item)
        got.set()

    d: Deadlines[int] = Deadlines(expired)
    d.arm(1, 0.01)
    d.arm(2, 0.05)
    assert got.wait(10), "the keeper died with the first callback"
    assert fired == [2]


def test_disarming_lets_go_of_the_item() -> None:
    import gc
    import weakref

    class Item:
        pass

    d: Deadlines[Item] = Deadlines(lambda _: None)
    item = Item()
    ref = weakref.ref(item)
    d.disarm(d.arm(item, 3600))
    del item
    gc.collect()
    assert ref() is None
