"""The training loop's profiling, a component with its own cadence.

With trainer.breakdown, the last step of every trainer.breakdown_every-th log window (and the run's
last step) runs under torch.profiler and its time is split into phases and collectives; starting,
stopping and reading the profiler happen off the throughput clock (the loop's `paused`). On CUDA the
profiled step's device time comes from CUDA events around it and, per phase, from the profiler's
device activity (`device_breakdown`). With trainer.profile=[first, last], those steps are traced
on rank 0 to <run dir>/profile (TensorBoard, Perfetto).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

from dlrm.common.cadence import Every
from dlrm.config import TrainerConfig
from dlrm.trainer.phases import (
    PHASES,
    Waits,
    collective_spans,
    device_breakdown,
    kineto_quiet,
    spans_of,
    split_waits,
    step_breakdown,
)

log = logging.getLogger(__name__)
COMM_KINDS = ("alltoall", "reduce_scatter", "allgather", "allreduce")


def end_gloo_ranges(pg) -> None:
    """Return once Gloo's threads have ended the profiler ranges of every collective `pg` has run.

    A Gloo barrier on `pg` (a no-op on other backends), so the profiler is never stopped while a Gloo
    thread still writes a range into it. A collective: every rank calls it.
    """
    if dist.get_backend(pg) == "gloo":
        dist.barrier(group=pg)


class StepProfiler:
    """Profiles and traces the steps that are due; sums the profiled steps' figures per log window.

    The sums are [count, wall s, profiling overhead s, s per phase..., s per collective kind..., s of
    waiting for peers per kind..., s behind another kind's collective per kind..., steps whose kind could
    not be matched across ranks per kind..., the collectives' own s per kind (all ranks in to all out)...,
    device s of the step (CUDA events; 0 on CPU), device s per phase..., s the others waited for each
    rank...], over this rank's profiled steps; `window_record` adds them
    over ranks at each log. The waiting is measured on the profiled steps only: their collectives' entry
    and exit times are gathered from every rank after the step (`phases.split_waits`).
    """

    def __init__(
        self,
        cfg: TrainerConfig,
        device: torch.device,
        pg,
        world_size: int,
        trace_dir: Path | None,
        sync: Callable[[], None] = lambda: None,
    ) -> None:
        self.cfg, self.device, self.pg, self.world_size = cfg, device, pg, world_size
        self.log_every = Every(cfg.log_every_steps)
        self.sync = sync  # waits for the device: a profiled step's time holds its device work
        self.activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.sampled = Every(cfg.log_every_steps * cfg.breakdown_every)  # with the run's last step: the profiled steps
        width = 4 + 2 * len(PHASES) + 5 * len(COMM_KINDS) + world_size
        self.window = torch.zeros(width, dtype=torch.float64)  # this log window's profiled steps
        self.run = torch.zeros(width, dtype=torch.float64)  # the windows after the first (warm-up)
        self.trace = None
        if cfg.profile is not None and trace_dir is not None:  # rank 0 only: trace_dir is its run dir's
            handler = tensorboard_trace_handler(str(trace_dir), worker_name="rank0")
            self.trace = profile(activities=self.activities, record_shapes=True, on_trace_ready=handler)
        self.trace_dir, self.tracing = trace_dir, False

    def _traced(self, step: int) -> bool:
        return self.cfg.profile is not None and self.cfg.profile[0] <= step <= self.cfg.profile[1]

    def profiles(self, step: int, last: bool) -> bool:
        """Whether step `step` is profiled for the breakdown: the last of every breakdown_every-th log
        window, and the run's last (so every run has one), unless traced."""
        if not self.cfg.breakdown or self._traced(step):
            return False
        return last or (self.log_every.due(step, last) and self.sampled.due(step, False))

    @contextmanager
    def step(self, step: int, last: bool, paused: Callable[[], AbstractContextManager] = nullcontext) -> Iterator[None]:
        """Around training step `step` (1-based; `last`: the run's last): traced, profiled or plain, as due.
        `paused()`: stops the throughput clock while the profiler starts, stops and is read."""
        if self.trace is not None and not self.tracing and self._traced(step):
            with kineto_quiet():
                self.trace.start()
            self.tracing = True
        if self.profiles(step, last):
            with self._profiled(paused):
                yield
        else:
            yield
        if self._traced(step) and (last or not self._traced(step + 1)):  # the traced steps end here
            end_gloo_ranges(self.pg)  # on every rank; the trace is rank 0's
            if self.tracing and self.trace is not None:
                with kineto_quiet():
                    self.trace.stop()
                self.trace, self.tracing = None, False
                log.info(f"profiler trace of steps {self.cfg.profile}: {self.trace_dir}")

    def stop_trace(self) -> None:
        """End a trace still open (a run stopped early, at trainer.target_auc), writing what it holds.
        Every rank calls it at the same step."""
        if self.cfg.profile is not None:
            end_gloo_ranges(self.pg)
        if self.tracing and self.trace is not None:
            with kineto_quiet():
                self.trace.stop()
            self.trace, self.tracing = None, False
            log.info(f"profiler trace of steps {self.cfg.profile}, stopped with the run: {self.trace_dir}")

    @contextmanager
    def _profiled(self, paused: Callable[[], AbstractContextManager] = nullcontext) -> Iterator[None]:
        """Around one step: under torch.profiler, its figures added to the window's (on success). The
        profiler's start, its stop and the reading of its events run inside `paused()`."""
        cuda = self.device.type == "cuda"
        with paused():
            begin = time.perf_counter()
            prof = profile(activities=self.activities)
            with kineto_quiet():
                prof.start()
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
            setup = time.perf_counter() - begin
        done = False
        try:
            start = time.perf_counter()
            if events is not None:
                events[0].record()
            yield
            if events is not None:
                events[1].record()
            self.sync()
            wall = time.perf_counter() - start
            done = True
        finally:
            with paused():
                finish = time.perf_counter()
                if done:
                    end_gloo_ranges(self.pg)
                with kineto_quiet():
                    prof.stop()
                if done:
                    self._add(spans_of(prof), wall, events)
                    self.window[2] += setup + time.perf_counter() - finish

    def _add(self, spans: list, wall: float, events) -> None:
        """Add one profiled step's figures to the window's sums (the overhead, self.window[2], apart)."""
        ((phases, comm),) = step_breakdown(spans)
        waits = self._waits(collective_spans(spans))
        device_s, device_phases = 0.0, dict.fromkeys(PHASES, 0.0)
        if events is not None:  # CUDA: the step's device time, and the kernels' time per launching phase
            device_s = events[0].elapsed_time(events[1]) / 1e3
            device_phases = device_breakdown(spans)[0]
        figures = (
            [1.0, wall, 0.0]
            + [phases[k] for k in PHASES]
            + [comm.get(k, 0.0) for k in COMM_KINDS]
            + [waits.wait_s.get(k, 0.0) for k in COMM_KINDS]
            + [waits.behind_s.get(k, 0.0) for k in COMM_KINDS]
            + [float(k in waits.unmatched) for k in COMM_KINDS]
            + [waits.critical_s.get(k, 0.0) for k in COMM_KINDS]
            + [device_s]
            + [device_phases[k] for k in PHASES]
            + waits.late_s
        )
        self.window += torch.tensor(figures, dtype=self.window.dtype)

    def _waits(self, own: dict[str, list[tuple[float, float]]]) -> Waits:
        """Every rank's collective entry and exit times, gathered (two collectives of the training group,
        on the profiled step only), and this rank's waiting for peers (`phases.split_waits`)."""
        k = len(COMM_KINDS)
        counts = torch.tensor([len(own.get(kind, [])) for kind in COMM_KINDS], dtype=torch.float64)
        gathered = [torch.zeros(k, dtype=torch.float64, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(gathered, counts.to(self.device), group=self.pg)
        all_counts = [[int(x) for x in c.tolist()] for c in gathered]
        width = max(1, max(max(c) for c in all_counts))
        times = torch.zeros((2, k, width), dtype=torch.float64)  # entry and exit times
        for i, kind in enumerate(COMM_KINDS):
            for j, (start, end) in enumerate(own.get(kind, [])):
                times[0, i, j], times[1, i, j] = start, end
        gathered = [torch.zeros((2, k, width), dtype=torch.float64, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(gathered, times.to(self.device), group=self.pg)
        gathered = [g.cpu() for g in gathered]
        entries, exits = (
            [
                {kind: g[x, i, : c[i]].tolist() for i, kind in enumerate(COMM_KINDS) if c[i]}
                for g, c in zip(gathered, all_counts, strict=True)
            ]
            for x in (0, 1)
        )
        return split_waits(own, entries, dist.get_rank(self.pg), exits)

    def window_record(self, warm_up: bool, last: bool) -> dict:
        """The breakdown of this log window, summed over ranks (a collective: every rank calls it at
        each log); {} without profiled steps. The first window (warm_up) counts for the run's
        breakdown only when it is the run's only one."""
        if not self.cfg.breakdown or not self.window[0]:  # the same on every rank: no collective then
            return {}
        summed = self.window.to(self.device)  # a collective of the training group: on its device (NCCL)
        dist.all_reduce(summed, group=self.pg)
        self.window.copy_(summed)
        record = {}
        if self.window[0] > 0:
            record = self.record(self.window)
            if not warm_up or (last and not self.run[0]):
                self.run += self.window
        self.window.zero_()
        return record

    def run_record(self) -> dict | None:
        """The run's breakdown (mean per profiled step), or None."""
        return self.record(self.run) if self.run[0] > 0 else None

    def record(self, summed: torch.Tensor) -> dict:
        """Mean seconds per profiled step: its wall time (the loop's clock), per phase (the profiler's
        events; they add up to the profiler's step time) and per collective kind (comm_s: all of it;
        comm_wait_s: waiting for the last rank to enter; comm_behind_s: running behind a collective of
        another kind entered earlier (`phases.Waits`); comm_transfer_s: the rest; comm_critical_s: the
        collectives' own time, from the last rank's entry to the last exit), from the sums over
        ranks and steps (the class docstring). waited_for_rank_s: per rank, how long the others waited
        for it per step; slowest_rank: the rank they waited for most (None: nobody waited).
        comm_wait_unmatched: kinds whose collectives differed in count across ranks in some profiled
        step, so waiting could not be told from transfer (left out of comm_wait_s, comm_behind_s and
        comm_transfer_s).
        profile_overhead_s: what profiling added to the step (start, stop, reading the events), off the
        throughput clock. On CUDA, device_step_s: the step's device time (CUDA events around it), and
        device_phase_s: kernel seconds per phase (`phases.device_breakdown`; streams may overlap)."""
        mean = (summed[1:] / summed[0]).tolist()
        at = 2 + len(PHASES)
        k = len(COMM_KINDS)
        comm: dict[str, float] = dict(zip(COMM_KINDS, mean[at : at + k], strict=True))
        wait: dict[str, float] = dict(zip(COMM_KINDS, mean[at + k : at + 2 * k], strict=True))
        behind: dict[str, float] = dict(zip(COMM_KINDS, mean[at + 2 * k : at + 3 * k], strict=True))
        flags = summed[1 + at + 3 * k : 1 + at + 4 * k].tolist()
        critical: dict[str, float] = dict(zip(COMM_KINDS, mean[at + 4 * k : at + 5 * k], strict=True))
        unmatched = [kind for kind, x in zip(COMM_KINDS, flags, strict=True) if x > 0]
        kept = [kind for kind in COMM_KINDS if kind not in unmatched]
        device_at = at + 5 * k
        late = mean[device_at + 1 + len(PHASES) :]
        record = {
            "phase_s": dict(zip(PHASES, mean[2:at], strict=True)),
            "profiled_step_s": mean[0],
            "profile_overhead_s": mean[1],
            "comm_s": comm,
            "comm_wait_s": {kind: wait[kind] for kind in kept},
            "comm_behind_s": {kind: behind[kind] for kind in kept},
            "comm_transfer_s": {kind: max(0.0, comm[kind] - wait[kind] - behind[kind]) for kind in kept},
            "comm_critical_s": {kind: critical[kind] for kind in kept},
            "waited_for_rank_s": late,
            "slowest_rank": max(range(len(late)), key=lambda r: late[r]) if late and max(late) > 0 else None,
            "profiled_steps": int(summed[0].item()) // self.world_size,
        }
        if self.device.type == "cuda":
            record["device_step_s"] = mean[device_at]
            record["device_phase_s"] = dict(zip(PHASES, mean[device_at + 1 : device_at + 1 + len(PHASES)], strict=True))
        if unmatched:
            record["comm_wait_unmatched"] = unmatched
        return record
