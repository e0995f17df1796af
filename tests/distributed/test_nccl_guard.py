"""The host-tensor guard (tests/helpers/nccl_guard.py) flags exactly what NCCL would refuse."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.helpers.nccl_guard import HostTensorGuard


def test_host_made_tensors_in_collectives_are_flagged(group):
    device = torch.device("cpu")  # the training device, named as the trainer names it
    with HostTensorGuard(checked_prefix="tests.") as guard:
        dist.all_reduce(torch.zeros(3), group=group)  # made without a device: on the host on a GPU machine
        dist.all_reduce(torch.tensor([1.0, 2.0]).float() * 2, group=group)  # computed from host-made only
        dist.all_reduce(torch.zeros(3, device=device).cpu(), group=group)  # moved to the host
        dist.all_reduce(torch.zeros(3, device=device).to("cpu"), group=group)
        made = len(guard.violations)
        dist.all_reduce(torch.zeros(3, device=device), group=group)  # on the training device
        dist.all_reduce(torch.zeros(3).to(device), group=group)  # moved there
        on_device = torch.ones(2, device=device)
        dist.all_reduce(on_device + torch.tensor(1.0), group=group)  # device op with a host scalar: on device
        dist.all_reduce(on_device.new_tensor([3.0, 4.0]), group=group)  # new_tensor keeps the device
        parts = [torch.empty_like(on_device)]
        dist.all_gather(parts, on_device, group=group)
    assert made == 4, guard.violations
    assert [v[0] for v in guard.violations] == ["all_reduce"] * 4
    assert all("test_nccl_guard.py" in v[2] for v in guard.violations)
    assert guard.checked == 9
    assert dist.all_reduce is not None and "checked" not in dist.all_reduce.__name__  # restored on exit


def test_collectives_of_other_modules_are_not_checked(group):
    with HostTensorGuard(checked_prefix="dlrm.") as guard:
        dist.all_reduce(torch.zeros(3), group=group)  # called from tests/: not dlrm code
    assert guard.violations == [] and guard.checked == 0


def test_numpy_made_tensors_and_list_collectives_are_checked(group):
    """A tensor over a numpy array's memory is on the host; the list forms of the collectives are wrapped too."""
    import numpy as np

    with HostTensorGuard(checked_prefix="tests.") as guard:
        dist.all_reduce(torch.from_numpy(np.zeros(3, dtype=np.float32)), group=group)
        out = [torch.empty(3, device=torch.device("cpu"))]
        dist.all_to_all(out, [torch.ones(3)], group=group)  # the input made without a device
        dist.reduce_scatter(torch.empty(3, device=torch.device("cpu")), [torch.ones(3)], group=group)
    assert [v[0] for v in guard.violations] == ["all_reduce", "all_to_all", "reduce_scatter"], guard.violations


def test_tensors_made_on_other_threads_are_tracked(group):
    """The mode is per thread: a batch built on the prefetch thread is marked as on the main thread."""
    import threading

    made = {}

    def build():
        made["host"] = torch.ones(3)  # as a batch is built, without a device
        made["device"] = torch.ones(3, device=torch.device("cpu"))

    with HostTensorGuard(checked_prefix="tests.") as guard:
        worker = threading.Thread(target=build)
        worker.start()
        worker.join()
        dist.all_reduce(made["host"], group=group)
        dist.all_reduce(made["device"], group=group)
        dist.all_reduce(made["host"].to(torch.device("cpu")), group=group)  # moved to the training device
    assert [v[0] for v in guard.violations] == ["all_reduce"], guard.violations
    assert threading.Thread.run.__name__ == "run"  # restored on exit
