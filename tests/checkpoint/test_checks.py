"""The checkpointer's own checks of what it saves: the non-finite check works in bounded chunks
(dlrm.checkpoint.finite.all_finite), and the files a save wrote come from DCP's metadata, not from
whatever else the directory holds (dlrm.checkpoint.checkpointer.saved_files)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.overrides import TorchFunctionMode

from dlrm.checkpoint import METADATA, nonfinite_tensors
from dlrm.checkpoint.checkpointer import saved_files, storage_writer
from dlrm.checkpoint.finite import all_finite


class LargestCheck(TorchFunctionMode):
    """The most elements one torch.aminmax or torch.isfinite call was given."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.aminmax, torch.isfinite):
            self.largest = max(self.largest, args[0].numel())
        return func(*args, **(kwargs or {}))


def shapes():
    full = torch.randn(37, 11)
    shapes = {"contiguous": full, "transposed": full.t(), "1-d": full.reshape(-1), "0-d": full[0, 0], "empty": full[:0]}
    return {**shapes, "bf16": full.to(torch.bfloat16), "fp16 transposed": full.t().to(torch.float16)}


def spoil(t: torch.Tensor, bad: float, first: bool) -> None:
    if t.numel():
        t[(0 if first else -1,) * t.dim()] = bad


@pytest.mark.parametrize("name", sorted(shapes()))
def test_all_finite_in_chunks_is_isfinite_all(name):
    for bad in (None, float("nan"), float("inf"), float("-inf")):
        for first in (True, False):
            t = shapes()[name]
            if bad is not None:
                spoil(t, bad, first)
            row = t.numel() // t.shape[0] if t.dim() and t.shape[0] else 1
            for chunk in (1, 7, 11, 64, 10_000):
                with LargestCheck() as seen:
                    result = all_finite(t, chunk)
                assert result.dim() == 0 and result.dtype == torch.bool
                assert bool(result) == bool(torch.isfinite(t).all()), (bad, first, chunk)
                bound = chunk if t.is_contiguous() else max(chunk, row)  # whole rows when not contiguous
                assert seen.largest <= max(bound, 2), (chunk, seen.largest)  # 2: a block's min and max


def test_nonfinite_tensors_names_each_bad_tensor():
    state = {"model": {"a": torch.zeros(5, 3), "b": torch.zeros(4)}, "step": torch.tensor([3])}
    state["model"]["b"][2] = float("nan")
    assert nonfinite_tensors(state) == ["model.b"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP's no-dist path says so
def test_saved_files_are_dcp_s_not_the_directory_s(tmp_path):
    (tmp_path / "stray.distcp").write_bytes(b"not ours")  # what another writer left, or a shared fs's debris
    state = {"a": torch.arange(6.0), "b": torch.ones(2, 2), "step": torch.tensor([4])}
    names = saved_files(dcp.save(state, storage_writer=storage_writer(tmp_path), no_dist=True))
    on_disk = sorted(p.name for p in tmp_path.iterdir() if p.name != "stray.distcp")
    assert METADATA in names and "stray.distcp" not in names
    assert names == on_disk  # every file DCP wrote, one per item here
