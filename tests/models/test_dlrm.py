"""Model shapes, gradients, seed-and-name initialisation, and the learning-rate schedule."""

import copy

import pytest
import torch
from torchrec.distributed.types import LazyAwaitable
from torchrec.models.dlrm import DLRM, InteractionArch
from torchrec.sparse.jagged_tensor import KeyedTensor

from dlrm.config import ScheduleConfig
from dlrm.data.source import make_source
from dlrm.models.dlrm import (
    DotInteraction,
    LookupFirstDLRM,
    LookupFirstDLRM_DCN,
    PooledSparseArch,
    build_model,
    compile_dense,
    initialize,
    pooled_by_key,
    pooled_in_order,
    table_rows_init,
)
from dlrm.optim.optimizers import lr_factor, lr_schedule


@pytest.mark.parametrize("model", ["tiny", "dcn_small"])
def test_forward_shapes(make_config, model):
    cfg = make_config(f"model={model}", "data.global_batch_size=8")
    net = build_model(cfg.model, torch.device("cpu"))
    initialize(net, cfg.model, seed=0)
    loss, (_, logits, labels) = net(make_source(cfg).samples("train", 0, 8))
    assert loss.shape == () and logits.shape == (8,) and labels.shape == (8,)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend",
    [
        "aot_eager",  # TorchDynamo's capture and AOTAutograd's forward and backward graphs, run eagerly
        pytest.param("inductor", marks=pytest.mark.long),  # and Inductor's C++ kernels: ~40 s of compiles here
    ],
)
def test_compile_dense_compiles_the_mlps_and_interaction_only(make_config, backend):
    """Each part's forward runs under torch.compile after compile_dense, the lookup does not, the
    state-dict keys (checkpoints) stay those of the eager model, and the loss and every gradient equal
    the eager model's (fp32: a fused kernel reorders sums, so close, not equal). The 2-rank training
    under compile_dense (Inductor) against the unsharded reference is in the long tier (test_equivalence)."""
    cfg = make_config("model=tiny", "data.global_batch_size=8")
    net = build_model(cfg.model, torch.device("cpu"))
    initialize(net, cfg.model, seed=0)
    eager = copy.deepcopy(net)
    batch = make_source(cfg).samples("train", 0, 8)
    eager_loss, _ = eager(batch)
    eager_loss.backward()
    keys = list(net.state_dict())
    compiling: dict[str, list[bool]] = {}
    parts = ("dense_arch", "inter_arch", "over_arch", "sparse_arch")
    for name in parts:
        seen = compiling.setdefault(name, [])
        getattr(net.model, name).register_forward_pre_hook(
            lambda *_, seen=seen: seen.append(torch.compiler.is_compiling())
        )
    compile_dense(net, backend)
    loss, _ = net(batch)
    loss.backward()
    assert {name: any(seen) for name, seen in compiling.items()} == dict(zip(parts, [True, True, True, False]))
    assert list(net.state_dict()) == keys
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    grads = {n: p.grad for n, p in eager.named_parameters()}
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_meta_build_allocates_no_tables_or_mlps(make_config):
    net = build_model(make_config("model=mlperf_dcnv2").model).model
    for part in (net.sparse_arch, net.dense_arch, net.over_arch):
        assert all(p.is_meta for p in part.parameters())


@pytest.mark.parametrize("model", ["tiny", "dcn_small"])
def test_gradients_match_finite_differences(make_config, model):
    cfg = make_config(f"model={model}", "data.global_batch_size=4")
    net = build_model(cfg.model, torch.device("cpu")).double()
    initialize(net, cfg.model, seed=0)
    batch = make_source(cfg).samples("train", 0, 4)
    dense = batch.dense_features.double().requires_grad_()

    def loss_of(x):
        return net.model(x, batch.sparse_features).sum()

    assert torch.autograd.gradcheck(loss_of, (dense,), eps=1e-6, atol=1e-5)
    # And the embedding gradient: d loss / d table rows matches a finite difference.
    table = net.model.sparse_arch.embedding_bag_collection.embedding_bags["t_C1"].weight
    assert table.dtype == torch.float64
    row = int(batch.sparse_features["C1"].values()[0])
    loss_of(dense).backward()
    analytic = table.grad[row, 0].item()
    # The pooled embeddings come out in float32 even from float64 tables, so the difference's
    # rounding error is ~1e-7 * |loss| / h: h = 1e-3 keeps it well inside the tolerance.
    with torch.no_grad():
        table[row, 0] += 1e-3
        up = loss_of(dense).item()
        table[row, 0] -= 2e-3
        down = loss_of(dense).item()
    assert analytic == pytest.approx((up - down) / 2e-3, rel=1e-5, abs=1e-8)


def test_initial_weights_depend_on_seed_and_names_only(make_config):
    cfg = make_config("model=tiny")
    a = build_model(cfg.model, torch.device("cpu"))
    initialize(a, cfg.model, seed=3)
    cfg.model.tables = list(reversed(cfg.model.tables))  # other order, same names
    b = build_model(cfg.model, torch.device("cpu"))
    initialize(b, cfg.model, seed=3)
    sa, sb = a.state_dict(), b.state_dict()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name
    initialize(b, cfg.model, seed=4)
    assert not torch.equal(
        sa["model.sparse_arch.embedding_bag_collection.embedding_bags.t_C1.weight"],
        b.state_dict()["model.sparse_arch.embedding_bag_collection.embedding_bags.t_C1.weight"],
    )


def test_table_init_is_the_same_whatever_the_row_range():
    full = table_rows_init(0, "t", rows=10_000, dim=4, start=0, stop=10_000)
    assert full.abs().max() <= (1 / 10_000) ** 0.5
    assert torch.equal(table_rows_init(0, "t", 10_000, 4, 4000, 9000), full[4000:9000])
    assert torch.equal(table_rows_init(0, "t", 10_000, 4, 4095, 4097), full[4095:4097])


def test_lr_schedule_warmup_constant_poly_decay():
    s = ScheduleConfig(warmup_steps=4, decay_start_step=10, decay_steps=10, decay_power=2.0)
    assert [lr_factor(i, s) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(9, s) == 1.0
    assert lr_factor(15, s) == pytest.approx(0.25)
    assert lr_factor(20, s) == 0.0 and lr_factor(50, s) == 0.0
    assert lr_factor(123, ScheduleConfig()) == 1.0


def test_lr_schedule_is_torchs_lambdalr_positioned_by_the_step():
    """lr_schedule sets every group's lr to its base lr x lr_factor(step), from any starting step
    (a resume), and moves one step per .step(); a positioned schedule equals one run from 0."""
    s = ScheduleConfig(warmup_steps=4, decay_start_step=6, decay_steps=4, decay_power=2.0)

    def optimizer():
        w = torch.nn.Parameter(torch.zeros(1))
        return torch.optim.SGD([{"params": [w], "lr": 0.5}, {"params": [torch.nn.Parameter(w.detach())], "lr": 2.0}])

    opt = optimizer()
    schedule = lr_schedule(opt, s)
    assert isinstance(schedule, torch.optim.lr_scheduler.LambdaLR)
    seen = []
    for step in range(12):
        seen.append([g["lr"] for g in opt.param_groups])
        assert seen[-1] == pytest.approx([0.5 * lr_factor(step, s), 2.0 * lr_factor(step, s)])
        opt.step()
        schedule.step()
    resumed = optimizer()
    schedule = lr_schedule(resumed, s, step=7)
    for step in range(7, 12):
        assert [g["lr"] for g in resumed.param_groups] == pytest.approx(seen[step])
        resumed.step()
        schedule.step()


def test_shards_are_filled_in_chunks_with_the_same_values(make_config, monkeypatch):
    import dlrm.models.dlrm

    cfg = make_config("model=tiny")
    whole = build_model(cfg.model, torch.device("cpu"))
    initialize(whole, cfg.model, seed=0)
    monkeypatch.setattr(dlrm.models.dlrm, "INIT_CHUNK_ROWS", 7)  # tables of 30..100 rows: several chunks
    chunked = build_model(cfg.model, torch.device("cpu"))
    initialize(chunked, cfg.model, seed=0)
    for name, value in whole.state_dict().items():
        assert torch.equal(value, chunked.state_dict()[name]), name


@pytest.mark.parametrize("features", [0, 1, 2, 26])
def test_dot_interaction_equals_torchrec(features):
    """Same output and gradients as TorchRec's InteractionArch (scatter-add backward), in fp32."""
    gen = torch.Generator().manual_seed(features)
    dense = torch.randn(32, 16, generator=gen, requires_grad=True)
    sparse = torch.randn(32, features, 16, generator=gen, requires_grad=True)
    ours, theirs = DotInteraction(features), InteractionArch(features)
    out, ref = ours(dense, sparse), theirs(dense, sparse)
    assert out.shape == ref.shape == (32, 16 + features + features * (features - 1) // 2)
    # Each output is one dot product of 16 terms: both compute it with the same bmm.
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    grad_out = torch.randn(ref.shape, generator=gen)
    inputs = (dense, sparse) if features else (dense,)
    ours_grads = torch.autograd.grad(out, inputs, grad_out)
    ref_grads = torch.autograd.grad(ref, inputs, grad_out)
    for a, b in zip(ours_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # sums of ~features products: fp32 rounding


@pytest.mark.parametrize("reordered", [False, True])
def test_dot_interaction_without_dense_features_is_the_features_pairwise_products(reordered):
    """No dense row (model.dense_in_features=0): [B, F(F-1)/2], each (i < j) pair's dot product in
    row-major order, and autograd's gradient of that direct computation; fed in another row order
    with `positions`, the same."""
    gen = torch.Generator().manual_seed(3)
    features = 5
    sparse = torch.randn(8, features, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    dense = torch.zeros(8, 0, dtype=torch.float64)
    module = DotInteraction(features, dense_row=False)
    if reordered:
        order = torch.randperm(features, generator=gen)  # row r holds the model's feature order[r]
        out = module(dense, sparse[:, order], order.argsort())
    else:
        out = module(dense, sparse)
    rows, cols = torch.triu_indices(features, features, offset=1)
    ref = (sparse[:, rows] * sparse[:, cols]).sum(-1)  # [B, 10]
    assert out.shape == (8, features * (features - 1) // 2)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grad_out = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    (ours,) = torch.autograd.grad(out, sparse, grad_out)
    (theirs,) = torch.autograd.grad(ref, sparse, grad_out)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_a_model_without_dense_features_has_no_bottom_mlp(make_config, interaction):
    """model.dense_in_features=0: dense [B, 0] in, no bottom MLP parameters, the top MLP over the
    interaction of the embeddings alone (dot: F(F-1)/2 products; dcn: the concatenation), and every
    parameter gets a gradient."""
    cfg = make_config(
        "model=tiny", "model.dense_in_features=0", "model.bottom_mlp=[]", f"model.interaction={interaction}"
    )
    cfg.model.check()
    model = build_model(cfg.model, torch.device("cpu"))
    initialize(model, cfg.model, seed=0)
    net = model.model
    assert not [n for n, _ in net.named_parameters() if n.startswith("dense_arch")]
    features = sum(len(t.features) for t in cfg.model.tables)
    width = (
        features * (features - 1) // 2
        if interaction == "dot"
        else sum(t.dim * len(t.features) for t in cfg.model.tables)
    )
    first = next(m for m in net.over_arch.modules() if isinstance(m, torch.nn.Linear))
    assert first.in_features == width
    batch = make_source(cfg).samples("train", 0, 16)
    assert batch.dense_features.shape == (16, 0)
    loss, (_, logits, _) = model(batch)
    assert logits.shape == (16,)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_dot_models_use_the_scatter_free_interaction(make_config):
    net = build_model(make_config("model=tiny").model, torch.device("cpu")).model
    assert isinstance(net.inter_arch, DotInteraction)
    assert net.inter_arch.F == len(net.sparse_arch.sparse_feature_names)


def test_dot_interaction_computes_in_fp32_under_bf16_autocast():
    """Under bf16 autocast the interaction takes its inputs up to fp32 (the bottom MLP's bf16 output
    exactly) and computes as TorchRec's module does in fp32, forward and backward; TorchRec's own
    module would run its bmm in bf16."""
    gen = torch.Generator().manual_seed(1)
    dense = torch.randn(64, 16, generator=gen).bfloat16().requires_grad_()  # what the bottom MLP gives
    sparse = torch.randn(64, 26, 16, generator=gen, requires_grad=True)  # fp32 pooled embeddings
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = DotInteraction(26)(dense, sparse)
    dense32 = dense.detach().float().requires_grad_()
    ref = InteractionArch(26)(dense32, sparse)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)  # the same fp32 dot products of 16 terms
    grad_out = torch.randn(ref.shape, generator=gen)
    ours = torch.autograd.grad(out, (dense, sparse), grad_out)
    theirs = torch.autograd.grad(ref, (dense32, sparse), grad_out)
    assert ours[0].dtype == torch.bfloat16 and ours[1].dtype == torch.float32  # each input's own dtype
    # fp32 sums of ~27 products, the dense one then rounded to bf16 (8 significant bits: 2^-8 relative)
    torch.testing.assert_close(ours[0].float(), theirs[0], rtol=2**-8, atol=2**-8 * theirs[0].abs().max().item())
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["same", "shuffled", "uneven"])
def test_pooled_embeddings_equal_torchrecs_sparse_arch(order):
    """[B, F, D] in the model's feature order, as TorchRec's SparseArch gives it, and its gradient:
    a view of the pooled values when their keys come in that order, each D wide; one gather when a
    sharded collection reorders them; TorchRec's split-and-concatenate when a key is not D wide."""
    names, dim = ["a", "b", "c", "d"], 4
    keys = {"same": names, "shuffled": ["c", "a", "d", "b"], "uneven": names}[order]
    lengths = [dim] * 4 if order != "uneven" else [dim, dim, 2, 2 * dim - 2]  # same total, other split
    values = torch.randn(5, 4 * dim, generator=torch.Generator().manual_seed(0), requires_grad=True)
    pooled = KeyedTensor(keys=keys, length_per_key=lengths, values=values)
    out = pooled_in_order(pooled, names, dim)
    per_feature = pooled.to_dict()
    ref = torch.cat([per_feature[n] for n in names], dim=1).reshape(-1, 4, dim)  # TorchRec's SparseArch
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert (out.data_ptr() == values.data_ptr()) == (order == "same")  # in order: no copy
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (ours,) = torch.autograd.grad(out, values, grad)
    (theirs,) = torch.autograd.grad(ref, values, grad)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_dot_interaction_takes_reordered_features_without_a_gather():
    """sparse rows in another order plus their positions: the same output as the features in order,
    and the same gradients, in the rows' own order (each entry the same dot product of 16 terms; the
    gradients sum the same ~27 terms in another order: fp32 rounding)."""
    gen = torch.Generator().manual_seed(2)
    order = torch.randperm(26, generator=gen)  # sparse row r holds the model's feature order[r]
    dense = torch.randn(64, 16, generator=gen, requires_grad=True)
    reordered = torch.randn(64, 26, 16, generator=gen, requires_grad=True)
    positions = order.argsort()  # the row of each of the model's features
    module = DotInteraction(26)
    out = module(dense, reordered, positions)
    ref = module(dense, reordered[:, positions])
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    grad_out = torch.randn(ref.shape, generator=gen)
    ours = torch.autograd.grad(out, (dense, reordered), grad_out)
    theirs = torch.autograd.grad(ref, (dense, reordered), grad_out)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["same", "shuffled", "uneven"])
def test_pooled_by_key_views_the_collections_order(order):
    """Keys each D wide: a view of the values in the collection's order, with the positions of the
    model's features (None when already in order); other widths: pooled_in_order's [B, F, D]."""
    names, dim = ["a", "b", "c", "d"], 4
    keys = {"same": names, "shuffled": ["c", "a", "d", "b"], "uneven": names}[order]
    lengths = [dim] * 4 if order != "uneven" else [dim, dim, 2, 2 * dim - 2]
    values = torch.randn(5, 4 * dim, generator=torch.Generator().manual_seed(0))
    pooled = KeyedTensor(keys=keys, length_per_key=lengths, values=values)
    features, positions = pooled_by_key(pooled, names, dim)
    if order == "shuffled":
        assert features.data_ptr() == values.data_ptr() and positions.tolist() == [1, 3, 0, 2]
        features = features[:, positions]
    else:
        assert positions is None
    torch.testing.assert_close(features, pooled_in_order(pooled, names, dim), rtol=0, atol=0)


def test_models_use_the_pooled_sparse_arch(make_config):
    for model in ("tiny", "dcn_small"):
        net = build_model(make_config(f"model={model}").model, torch.device("cpu")).model
        assert isinstance(net.sparse_arch, PooledSparseArch)


def _ours_and_torchrecs(make_config, model, reorder_keys=False):
    """Logits and every parameter's gradient from our forward and from TorchRec's DLRM.forward on the
    same net and batch; with `reorder_keys` the collection returns its keys as a sharded one does,
    grouped (here: odd keys first), not in the model's order. Returns (net, ours, theirs)."""
    cfg = make_config(f"model={model}", "data.global_batch_size=8")
    train = build_model(cfg.model, torch.device("cpu"))
    initialize(train, cfg.model, seed=0)
    net = train.model
    if reorder_keys:
        collection = net.sparse_arch.embedding_bag_collection

        class Reordering(torch.nn.Module):
            def forward(self, features):
                per_key = collection(features).to_dict()
                keys = list(per_key)[1::2] + list(per_key)[::2]
                return KeyedTensor.from_tensor_list(keys, [per_key[k] for k in keys])

        net.sparse_arch.embedding_bag_collection = Reordering()
    batch = make_source(cfg).samples("train", 0, 8)
    results = []
    for forward in (net.forward, lambda d, s: DLRM.forward(net, d, s)):
        net.zero_grad()
        logits = forward(batch.dense_features, batch.sparse_features)
        logits.sum().backward()
        results.append((logits.detach(), [p.grad.clone() for p in net.parameters()]))
    return net, results[0], results[1]


@pytest.mark.parametrize("model, cls", [("tiny", LookupFirstDLRM), ("dcn_small", LookupFirstDLRM_DCN)])
def test_lookup_first_forward_equals_torchrecs(make_config, model, cls):
    """The reordered forward computes exactly TorchRec's DLRM forward: same logits, same gradients."""
    net, (ours, ours_grads), (theirs, theirs_grads) = _ours_and_torchrecs(make_config, model)
    assert type(net) is cls
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    for a, b in zip(ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("model", ["tiny", "dcn_small"])
def test_lookup_first_forward_equals_torchrecs_on_reordered_keys(make_config, model):
    """A sharded collection returns its keys grouped by rank: logits and gradients still equal
    TorchRec's forward (the dot interaction reads them in place: fp32 rounding of reordered sums)."""
    _, (ours, ours_grads), (theirs, theirs_grads) = _ours_and_torchrecs(make_config, model, reorder_keys=True)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    for a, b in zip(ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_lookup_starts_before_the_bottom_mlp_and_is_awaited_after(make_config):
    """A sharded collection returns an awaitable (its alltoall in flight): the bottom MLP runs in between."""
    cfg = make_config("model=tiny", "data.global_batch_size=8")
    net = build_model(cfg.model, torch.device("cpu")).model
    initialize(net, cfg.model, seed=0)
    events = []
    collection = net.sparse_arch.embedding_bag_collection

    class Pending(LazyAwaitable[KeyedTensor]):
        def __init__(self, pooled: KeyedTensor) -> None:
            super().__init__()
            self.pooled = pooled

        def _wait_impl(self) -> KeyedTensor:
            events.append("wait")
            return self.pooled

    class Sharded(torch.nn.Module):  # what a sharded collection returns: not yet the embeddings
        def forward(self, features):
            events.append("lookup")
            return Pending(collection(features))

    net.sparse_arch.embedding_bag_collection = Sharded()
    net.dense_arch.register_forward_hook(lambda *_: events.append("bottom MLP"))
    batch = make_source(cfg).samples("train", 0, 8)
    net(batch.dense_features, batch.sparse_features)
    assert events == ["lookup", "bottom MLP", "wait"]
