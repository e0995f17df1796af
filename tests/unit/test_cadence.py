"""The loop's cadences and its throughput clock (a fake clock: no timing assertions)."""

import pytest

from dlrm.cadence import Every
from dlrm.trainer.clock import ThroughputWindow


def test_every_n_steps_and_at_the_end():
    log = Every(10)
    assert [s for s in range(1, 26) if log.due(s, last=s == 25)] == [10, 20, 25]
    assert [s for s in range(1, 26) if Every(0).due(s, last=s == 25)] == [25]  # 0: only at the end
    assert not any(Every(0, at_end=False).due(s, last=s == 25) for s in range(1, 26))
    assert [s for s in range(1, 21) if Every(10, at_end=False).due(s, last=s == 20)] == [10, 20]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_window_counts_training_time_only():
    clock = FakeClock()
    window = ThroughputWindow(clock)
    clock.now += 2.0
    window.add(0.5)
    window.add(None)  # a skipped step: counted, no loss
    with window.paused():  # evaluation: not training time
        clock.now += 30.0
    clock.now += 1.0
    assert window.close() == ([0.5], 2, 3.0)
    clock.now += 5.0  # the next window starts at the close
    with window.paused():
        clock.now += 7.0
    window.add(0.25)
    assert window.close() == ([0.25], 1, 5.0)
    assert window.train_seconds == 8.0


def test_the_clock_waits_for_the_device_only_when_it_stops():
    """The device is waited for (sync) before a pause and a close, so a window's time holds its steps'
    device work; never at a step, so the host runs ahead of the GPU between logs. The fake device's
    queued work lands on the clock when it is waited for."""
    clock, queued, calls = FakeClock(), [0.0], []

    def sync():
        calls.append(clock.now)
        clock.now += queued[0]  # the host waits for what the device still has to do
        queued[0] = 0.0

    window = ThroughputWindow(clock, sync)
    for _ in range(10):
        clock.now += 0.1  # the host's launch work
        queued[0] += 1.0  # the device's work for the step
        window.add(0.5)
    assert calls == []  # no wait at any step
    with window.paused():
        clock.now += 30.0
    losses, steps, seconds = window.close()
    assert (losses, steps) == ([0.5] * 10, 10)
    assert seconds == pytest.approx(11.0)  # 1 s of host, 10 s of device: all of it counted
    assert len(calls) == 2
