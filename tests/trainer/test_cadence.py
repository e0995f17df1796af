"""The loop's cadences and its throughput clock (a fake clock: no timing assertions)."""

import pytest

from dlrm.common.cadence import Every
from dlrm.trainer.clock import RunTime, ThroughputWindow


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


def test_a_window_read_while_paused_holds_no_pause_time():
    clock = FakeClock()
    window = ThroughputWindow(clock)
    clock.now += 2.0
    with window.paused():  # a checkpoint reads the run's time while the clock is paused
        clock.now += 30.0
        assert window.seconds() == 2.0
    clock.now += 1.0
    assert window.seconds() == 3.0


def test_the_run_time_adds_up_every_invocation_to_the_checkpoint_each_continued_from():
    """Invocation 1 trains steps 1..6 and checkpoints at step 4; it stops at 6. Invocation 2 resumes
    at 4 and trains 5..10: the run's time is invocation 1's up to step 4 plus invocation 2's."""
    clock = FakeClock()
    first = ThroughputWindow(clock)
    run = RunTime(first, clock)
    run.open(0, first)
    for _ in range(4):
        clock.now += 1.0
        first.add(0.5)
    with first.paused():  # the save at step 4: the open window's steps count, the pause does not
        clock.now += 100.0
        at_4 = run.record(4)
    assert at_4 == {"train_seconds": 4.0, "wall_seconds": 104.0, "timed_steps": 4, "invocations": 1}
    clock.now += 2.0  # steps 5, 6: trained again by the next invocation, not counted twice

    second = ThroughputWindow(clock)
    again = RunTime(second, clock)
    again.carry(at_4, 4)
    again.open(4, second)
    for _ in range(6):
        clock.now += 0.5
        second.add(0.5)
    second.close()
    assert again.record(10) == {"train_seconds": 7.0, "wall_seconds": 107.0, "timed_steps": 10, "invocations": 2}


@pytest.mark.parametrize(
    "record",
    [None, {}, {"train_seconds": "1", "wall_seconds": 1, "timed_steps": 1, "invocations": 1},
     {"train_seconds": -1.0, "wall_seconds": 1, "timed_steps": 1, "invocations": 1},
     {"train_seconds": 1.0, "wall_seconds": 1, "timed_steps": 9, "invocations": 1},  # more steps than the checkpoint's
     {"train_seconds": float("nan"), "wall_seconds": 1, "timed_steps": 1, "invocations": True}],
)  # fmt: skip
def test_a_checkpoint_without_a_valid_time_record_leaves_its_steps_untimed(record):
    clock = FakeClock()
    window = ThroughputWindow(clock)
    run = RunTime(window, clock)
    run.carry(record, 4)
    run.open(4, window)
    clock.now += 3.0
    window.add(0.5)
    window.close()
    assert run.record(5) == {"train_seconds": 3.0, "wall_seconds": 3.0, "timed_steps": 1, "invocations": 2}
