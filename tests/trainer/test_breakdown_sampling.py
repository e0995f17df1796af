"""The step breakdown's cadence and its place off the throughput clock (dlrm.trainer.profiler)."""

from contextlib import contextmanager

import torch
from torch.profiler import profile, record_function

from dlrm.config import TrainerConfig
from dlrm.trainer.clock import ThroughputWindow
from dlrm.trainer.phases import STEP_RANGE
from dlrm.trainer.profiler import StepProfiler


def _profiler(group, every: int, log_every: int = 5, **keys) -> StepProfiler:
    cfg = TrainerConfig(breakdown_every=every, log_every_steps=log_every, **keys)
    return StepProfiler(cfg, torch.device("cpu"), group, 1, None)


def test_profiled_steps_are_every_nth_window_and_the_last(group):
    p = _profiler(group, every=3)
    steps = [s for s in range(1, 48) if p.profiles(s, s == 47)]
    assert steps == [15, 30, 45, 47]  # the last step of windows 3, 6, 9, and the run's last
    assert [s for s in range(1, 21) if _profiler(group, every=1).profiles(s, s == 20)] == [5, 10, 15, 20]
    assert not any(_profiler(group, every=1, breakdown=False).profiles(s, s == 20) for s in range(1, 21))
    traced = _profiler(group, every=1, profile=[5, 6])
    assert not traced.profiles(5, False) and traced.profiles(10, False)  # a traced step is not profiled too


def test_the_profiler_starts_stops_and_is_read_while_the_clock_is_paused(group):
    """The throughput window stops while the profiler starts, stops and its events are parsed; the
    profiled step itself stays on the clock."""
    p = _profiler(group, every=1, log_every=1)
    window: ThroughputWindow = ThroughputWindow()
    calls = []
    start, stop = profile.start, profile.stop

    def noting(real, what):
        def call(self):
            calls.append((what, window._paused))
            return real(self)

        return call

    @contextmanager
    def paused():
        with window.paused():
            yield

    x = torch.randn(64, 64, requires_grad=True)
    profile.start, profile.stop = noting(start, "start"), noting(stop, "stop")  # type: ignore[method-assign]
    try:
        with p.step(1, False, paused):
            calls.append(("step", window._paused))
            with record_function(STEP_RANGE):
                (x @ x).sum().backward()
    finally:
        profile.start, profile.stop = start, stop  # type: ignore[method-assign]
    assert calls == [("start", True), ("step", False), ("stop", True)]
    record = p.window_record(warm_up=False, last=False)
    assert record["profiled_steps"] == 1 and record["profile_overhead_s"] > 0
    assert sum(record["phase_s"].values()) > 0
    assert p.window_record(warm_up=False, last=False) == {}  # a window without a profiled step: nothing, no collective


def test_every_periodic_component_answers_due_step_last():
    """The loop asks each component the same question with the same signature: due(step, last)."""
    import inspect

    from dlrm.checkpoint.checkpointer import Checkpointer
    from dlrm.common.cadence import Every
    from dlrm.deltas.publish import Publisher
    from dlrm.distributed.local_sgd import LocalSGD
    from dlrm.trainer.evaluator import Evaluator
    from dlrm.trainer.reporter import Reporter

    for component in (Every, Reporter, Evaluator, Checkpointer, Publisher, LocalSGD):
        assert list(inspect.signature(component.due).parameters) == ["self", "step", "last"], component
