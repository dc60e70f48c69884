"""``ordered_map``: calls on a bounded pool of threads, results in input order, stopped by a failure or a cancel."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tasks.streams.fanout import Cancelled, cancel_scope, ordered_map, pause
from tests.conftest import wait_until

WAIT = 10.0


def test_results_come_in_input_order_with_workers_in_flight_and_at_most_window_pending():
    all_in_flight = threading.Barrier(3, timeout=WAIT)
    finished: list[int] = []
    pulled = 0

    def items() -> Iterator[int]:
        nonlocal pulled
        for item in range(9):
            pulled += 1
            yield item

    def call(item: int) -> int:
        if item < 3:
            all_in_flight.wait()  # three at once, or the barrier breaks
            if item < 2:  # item 0 ends last: its answer holds back the others'
                wait_until(lambda: item + 1 in finished, f"item {item + 1} finished", WAIT)
        finished.append(item)
        return item * 10

    results = []
    for item, result in ordered_map(items(), call, workers=3, window=5):
        assert pulled - len(results) <= 5
        results.append((item, result))

    assert results == [(item, item * 10) for item in range(9)]
    assert finished.index(2) < finished.index(1) < finished.index(0)  # answered out of order


def test_the_oldest_failure_propagates_and_a_running_call_stops_at_its_pause():
    paused, stopped = threading.Event(), threading.Event()
    started: list[int] = []

    def call(item: int) -> int:
        started.append(item)
        if item == 1:
            paused.set()
            try:
                pause(3600)
            except Cancelled:
                stopped.set()
                raise
        if item == 0:
            assert paused.wait(WAIT)
            raise ValueError("the service refused item 0")
        return item

    with pytest.raises(ValueError, match="refused item 0"):
        list(ordered_map(range(100), call, workers=2, window=2))

    assert stopped.wait(WAIT), "the paused call went on"
    assert sorted(started) == [0, 1]


def test_a_cancel_from_another_thread_stops_the_calls_of_a_running_map():
    paused = threading.Event()

    def call(item: int) -> int:
        paused.set()
        pause(3600)
        return item

    with cancel_scope() as cancel:
        threading.Thread(target=lambda: paused.wait(WAIT) and cancel(), daemon=True).start()
        with pytest.raises(Cancelled):
            list(ordered_map(range(10), call, workers=2, window=4))
