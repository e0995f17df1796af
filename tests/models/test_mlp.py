"""ReLUMLP equals TorchRec's ReLU MLP: keys, outputs and every gradient, in fp32 and under bf16 autocast,
with torch's products and with oneDNN's (`use_onednn`)."""

import pytest
import torch
from torchrec.models.dlrm import DLRM, DLRM_DCN
from torchrec.modules.mlp import MLP

from dlrm.models import onednn
from dlrm.models.dlrm import build_model
from dlrm.models.mlp import ReLUMLP, use_onednn, weight_grad


def _pair(in_size: int, sizes: list[int]) -> tuple[MLP, ReLUMLP]:
    torch.manual_seed(0)
    reference = MLP(in_size, sizes, activation="relu")
    ours = ReLUMLP(in_size, sizes)
    ours.load_state_dict(reference.state_dict())  # strict: the same keys and shapes
    return reference, ours


def _run(mlp: torch.nn.Module, x: torch.Tensor, bf16: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Output and the gradients of (output * fixed weights).sum() for x and every parameter."""
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = mlp(x)
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out.float() * weights).sum().backward()
    grads = [x.grad] + [p.grad for p in mlp.parameters()]
    return out, grads


@pytest.mark.parametrize("with_onednn", [False, True])
@pytest.mark.parametrize("bf16", [False, True])
def test_relu_mlp_equals_torchrecs(bf16, with_onednn, monkeypatch):
    reference, ours = _pair(13, [64, 32, 8])
    calls = []
    if with_onednn:
        assert use_onednn(ours) == 1
        linear = onednn.linear
        monkeypatch.setattr(onednn, "linear", lambda *a, **k: calls.append(1) or linear(*a, **k))
    x = torch.randn(50, 13)
    want, want_grads = _run(reference, x, bf16)
    got, got_grads = _run(ours, x, bf16)
    # oneDNN's fp32 path: per layer one product forward, two backward (the input's and the weight's
    # gradients); under autocast the bf16 products are torch's.
    assert len(calls) == (0 if bf16 or not with_onednn else 9)
    assert got.dtype == want.dtype == (torch.bfloat16 if bf16 else torch.float32)
    # The same products in the same dtype; only the weight gradient's summation order may differ
    # (g^T x against (x^T g)^T): fp32 rounding, or one bf16 rounding of the result.
    tol = dict(rtol=1.6e-2, atol=1e-2) if bf16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    assert (got > 0).sum() > 0 and (got == 0).sum() > 0  # the ReLU cuts somewhere: its gradient is tested
    for g, w in zip(got_grads, want_grads, strict=True):
        assert g.dtype == w.dtype and g.is_contiguous()
        torch.testing.assert_close(g, w, **tol)


@pytest.mark.parametrize("with_onednn", [False, True])
def test_relu_mlp_keeps_nan(with_onednn):
    """A NaN weight reaches the output, as through TorchRec's MLP (torch.relu keeps NaN; oneDNN's fused
    ReLU would map it to 0 and hide the divergence from the trainer's non-finite checks)."""
    _, ours = _pair(5, [7, 3])
    if with_onednn:
        use_onednn(ours)
    with torch.no_grad():
        ours._mlp[0]._linear.weight[0, 0] = float("nan")
    assert ours(torch.ones(4, 5)).isnan().all()


def test_relu_mlp_gradcheck_and_repeated_backward():
    _, ours = _pair(5, [7, 3])
    ours.double()
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ours, (x,), eps=1e-6, atol=1e-6)
    # The saved tensors are left intact: a graph kept with retain_graph gives the same gradient twice.
    out = ours(x).sum()
    first = torch.autograd.grad(out, x, retain_graph=True)[0]
    torch.testing.assert_close(torch.autograd.grad(out, x)[0], first, rtol=0, atol=0)


def test_relu_mlp_is_an_fx_leaf_per_layer():
    _, ours = _pair(5, [7, 3])
    graph = torch.fx.symbolic_trace(ours).graph
    calls = [n.target.__name__ for n in graph.nodes if n.op == "call_function"]
    assert calls == ["linear_relu", "linear_relu"]


@pytest.mark.parametrize("model", ["tiny", "dcn_small"])
def test_models_use_it_with_torchrecs_keys(make_config, model):
    cfg = make_config(f"model={model}").model
    net = build_model(cfg).model
    assert isinstance(net.dense_arch.model, ReLUMLP) and isinstance(net.over_arch.model[0], ReLUMLP)
    assert not net.dense_arch.model.onednn and use_onednn(net) == 2 and net.over_arch.model[0].onednn
    common = dict(
        embedding_bag_collection=net.sparse_arch.embedding_bag_collection,
        dense_in_features=cfg.dense_in_features,
        dense_arch_layer_sizes=list(cfg.bottom_mlp),
        over_arch_layer_sizes=list(cfg.top_mlp),
        dense_device=torch.device("meta"),
    )
    if cfg.interaction == "dcn":
        torchrecs = DLRM_DCN(dcn_num_layers=cfg.dcn_num_layers, dcn_low_rank_dim=cfg.dcn_low_rank_dim, **common)
    else:
        torchrecs = DLRM(**common)
    want = {k: v.shape for k, v in torchrecs.state_dict().items()}
    assert {k: v.shape for k, v in net.state_dict().items()} == want


@pytest.mark.parametrize("in_size,out_size", [(13, 64), (64, 13)])  # widening: (x^T g)^T; narrowing: g^T x
def test_weight_grad_is_g_transpose_x_contiguous(in_size, out_size):
    torch.manual_seed(0)
    g, x = torch.randn(40, out_size), torch.randn(40, in_size)
    got = weight_grad(g, x)
    assert got.shape == (out_size, in_size) and got.is_contiguous()
    torch.testing.assert_close(got, (g.double().t() @ x.double()).float(), rtol=1e-5, atol=1e-5)
