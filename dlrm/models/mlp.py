"""TorchRec's ReLU MLP with each layer one autograd node: the ReLU in place, the weight's gradient contiguous.

Same parameters, state-dict keys and results as `torchrec.modules.mlp.MLP(activation="relu")`, less
work: the ReLU overwrites the product, and the backward computes the weight's gradient [out, in]
contiguous (`weight_grad`). With `use_onednn`, its fp32 products on the CPU run in oneDNN
(`dlrm.models.onednn`) instead of MKL.
"""

from __future__ import annotations

import torch
from torchrec.modules.mlp import MLP

from dlrm.models import onednn


class _LinearReLU(torch.autograd.Function):
    """relu(x w^T + b) [B, out] of x [B, in], w [out, in], b [out]; under autocast in its dtype (the
    inputs cast once, as autocast's `addmm` does; autograd casts the gradients back). With `use_onednn`,
    fp32 products on the CPU run in oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, use_onednn: bool) -> torch.Tensor:
        device = x.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
        ctx.onednn = use_onednn and device == "cpu" and x.dtype == torch.float32
        out = onednn.linear(x, weight, bias) if ctx.onednn else torch.addmm(bias, x, weight.t())
        out.relu_()
        ctx.save_for_backward(x, weight, out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, out = ctx.saved_tensors
        grad = torch.ops.aten.threshold_backward(grad.to(out.dtype), out, 0)  # ReLU's: grad where out > 0, else 0
        mm = onednn.mm if ctx.onednn else torch.mm
        grad_x = mm(grad, weight) if ctx.needs_input_grad[0] else None
        return grad_x, weight_grad(grad, x, mm), grad.sum(0), None


def weight_grad(grad: torch.Tensor, x: torch.Tensor, mm=torch.mm) -> torch.Tensor:
    """g^T x [out, in], contiguous, of g [B, out] and x [B, in], by `mm` (torch.mm or onednn.mm).

    On the CPU in fp32, a layer wider out than in gets it as (x^T g)^T and one copy of the small
    result, which both MKL and oneDNN compute faster; elsewhere (bf16, CUDA, narrowing layers) g^T x.
    The same sums in another order.
    """
    if grad.device.type == "cpu" and grad.dtype == torch.float32 and x.shape[1] < grad.shape[1]:
        return mm(x.t(), grad).t().contiguous()
    return mm(grad.t(), x)


@torch.fx.wrap  # a leaf for torch.fx (TorchRec's pipeline traces the model)
def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, use_onednn: bool = False) -> torch.Tensor:
    """relu(x weight^T + bias) [B, out] of x [B, in], as `_LinearReLU`; when compiled as plain ops, which
    the compiler fuses itself (its functional graph has no place for the in-place backward)."""
    if torch.compiler.is_compiling():
        return torch.relu(torch.nn.functional.linear(x, weight, bias))
    return _LinearReLU.apply(x, weight, bias, use_onednn)


class ReLUMLP(MLP):
    """`MLP(in_size, layer_sizes, activation="relu")` whose layers run as `linear_relu`.

    forward(x [B, in_size]) -> [B, layer_sizes[-1]]. Layers are the module's `nn.Linear`s in order.
    """

    def __init__(self, in_size: int, layer_sizes: list[int], device: torch.device | None = None) -> None:
        super().__init__(in_size, layer_sizes, bias=True, activation="relu", device=device)
        self.onednn = False  # fp32 products on the CPU in oneDNN (`use_onednn`), else torch's (MKL)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        for layer in self.modules():
            if isinstance(layer, torch.nn.Linear):
                input = linear_relu(input, layer.weight, layer.bias, self.onednn)
        return input


def use_onednn(model: torch.nn.Module) -> int:
    """Let every `ReLUMLP` in `model` compute its fp32 CPU products in oneDNN. Returns how many there are."""
    mlps = [m for m in model.modules() if isinstance(m, ReLUMLP)]
    for mlp in mlps:
        mlp.onednn = True
    return len(mlps)
