"""`DenseTransformModule`: the dense transform (`DenseTransform`) as a torch module, for a served model
that takes raw dense values."""

from __future__ import annotations

import torch

from dlrm.data.parquet.transforms import DenseTransform


class DenseTransformModule(torch.nn.Module):
    """module(dense [B, N] raw float32, NaN: missing) -> [B, N + flags] float32, equal to
    `DenseTransform.apply` to float32 rounding."""

    lo: torch.Tensor
    hi: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    log: torch.Tensor
    flags: torch.Tensor

    def __init__(self, transform: DenseTransform):
        super().__init__()
        for name in ("lo", "hi", "mean", "std"):
            self.register_buffer(name, torch.from_numpy(getattr(transform, name).copy()))
        self.register_buffer("log", torch.from_numpy(transform.log.copy()))
        self.register_buffer("flags", torch.tensor(transform.flags, dtype=torch.long))

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        missing = torch.isnan(dense)
        x = torch.minimum(torch.maximum(dense, self.lo), self.hi)
        x = torch.where(self.log, torch.log1p(torch.clamp(x, min=0)), x)
        x = (x - self.mean) / self.std
        x = torch.where(missing, torch.zeros_like(x), x)
        return torch.cat([x, missing[:, self.flags].to(x.dtype)], dim=1)
