"""Where a training step's time goes, measured with torch.profiler on sampled steps.

TorchRec and torch label the work of a step with `record_function` ranges (`## forward ##`,
`[lookup]_...`, `All2All_Pooled_ReqBackward`, `Optimizer.step#...`); the trainer labels the step
itself (`STEP_RANGE`) and, without the pipeline, its own parts with the same names TorchRec uses.
`step_breakdown` turns the profiler's events of one step into seconds per phase:

    data             next batch, copy to device, waiting for it
    input_dist       id (KeyedJaggedTensor) alltoall: splits, lengths, values, and waiting for them
    emb_lookup       embedding lookup forward (fbgemm TBE)
    emb_a2a_fwd      pooled-embedding alltoall forward, and waiting for it
    dense_fwd        the rest of the forward pass: MLPs, interaction, loss
    backward         backward pass, dense and embedding, the fused embedding update included
    grad_a2a         alltoall of the pooled-embedding gradients (backward)
    dense_allreduce  time the backward pass waits for DDP's gradient allreduce (exposed, not overlapped)
    optimizer        dense optimizer step and zero_grad
    other            the step's time outside all of these (Python, the pipeline's bookkeeping)

Each instant of the step's thread counts once, for the innermost range with a phase, so the phases
add up to the step. Collectives run on the backend's threads (Gloo) or on the GPU (NCCL); their
durations, per kind, are returned apart (`comm_s`), for comparison with the cost model.
On CUDA the CPU-side ranges include the waits on the GPU that the step performs, not kernel times;
`device_breakdown` gives those: each kernel's (or copy's) time, for the phase of the op that launched it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

PHASES = (
    "data",
    "input_dist",
    "emb_lookup",
    "emb_a2a_fwd",
    "dense_fwd",
    "backward",
    "grad_a2a",
    "dense_allreduce",
    "optimizer",
    "other",
)
STEP_RANGE = "## dlrm:train_step ##"

# (phase, pattern on the range name); first match wins.
_RULES: list[tuple[str, re.Pattern]] = [
    (phase, re.compile(pattern))
    for phase, pattern in (
        ("data", r"^## (next_batch|load_batch|(inplace_)?copy_batch_to_gpu|wait_for_batch)\b"),
        (
            "input_dist",
            r"^## (start|wait)_sparse_data_dist\b|^## all2all_data:|^## dist_init:|^\[(input_dist|splits_dist)\]_|"
            r"^## (KJTAllToAllTensors|KJTList|FusedKJTListSplits|SplitsAllToAll)Awaitable wait\(\) ##",
        ),
        ("emb_lookup", r"^\[lookup\]_"),
        ("grad_a2a", r"^(autograd::engine::evaluate_function: )?All2All_\w+Backward$|^## All2All_\w+_bwd ##"),
        ("emb_a2a_fwd", r"^\[output_dist(_wait)?\]_|^## All2All_\w+_fwd ##|^All2All_Pooled_(Req|Wait)$"),
        ("dense_fwd", r"^## forward\b|^DistributedDataParallel\.forward$"),
        ("backward", r"^## backward\b"),
        ("optimizer", r"^## (optimizer|zero_grad)\b|^Optimizer\.(step|zero_grad)#"),
    )
]

# Collectives on the backend's threads or the GPU: (kind, pattern).
_COLLECTIVES = [
    ("alltoall", re.compile(r"all_?to_?all|SendRecv", re.I)),
    ("allreduce", re.compile(r"all_?reduce", re.I)),
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)),
    ("allgather", re.compile(r"all_?gather", re.I)),
]


@contextmanager
def kineto_quiet() -> Iterator[None]:
    """Silence stderr (file descriptor 2) while the profiler starts or stops.

    libkineto (torch.profiler's engine) writes a `USDT: ... profiler_start` / `profiler_stop` line to
    stderr at each start and stop, whatever KINETO_LOG_LEVEL says; around those calls only.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def phase_of(name: str) -> str | None:
    """The phase a range of this name stands for, or None (it belongs to its enclosing range)."""
    for phase, pattern in _RULES:
        if pattern.search(name):
            return phase
    return None


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass(frozen=True)
class Span:
    """One profiler event: name, the thread it started on, start and end (s), whether it ran on a
    device (a GPU kernel) rather than a CPU thread, its correlation id, and for a device event the
    correlation id of the CPU event that launched it (0: none)."""

    name: str
    thread: int
    start: float
    end: float
    device: bool = False
    correlation: int = 0
    linked: int = 0


def spans_of(prof) -> list[Span]:
    """The events of a stopped `torch.profiler.profile`, read straight from its Kineto results
    (building torch's FunctionEvent tree with `prof.events()` costs several times more)."""
    return [
        Span(
            e.name(),
            e.start_thread_id(),
            e.start_ns() / 1e9,
            e.end_ns() / 1e9,
            e.device_type().name != "CPU",
            e.correlation_id(),
            e.linked_correlation_id(),
        )
        for e in prof.profiler.kineto_results.events()
    ]


def _collective_kind(span: Span) -> str | None:
    """alltoall, allreduce, ... for a collective that runs on the backend's thread or a GPU; else None."""
    if not (span.name.startswith("gloo:") or (span.device and "nccl" in span.name.lower())):
        return None
    for kind, pattern in _COLLECTIVES:
        if pattern.search(span.name):
            return kind
    return None


@dataclass
class _Node:
    span: Span
    phase: str
    children: list[_Node] = field(default_factory=list)


def _tree(step: Span, spans: list[Span]) -> _Node:
    """The ranges of `step`'s thread within it, nested by containment; each takes the phase of its
    name, or else its parent's."""
    root = _Node(step, "other")
    inside = sorted(
        (
            s
            for s in spans
            if s.thread == step.thread
            and not s.device
            and s is not step
            and step.start <= s.start
            and s.end <= step.end
        ),
        key=lambda s: (s.start, -s.end),
    )
    stack = [root]
    for s in inside:
        while len(stack) > 1 and s.end > stack[-1].span.end:
            stack.pop()
        parent = stack[-1]
        node = _Node(s, phase_of(s.name) or parent.phase)
        parent.children.append(node)
        stack.append(node)
    return root


def step_breakdown(spans: list[Span]) -> list[tuple[dict[str, float], dict[str, float]]]:
    """Per profiled step (each `STEP_RANGE` span): (seconds per phase, seconds per collective kind).

    Each instant of the step's thread counts for the innermost range that has a phase, so the phase
    seconds add up to the step's duration. The `backward` range's own time (no op of ours running)
    while DDP's allreduce is in flight counts as `dense_allreduce`. Collective seconds: the union of
    the intervals, within the step, in which a collective of that kind ran on any backend thread or GPU.
    """
    collectives: dict[str, list[tuple[float, float]]] = {}
    for s in spans:
        kind = _collective_kind(s)
        if kind is not None:
            collectives.setdefault(kind, []).append((s.start, s.end))
    allreduce = _union(collectives.get("allreduce", []))
    out = []
    for step in (s for s in spans if s.name == STEP_RANGE):
        phases: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        todo = [_tree(step, spans)]
        while todo:
            node = todo.pop()
            own = max(0.0, (node.span.end - node.span.start) - sum(c.span.end - c.span.start for c in node.children))
            if node.phase == "backward" and allreduce and own > 0:
                gaps, at = [], node.span.start
                for child in node.children:
                    if child.span.start > at:
                        gaps.append((at, child.span.start))
                    at = max(at, child.span.end)
                if node.span.end > at:
                    gaps.append((at, node.span.end))
                waiting = min(own, _overlap(gaps, allreduce))
                phases["dense_allreduce"] += waiting
                own -= waiting
            phases[node.phase] += own
            todo.extend(node.children)
        comm = {
            kind: sum(max(0.0, min(b, step.end) - max(a, step.start)) for a, b in _union(intervals))
            for kind, intervals in collectives.items()
        }
        out.append((phases, comm))
    return out


def _launch_phases(step: Span, spans: list[Span]) -> dict[int, str]:
    """Correlation id -> phase of the CPU events of `step`: those of its thread, nested in its ranges,
    and those of other threads that start within it (on CUDA the autograd engine's own thread runs the
    backward pass): nested likewise, where the outermost take the phase the step's thread is in."""
    root = _tree(step, spans)
    phases: dict[int, str] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        if node.span.correlation:
            phases[node.span.correlation] = node.phase
        todo.extend(node.children)

    def phase_at(t: float) -> str:
        node = root
        while True:  # children are disjoint and sorted by start: descend into the one holding t
            inside = [c for c in node.children if c.span.start <= t < c.span.end]
            if not inside:
                return node.phase
            node = inside[0]

    others: dict[int, list[Span]] = {}
    for s in spans:
        if not s.device and s.thread != step.thread and step.start <= s.start <= step.end:
            others.setdefault(s.thread, []).append(s)
    for thread_spans in others.values():
        stack: list[tuple[Span, str]] = []
        for s in sorted(thread_spans, key=lambda s: (s.start, -s.end)):
            while stack and s.end > stack[-1][0].end:
                stack.pop()
            phase = phase_of(s.name) or (stack[-1][1] if stack else phase_at(s.start))
            stack.append((s, phase))
            if s.correlation:
                phases[s.correlation] = phase
    return phases


def device_breakdown(spans: list[Span]) -> list[dict[str, float]]:
    """Per profiled step (each `STEP_RANGE` span): device seconds per phase. Each device event (GPU
    kernel, copy) counts for the phase of the CPU event that launched it (`_launch_phases`), so a
    step's kernels count for it even where they run after its CPU side returned. Kernels on several
    streams can overlap: the phases add up to device time, not to the step."""
    device = [s for s in spans if s.device and s.linked]
    out = []
    for step in (s for s in spans if s.name == STEP_RANGE):
        launched = _launch_phases(step, spans)
        phases: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        for s in device:
            phase = launched.get(s.linked)
            if phase is not None:
                phases[phase] += s.end - s.start
        out.append(phases)
    return out


def collective_spans(spans: list[Span]) -> dict[str, list[tuple[float, float]]]:
    """Per collective kind, the (start, end) seconds of every collective that starts within the (one)
    profiled step, in order of start: what `split_waits` needs from this rank."""
    steps = [s for s in spans if s.name == STEP_RANGE]
    out: dict[str, list[tuple[float, float]]] = {}
    for s in sorted(spans, key=lambda s: s.start):
        kind = _collective_kind(s)
        if kind is not None and any(st.start <= s.start <= st.end for st in steps):
            out.setdefault(kind, []).append((s.start, s.end))
    return out


@dataclass
class Waits:
    """How long this rank's collectives waited for peers, from every rank's entry times.

    wait_s: per kind, seconds of this rank's collectives before the last rank entered them (the union
    of those intervals, as `step_breakdown` counts a kind's seconds); kinds whose collectives the ranks
    did not issue alike (counts differ) are left out and listed in `unmatched`. behind_s: per kind (those
    of wait_s), the further seconds its collectives ran while a collective of another kind, entered
    earlier, was still running on this rank (DDP's allreduce issued while the gradient alltoall holds
    the link): counted once, for the earlier one, as the link serves them in turn. The rest of a kind's
    seconds is its transfer. late_s: per rank, the seconds the others waited for it, on average over
    them (the rank that enters last causes the wait). critical_s: per kind (given every rank's exit
    times), the collectives' own seconds, the same on every rank: from the last rank's entry to the last
    rank's exit of each (a rank that has its data leaves while its peer still waits for its bytes, so
    one rank's transfer can be less); where several are in flight together (DDP's allreduce beside the
    gradient alltoall, entered before or after it) the link serves them in turn, so in order of their
    ends each counts from its start or the previous one's end, whichever is later: each one's time
    alone, as a cost model prices it.
    """

    wait_s: dict[str, float]
    late_s: list[float]
    unmatched: list[str]
    behind_s: dict[str, float] = field(default_factory=dict)
    critical_s: dict[str, float] = field(default_factory=dict)


def split_waits(
    own: dict[str, list[tuple[float, float]]],
    entries: list[dict[str, list[float]]],
    rank: int,
    exits: list[dict[str, list[float]]] | None = None,
) -> Waits:
    """This rank's collectives' waiting for peers apart from their transfer.

    Args:
        own: this rank's (start, end) spans per collective kind (`collective_spans`); the i-th of a kind
            is the same collective on every rank.
        entries: every rank's entry times per kind, in rank order, in seconds of the profiler's Unix clock.
        exits: every rank's exit times likewise, for `Waits.critical_s`; None: not measured.
    """
    p = len(entries)
    wait: dict[str, float] = {}
    behind: dict[str, float] = {}
    together: dict[str, list[tuple[float, float]]] = {}  # per kind: (last entry, last exit) of each collective
    late = [0.0] * p
    unmatched = []
    for kind in sorted(set().union(own, *entries)):
        counts = {len(e.get(kind, [])) for e in entries}
        mine = own.get(kind, [])
        if len(counts) != 1 or len(mine) != len(entries[rank].get(kind, [])):
            unmatched.append(kind)
            continue
        waits = []
        if exits is not None:
            firsts = [max(e[kind][i] for e in entries) for i in range(len(mine))]
            lasts = [max(x[kind][i] for x in exits) for i in range(len(mine))]
            together[kind] = [(a, b) for a, b in zip(firsts, lasts, strict=True) if b > a]
        for i, (start, end) in enumerate(mine):
            times = [e[kind][i] for e in entries]
            last = max(times)
            if last > start:
                waits.append((start, min(end, last)))
            slowest = times.index(last)
            if p > 1:
                late[slowest] += sum(last - t for t in times) / (p - 1)
        wait[kind] = sum(b - a for a, b in _union(waits))
        earlier = [  # while a collective of another kind, entered before it, still ran
            (start, min(end, end_other))
            for start, end in mine
            for other, theirs in own.items()
            if other != kind
            for start_other, end_other in theirs
            if start_other < start < end_other
        ]
        behind[kind] = max(0.0, sum(b - a for a, b in _union(waits + earlier)) - wait[kind])
    return Waits(wait, late, unmatched, behind, _served_in_turn(together))


def _served_in_turn(spans: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Per kind, the seconds of its spans (start: all ranks in; end: all out) as the link serves them in
    turn: taken in order of end, each counts from its start or the previous one's end, whichever is
    later (the one that ends next is the one being served)."""
    out = dict.fromkeys(spans, 0.0)
    served_until = float("-inf")
    for end, start, kind in sorted((b, a, kind) for kind, s in spans.items() for a, b in s):
        out[kind] += max(0.0, end - max(start, served_until))
        served_until = max(served_until, end)
    return out
