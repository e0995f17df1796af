"""A CPU stand-in for NCCL's refusal of host tensors: fail where a GPU run would.

An NCCL process group has no CPU backend: a tensor on the host in one of its collectives ends the
run ("No backend type associated with device type cpu"), while Gloo on CPU takes it. On a CPU test
every tensor is on the host, so the device alone cannot tell. `HostTensorGuard` tells by origin:

- a tensor is *host-made* when made without naming a device (`torch.tensor(...)`, `torch.zeros(n)`,
  ..., which land on the host on a GPU machine too), or moved to the host (`.cpu()`, `.to("cpu")`,
  `.numpy()`-backed `torch.from_numpy`); results computed from host-made tensors only are host-made;
  a tensor made with a device object or moved with `.to(device)` is not (the trainer's device);
- a collective called from `dlrm` code with a host-made tensor is recorded as a violation (the
  guard does not raise inside the collective: the test reads `violations` and names each call).

Torch function modes are per thread: the guard also enters the mode in every Python thread started
while it is active (the prefetch thread builds batches there), so their tensors are marked alike.
Autograd's own device threads are C++ threads it cannot enter; on CPU, backward runs on the calling
thread.

Collectives that TorchRec and torch call themselves are not checked (on GPU they use device
tensors); nor are the object collectives (`all_gather_object`, ...), which torch moves to the
current device itself.
"""

from __future__ import annotations

import sys
import threading
import traceback
import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

# Made without a device argument: on the host, wherever the job runs.
FACTORIES = {
    torch.tensor,
    torch.as_tensor,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.arange,
    torch.linspace,
    torch.rand,
    torch.randn,
}
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "broadcast",
    "gather",
    "scatter",
    "reduce",
    "all_to_all",
    "reduce_scatter",
    "send",
    "recv",
    "isend",
    "irecv",
)


def _names_the_host(value) -> bool:
    return value == "cpu" or (isinstance(value, str) and value.startswith("cpu:"))


class HostTensorGuard(TorchFunctionMode):
    """Within `with HostTensorGuard() as guard:`, `guard.violations` lists each collective that `dlrm`
    code called with a host-made tensor: (collective, tensor shape, the dlrm caller's frame)."""

    def __init__(self, checked_prefix: str = "dlrm.") -> None:
        super().__init__()
        self.prefix = checked_prefix
        self._host: dict[int, weakref.ref] = {}  # id -> host-made tensor (tensors compare by value: no WeakSet)
        self.violations: list[tuple[str, list[int], str]] = []
        self.checked = 0  # collectives called from dlrm code
        self._originals: dict[str, Callable] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        if not outputs:
            return result
        if func in FACTORIES:
            host = kwargs.get("device") is None or _names_the_host(kwargs.get("device"))
        elif func is torch.Tensor.cpu:
            host = True
        elif func is torch.Tensor.to:
            target = [a for a in (*args[1:], kwargs.get("device")) if isinstance(a, (str, torch.device))]
            host = bool(target) and _names_the_host(target[0]) or (not target and self._all_host(args))
        else:
            host = self._all_host((args, kwargs))
        for t in outputs:
            if host:
                self._mark_host(t)
            else:
                self._host.pop(id(t), None)
        return result

    def _mark_host(self, t: torch.Tensor) -> None:
        key = id(t)  # forgotten when t dies, unless the id is another tensor's by then
        self._host[key] = weakref.ref(t, lambda r, key=key: self._host.get(key) is r and self._host.pop(key))

    def is_host_made(self, t: torch.Tensor) -> bool:
        ref = self._host.get(id(t))
        return ref is not None and ref() is t

    def _all_host(self, inputs) -> bool:
        tensors = [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)]
        return bool(tensors) and all(self.is_host_made(t) for t in tensors)

    def _wrap(self, name: str) -> Callable:
        original = getattr(dist, name)

        def checked(*args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_globals.get("__name__", "").startswith(self.prefix):
                self.checked += 1
                for t in tree_flatten((args, kwargs))[0]:
                    if isinstance(t, torch.Tensor) and self.is_host_made(t):
                        where = "".join(traceback.format_stack(caller, limit=1)).strip()
                        self.violations.append((name, list(t.shape), where))
            return original(*args, **kwargs)

        return checked

    def _from_numpy(self, array):
        """torch.from_numpy, which torch function modes do not see: a numpy array's memory is the host's."""
        t = self._real_from_numpy(array)
        self._mark_host(t)
        return t

    def _run_guarded(self, thread: threading.Thread) -> None:
        """A thread's run() inside this mode (the mode stack is per thread)."""
        TorchFunctionMode.__enter__(self)
        try:
            self._real_thread_run(thread)
        finally:
            TorchFunctionMode.__exit__(self, None, None, None)

    def __enter__(self) -> HostTensorGuard:
        self._real_thread_run = threading.Thread.run
        guard = self
        threading.Thread.run = lambda thread: guard._run_guarded(thread)  # type: ignore[method-assign]
        for name in COLLECTIVES:
            self._originals[name] = getattr(dist, name)
            setattr(dist, name, self._wrap(name))
        self._real_from_numpy = torch.from_numpy
        torch.from_numpy = self._from_numpy  # type: ignore[assignment]
        super().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        threading.Thread.run = self._real_thread_run  # type: ignore[method-assign]
        torch.from_numpy = self._real_from_numpy  # type: ignore[assignment]
        for name, original in self._originals.items():
            setattr(dist, name, original)
