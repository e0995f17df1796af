"""A CPU stand-in for a GPU's host-device synchronisations: count where a training step would wait.

On a GPU the host queues kernels and runs ahead of the device until it needs a value or a copy
back; each such point stalls the host until the device has drained its queue. On CPU nothing
waits, so `SyncCounter` tells the points apart by the tensors' origin (as tests/helpers/nccl_guard.py
does for host tensors):

- a tensor is *device* when made with a device object (`torch.zeros(n, device=device)`), moved with
  `.to(device)`, computed from a device tensor, or marked (`mark_device`: the model's weights);
  *host* when made without a device, with the string "cpu", moved by `.cpu()` / `.numpy()` /
  `.to("cpu")`, or computed from host tensors only; *unknown* otherwise (made before the counter
  or on another thread: counted both ways, so nothing is missed);
- the sync points counted: `.item()`, `.tolist()`, `bool()`/`float()`/`int()`, printing, `.numpy()`,
  `.cpu()` and `.to("cpu")` of a tensor not known to be on the host; `torch.equal`/`allclose`/
  `is_nonzero`; results whose shape depends on the data (`nonzero`, `masked_select`, `unique`, a
  boolean index); a blocking copy (`.to(device)` or `copy_` across host and device without
  `non_blocking=True`, `torch.tensor(data, device=device)`); `torch.cuda.synchronize` and every call
  of the trainer's own `sync` (`counting_synchronizer`).

Each sync is attributed to the step being trained (phase "step") or to the loop's work after it
(phase "after": log, evaluation, checkpoint), and to its caller: `ours` when the first frame outside
torch (and outside a batch's `.to`) is dlrm code, else the library that made it (TorchRec's own
input distribution reads its splits on the host, for example).
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

T = torch.Tensor
READS = {T.item, T.tolist, T.__bool__, T.__float__, T.__int__, T.__index__, T.numpy, T.cpu}
READS |= {T.__format__, T.__repr__, T.__str__}
COMPARES = {torch.equal, torch.allclose, torch.is_nonzero, T.equal, T.allclose}
DATA_SHAPED = {torch.nonzero, T.nonzero, torch.argwhere, torch.masked_select, T.masked_select}
DATA_SHAPED |= {torch.unique, T.unique, torch.unique_consecutive, T.unique_consecutive}
FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange}
FACTORIES |= {torch.linspace, torch.rand, torch.randn, torch.randint, torch.randperm, torch.from_numpy}
FROM_DATA = {torch.tensor, torch.as_tensor, T.new_tensor}
# Pass-through frames: a batch's or KJT's `.to` moves tensors the way its caller asked.
PASS_THROUGH = {"to", "pin_memory", "record_stream", "_to_device"}
PASS_MODULES = ("torchrec.datasets.utils", "torchrec.sparse.jagged_tensor", "torchrec.streamable")
HOST, DEVICE = "host", "device"


@dataclass(frozen=True)
class Sync:
    step: int  # the training step (1-based) being trained ("step") or just trained ("after"); 0 before
    phase: str  # "start", "step" or "after"
    kind: str  # e.g. "item", "synchronize", "blocking copy to device"
    ours: bool  # called from dlrm code
    where: str  # "module:line function" of the first frame outside torch


def _caller(frame) -> tuple[bool, str]:
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module in (__name__, "torch") or module.startswith("torch."):  # torch's own; torchrec is a library
            frame = frame.f_back
            continue
        if module.startswith(PASS_MODULES) and frame.f_code.co_name in PASS_THROUGH:
            frame = frame.f_back
            continue
        return module.startswith("dlrm"), f"{module}:{frame.f_lineno} {frame.f_code.co_name}"
    return False, "?"


def _target(value) -> str | None:
    """Where `.to(value)` puts a tensor: a torch.device is the training device, the string "cpu" the host."""
    if isinstance(value, torch.device):
        return DEVICE
    if isinstance(value, str):
        return HOST if value == "cpu" or value.startswith("cpu:") else DEVICE
    return None


class SyncCounter(TorchFunctionMode):
    """`with SyncCounter() as counter:` records every sync point of this thread in `counter.syncs`."""

    def __init__(self) -> None:
        super().__init__()
        self._state: dict[int, tuple[weakref.ref, str]] = {}
        self.syncs: list[Sync] = []
        self.step, self.phase = 0, "start"
        self.host_work = False  # within `on_host`: nothing recorded, every result a host tensor
        self._saved_synchronize: Callable | None = None

    @contextmanager
    def on_host(self) -> Iterator[None]:
        """Count the work within as host work (a batch source that makes its batches on the host)."""
        self.host_work = True
        try:
            yield
        finally:
            self.host_work = False

    def at(self, step: int, phase: str) -> None:
        self.step, self.phase = step, phase

    def record(self, kind: str, frame) -> None:
        ours, where = _caller(frame)
        self.syncs.append(Sync(self.step, self.phase, kind, ours, where))

    def counting_synchronizer(self, sync: Callable[[], None]) -> Callable[[], None]:
        """`sync`, each call recorded as a synchronisation (the trainer's wait for the device)."""

        def counted() -> None:
            self.record("synchronize", sys._getframe(1))
            sync()

        return counted

    def mark_device(self, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            self._set(t, DEVICE)

    def _set(self, t: torch.Tensor, state: str | None) -> None:
        key = id(t)
        if state is None:
            self._state.pop(key, None)
        else:
            self._state[key] = (weakref.ref(t, lambda _, key=key: self._state.pop(key, None)), state)

    def state(self, t: torch.Tensor) -> str | None:
        entry = self._state.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def _inputs(self, inputs) -> str | None:
        states = [self.state(t) for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)]
        if DEVICE in states:
            return DEVICE
        return HOST if states and all(s == HOST for s in states) else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        frame = sys._getframe(1)
        result_state = HOST if self.host_work else self._check(func, args, kwargs, frame)
        result = func(*args, **kwargs)
        for t in tree_flatten(result)[0]:
            if isinstance(t, torch.Tensor):
                self._set(t, result_state)
        return result

    def _check(self, func, args, kwargs, frame) -> str | None:
        """Record `func(*args, **kwargs)` if it is a sync point; the state of its results."""
        if func in READS:
            if self.state(args[0]) != HOST:
                self.record(func.__name__, frame)
            return HOST
        if func in COMPARES:
            if self._inputs(args) != HOST:
                self.record(func.__name__, frame)
            return HOST
        if func in DATA_SHAPED or (func is T.__getitem__ and self._bool_index(args[1])):
            if self._inputs(args[:1]) != HOST:
                self.record("data-dependent shape", frame)
        if func in (T.to, T.cuda):
            return self._copy(func, args, kwargs, frame)
        if func is T.copy_:
            non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
            if (self.state(args[0]) == HOST) != (self.state(args[1]) == HOST) and not non_blocking:
                self.record("blocking copy_", frame)
            return self.state(args[0])
        if func in FROM_DATA or func in FACTORIES:
            device = kwargs.get("device")
            if func is T.new_tensor and device is None:
                where = HOST if self.state(args[0]) == HOST else DEVICE
            else:
                where = _target(device) if device is not None else HOST
            data = args[1] if func is T.new_tensor else args[0] if args else None
            if func in FROM_DATA and where == DEVICE and not isinstance(data, torch.Tensor):
                self.record("blocking copy to device", frame)
            return where
        return self._inputs((args, kwargs))

    def _bool_index(self, index) -> bool:
        return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in tree_flatten(index)[0])

    def _copy(self, func, args, kwargs, frame) -> str | None:
        source = self.state(args[0])
        target = DEVICE if func is T.cuda else _target(kwargs.get("device"))
        for a in args[1:]:
            if target is None and isinstance(a, torch.Tensor):
                target = HOST if self.state(a) == HOST else DEVICE
            elif target is None:
                target = _target(a)
        non_blocking = kwargs.get("non_blocking", False) or any(a is True for a in args[1:])
        if target == HOST and source != HOST and not non_blocking:
            self.record("copy to host", frame)
        elif target == DEVICE and source != DEVICE and not non_blocking:
            self.record("blocking copy to device", frame)
        return target if target is not None else source

    def __enter__(self) -> SyncCounter:
        self._saved_synchronize = torch.cuda.synchronize
        torch.cuda.synchronize = self.counting_synchronizer(lambda *a, **k: None)  # type: ignore[assignment]
        super().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        torch.cuda.synchronize = self._saved_synchronize  # type: ignore[assignment]


class HostSource:
    """A batch source whose work the counter counts as host work: on CPU the synthetic source's
    tensors are on the training device too, but with data.synthetic.on_device=false (or Criteo
    files) a GPU run makes them on the host, off the training thread (dlrm.data.prefetch)."""

    def __init__(self, source, counter: SyncCounter) -> None:
        self.source, self.counter = source, counter

    def num_batches(self, split: str):
        return self.source.num_batches(split)

    def batches(self, split: str, rank: int, world_size: int, start_step: int = 0):
        batches = self.source.batches(split, rank, world_size, start_step)
        while True:
            with self.counter.on_host():
                batch = next(batches, None)
            if batch is None:
                return
            yield batch


def train_counting_syncs(cfg) -> dict:
    """Train on this rank under a SyncCounter: {"syncs": [Sync as dict...], "steps": steps trained,
    "losses": the logged losses}. The trainer's sync function is counted too; the model's weights
    are device tensors; the batches are made on the host (`HostSource`)."""
    import dlrm.trainer.build as build_module
    from dlrm.trainer.loop import train
    from tests.helpers.workers import build_trainer

    counter = SyncCounter()
    synchronizer = build_module.synchronizer
    build_module.synchronizer = lambda device: counter.counting_synchronizer(synchronizer(device))
    try:
        trainer = build_trainer(cfg)
    finally:
        build_module.synchronizer = synchronizer
    assert not cfg.data.synthetic.on_device, "the batches must come from the host, as a GPU run's do"
    trainer.source = HostSource(trainer.source, counter)
    model = trainer.model
    counter.mark_device([*model.parameters(), *model.buffers()])
    counter.mark_device(v for v in model.state_dict(keep_vars=True).values() if type(v) is torch.Tensor)
    step_once = trainer.step_once

    def counted_step(batches):
        counter.at(trainer.step + 1, "step")
        try:
            return step_once(batches)
        finally:
            counter.at(trainer.step + 1, "after")

    trainer.step_once = counted_step  # type: ignore[method-assign]
    with counter:
        summary = train(trainer)
    return {
        "syncs": [dataclasses.asdict(s) for s in counter.syncs],
        "steps": summary["steps"],
        "losses": trainer.losses,
    }
