# long file: the DLRM and DLRM-DCN models with their shared interaction and initialisation
"""The DLRM network, built on the meta device, and its seed-and-name-determined initial weights.

No process group is touched here: once the model is sharded, `initialize` fills every local piece of
every parameter with the values the unsharded model would have.
Notation: B = batch, F = sparse features, D = embedding dim, T = tasks (model.tasks: one logit each).
"""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import (
    DLRM,
    DLRM_DCN,
    DenseArch,
    DLRMTrain,
    InteractionArch,
    InteractionDCNArch,
    OverArch,
    SparseArch,
)
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType, data_type_to_dtype
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from dlrm.config import ModelConfig
from dlrm.models.id_remap import RemappedEmbeddingBagCollection
from dlrm.models.mlp import ReLUMLP
from dlrm.models.vocabulary import with_vocabularies

EMBEDDING_INIT_BLOCK_ROWS = 4096  # the unit of random generation: part of the initial values' definition
INIT_CHUNK_ROWS = 1 << 18  # rows generated at a time when filling a shard: only bounds the memory (on its device)

META = torch.device("meta")  # where models are built: no memory until sharded or filled


# model.embedding_precision -> TorchRec's table data type (fbgemm's weights_precision when sharded).
DATA_TYPES = {"fp32": DataType.FP32, "fp16": DataType.FP16, "bf16": DataType.BF16}
# model.tables[*].pooling_type -> TorchRec's pooling of a bag (fbgemm's pooling mode when sharded).
POOLING_TYPES = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}


def embedding_dtype(cfg: ModelConfig) -> torch.dtype:
    """The table weights' dtype (model.embedding_precision)."""
    return data_type_to_dtype(DATA_TYPES[cfg.embedding_precision])


def embedding_configs(cfg: ModelConfig) -> list[EmbeddingBagConfig]:
    """TorchRec table configs, in the order of `cfg.tables`, stored in model.embedding_precision."""
    return [
        EmbeddingBagConfig(
            name=t.name,
            embedding_dim=t.dim,
            num_embeddings=t.rows,
            feature_names=list(t.features),
            data_type=DATA_TYPES[cfg.embedding_precision],
            pooling=POOLING_TYPES[t.pooling_type],
        )
        for t in cfg.tables
    ]


def build_model(cfg: ModelConfig, device: torch.device = META) -> MultiTaskDLRMTrain:
    """DLRM (dot interaction) or DLRM-DCN wrapped with the tasks' weighted BCE-with-logits loss.

    Args:
        cfg: the model section (tables, MLPs, interaction, tasks).
        device: where tables and MLPs are built; meta by default (no memory until sharding
            materialises the local pieces). The interaction (its index buffer, the DCN cross net) is
            built on CPU whatever `device` is: a meta index buffer would be materialised uninitialised.

    Returns:
        A `MultiTaskDLRMTrain`: forward(batch) -> (loss [], (loss [], logits, labels)), logits and
        labels [B] for one task, [B, T] for T tasks.
    """
    return MultiTaskDLRMTrain(_build_net(cfg, device), [task.weight for task in cfg.tasks])


class MultiTaskDLRMTrain(DLRMTrain):
    """TorchRec's DLRMTrain with T tasks: the network's T logits, loss = sum_t weight_t * BCE_t, each
    BCE_t the mean over the batch of task t's binary cross-entropy with logits.

    forward(batch) -> (loss [], (loss [] detached, logits, labels)). One task: logits and labels [B],
    and with weight 1 exactly TorchRec's DLRMTrain; T > 1 tasks: logits and labels [B, T].
    """

    def __init__(self, dlrm_module: DLRM, weights: list[float]) -> None:
        super().__init__(dlrm_module)
        self.weights = [float(w) for w in weights]

    def forward(self, batch: Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logits = self.model(batch.dense_features, batch.sparse_features)
        labels = batch.labels.float()
        sample_weights = getattr(batch, "weights", None)  # a WeightedBatch's (data.parquet.weight)
        if sample_weights is not None:
            logits = logits.squeeze(-1) if len(self.weights) == 1 else logits
            loss = weighted_task_loss(logits, labels, sample_weights, self.weights, self.training)
        elif len(self.weights) == 1:
            logits = logits.squeeze(-1)
            loss = self.loss_fn(logits, labels)
            if self.weights[0] != 1.0:
                loss = loss * self.weights[0]
        else:
            loss = task_loss(logits, labels, self.weights)
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())


@torch.fx.wrap  # a leaf for torch.fx (TorchRec's pipeline traces the model): it checks shapes
def task_loss(logits: torch.Tensor, labels: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """sum_t weights[t] * mean_b BCE(logits[b, t], labels[b, t]): logits, labels [B, T] -> [] fp32.

    Raises:
        ValueError: labels and logits differ in shape.
    """
    if labels.shape != logits.shape:
        raise ValueError(
            f"labels {tuple(labels.shape)} do not match the {len(weights)} tasks' logits {tuple(logits.shape)}"
        )
    per_task = F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="none").mean(0)  # [T]
    loss = per_task[0] * weights[0]
    for t in range(1, len(weights)):
        loss = loss + per_task[t] * weights[t]
    return loss


@torch.fx.wrap  # a leaf for torch.fx, as task_loss: it may all-reduce
def weighted_task_loss(
    logits: torch.Tensor, labels: torch.Tensor, sample_weights: torch.Tensor, weights: list[float], training: bool
) -> torch.Tensor:
    """sum_t weights[t] * sum_b w_b BCE(logits[b, t], labels[b, t]) / (S / W), the weighted mean of the
    rows' losses over the global batch.

    S is the sum of w over the global batch (all W ranks' slices, one all-reduce when `training` in a
    process group of W > 1; this slice's otherwise), so the ranks' mean loss, and DDP's mean gradient,
    are one process's on the global batch. A batch whose weights are all 0 has loss 0.

    Args:
        logits: [B] or [B, T].
        labels: the same shape as `logits`.
        sample_weights: w [B], each row's weight.
        weights: the T tasks' weights.
        training: all-reduce S across the process group.

    Returns:
        The loss [] fp32.

    Raises:
        ValueError: labels and logits differ in shape.
    """
    if labels.shape != logits.shape:
        raise ValueError(
            f"labels {tuple(labels.shape)} do not match the {len(weights)} tasks' logits {tuple(logits.shape)}"
        )
    w = sample_weights.float().reshape(-1, 1)
    per_row = F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="none").reshape(len(w), -1)
    total = w.sum()
    world = dist.get_world_size() if training and dist.is_available() and dist.is_initialized() else 1
    if world > 1:
        total = total.detach().clone()
        dist.all_reduce(total)
    per_task = (per_row * w).sum(0) * world / total.clamp_min(torch.finfo(torch.float32).tiny)  # [T]
    loss = per_task[0] * weights[0]
    for t in range(1, len(weights)):
        loss = loss + per_task[t] * weights[t]
    return loss


def compile_dense(model: DLRMTrain, backend: str = "inductor") -> None:
    """Compile the bottom MLP, the interaction and the top MLP in place (`nn.Module.compile`: same
    parameters and state-dict keys), each at its first call; the sparse arch (TorchRec's sharded
    lookup and its awaitables) stays eager.

    Args:
        model: the model to compile in place.
        backend: torch.compile's backend; the trainer uses Inductor.
    """
    net = model.model
    for part in (net.dense_arch, net.inter_arch, net.over_arch):
        part.compile(backend=backend)


def _build_net(cfg: ModelConfig, device: torch.device) -> DLRM:
    ebc = EmbeddingBagCollection(tables=embedding_configs(cfg), is_weighted=cfg.weighted, device=device)
    # TorchRec's unsharded bags are fp32 for DataType.FP32 and fp16 for any other type; store them in
    # the configured dtype (bf16 included), as the sharded kernels do, so state dicts agree.
    ebc.embedding_bags.to(embedding_dtype(cfg))
    # ebc itself when no table has a managed vocabulary, else a RemappedEmbeddingBagCollection (its
    # embedding_bag_configs and forward are what the sparse arch calls)
    collection = cast(EmbeddingBagCollection, with_vocabularies(cfg, ebc, device))
    if cfg.dense_in_features == 0:
        net = _sparse_only(cfg, collection, device)
        top = cast(torch.nn.Sequential, net.over_arch.model)
        top[0] = relu_mlp_like(top[0], device)
        return net
    common: dict[str, Any] = dict(
        embedding_bag_collection=ebc,
        dense_in_features=cfg.dense_in_features,
        dense_arch_layer_sizes=list(cfg.bottom_mlp),
        over_arch_layer_sizes=list(cfg.top_mlp),
        dense_device=device,
    )
    if cfg.interaction == "dcn" and any(t.dim != cfg.bottom_mlp[-1] for t in cfg.tables):
        net = _concat_dcn(cfg, collection, device)
    elif cfg.interaction == "dcn":
        net = LookupFirstDLRM_DCN(dcn_num_layers=cfg.dcn_num_layers, dcn_low_rank_dim=cfg.dcn_low_rank_dim, **common)
    else:
        net = LookupFirstDLRM(**common)
        net.inter_arch = DotInteraction(num_sparse_features=net.inter_arch.F)
    net.sparse_arch = PooledSparseArch(collection)
    net.dense_arch.model = relu_mlp_like(net.dense_arch.model, device)
    top = cast(torch.nn.Sequential, net.over_arch.model)  # TorchRec's: the ReLU MLP, then the last Linear
    top[0] = relu_mlp_like(top[0], device)
    return net


def _concat_dcn(cfg: ModelConfig, ebc: EmbeddingBagCollection, device: torch.device) -> LookupFirstDLRM_DCN:
    """DLRM-DCN whose widths differ (tables of several dims, or a bottom MLP of another width): TorchRec's
    modules and state-dict keys, the cross net and the top MLP over the concatenation of the bottom
    MLP's output and every feature's pooled vector (`ConcatDCNInteraction`), as TorchRec's DLRM_DCN is
    for equal widths; built without TorchRec's DLRM constructor, which asserts one dim."""
    width = cfg.bottom_mlp[-1] + sum(t.dim * len(t.features) for t in cfg.tables)
    net = LookupFirstDLRM_DCN.__new__(LookupFirstDLRM_DCN)
    torch.nn.Module.__init__(net)
    net._cuda_graph_enabled = False
    net.sparse_arch = PooledSparseArch(ebc)
    net.dense_arch = DenseArch(in_features=cfg.dense_in_features, layer_sizes=list(cfg.bottom_mlp), device=device)
    crossnet = LowRankCrossNet(in_features=width, num_layers=cfg.dcn_num_layers, low_rank=cfg.dcn_low_rank_dim)
    features = len(net.sparse_arch.sparse_feature_names)
    net.inter_arch = ConcatDCNInteraction(num_sparse_features=features, crossnet=crossnet)
    net.over_arch = OverArch(in_features=width, layer_sizes=list(cfg.top_mlp), device=device)
    return net


def _sparse_only(cfg: ModelConfig, ebc: EmbeddingBagCollection, device: torch.device) -> DLRM:
    """A DLRM without dense features (model.dense_in_features=0): no bottom MLP (`NoDenseArch`), the
    interaction over the pooled embeddings alone: dot, their F(F-1)/2 pairwise products; dcn, the cross
    net over their concatenation. TorchRec's modules and keys otherwise, built without TorchRec's DLRM
    constructor, which requires a bottom MLP."""
    sparse_arch = PooledSparseArch(ebc)
    features = len(sparse_arch.sparse_feature_names)
    net: DLRM
    if cfg.interaction == "dcn":
        width = sum(t.dim * len(t.features) for t in cfg.tables)
        crossnet = LowRankCrossNet(in_features=width, num_layers=cfg.dcn_num_layers, low_rank=cfg.dcn_low_rank_dim)
        net = LookupFirstDLRM_DCN.__new__(LookupFirstDLRM_DCN)
        torch.nn.Module.__init__(net)
        net.inter_arch = ConcatDCNInteraction(num_sparse_features=features, crossnet=crossnet)
    else:
        width = features * (features - 1) // 2
        net = LookupFirstDLRM.__new__(LookupFirstDLRM)
        torch.nn.Module.__init__(net)
        net.inter_arch = DotInteraction(num_sparse_features=features, dense_row=False)
    net._cuda_graph_enabled = False
    net.sparse_arch = sparse_arch
    net.dense_arch = NoDenseArch()  # type: ignore[assignment]  # no DenseArch: nothing to take
    net.over_arch = OverArch(in_features=width, layer_sizes=list(cfg.top_mlp), device=device)
    return net


class NoDenseArch(torch.nn.Module):
    """The bottom MLP of a model without dense features: dense [B, 0] -> the same [B, 0]."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features


class ConcatDCNInteraction(InteractionDCNArch):
    """TorchRec's DCN interaction over features of any widths: forward(dense [B, Dd], sparse
    [B, sum of the features' dims]) -> crossnet([dense, sparse]) [B, Dd + sum]. For equal widths the
    same as InteractionDCNArch of dense and sparse viewed [B, F, D]."""

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        return self.crossnet(torch.cat((dense_features, sparse_features), dim=1))


def relu_mlp_like(mlp: torch.nn.Module, device: torch.device) -> ReLUMLP:
    """A `ReLUMLP` with the layer sizes of TorchRec's ReLU `mlp` (the same state-dict keys)."""
    layers = [m for m in mlp.modules() if isinstance(m, torch.nn.Linear)]
    return ReLUMLP(layers[0].in_features, [layer.out_features for layer in layers], device=device)


@torch.fx.wrap  # a leaf for torch.fx: TorchRec's pipeline traces the model, and the keys are known at run time
def pooled_in_order(pooled: KeyedTensor, names: list[str], dim: int) -> torch.Tensor:
    """The pooled embeddings [B, F, D] of `pooled`, features in the order `names`, as TorchRec's SparseArch
    gives them. Each key D wide: a view of its values [B, F * D] when the keys come in that order (one
    rank, and shardings that keep the order), else one gather of the features (a sharded collection
    groups them by rank). Keys of other widths: TorchRec's split by feature and concatenation.
    """
    values = pooled.values()
    keys = pooled.keys()
    if pooled.length_per_key() == [dim] * len(names):  # as many keys as names, each D wide
        features = values.view(values.shape[0], len(names), dim)
        if keys == names:
            return features
        return features.index_select(1, _positions(tuple(keys), tuple(names), values.device))
    per_feature = pooled.to_dict()
    return torch.cat([per_feature[name] for name in names], dim=1).view(-1, len(names), dim)


@torch.fx.wrap  # a leaf for torch.fx, as pooled_in_order
def pooled_by_key(pooled: KeyedTensor, names: list[str], dim: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The pooled embeddings of `names` without reordering them, for `DotInteraction`: no gather.

    Returns:
        (pooled [B, F, D] in the collection's key order, positions [F] int64 of `names` in it), with
        positions None when the keys are already in that order; keys of other widths than D give
        (`pooled_in_order`, None).
    """
    values, keys = pooled.values(), pooled.keys()
    if keys != names and pooled.length_per_key() == [dim] * len(names):
        return values.view(values.shape[0], len(names), dim), _positions(tuple(keys), tuple(names), values.device)
    return pooled_in_order(pooled, names, dim), None


@torch.fx.wrap  # a leaf for torch.fx, as pooled_in_order
def pooled_concat(pooled: KeyedTensor, names: list[str]) -> torch.Tensor:
    """The pooled embeddings of `names` side by side, [B, sum of their widths] (features of any widths):
    the collection's values when the keys come in that order, else TorchRec's split and concatenation."""
    if pooled.keys() == names:
        return pooled.values()
    per_feature = pooled.to_dict()
    return torch.cat([per_feature[name] for name in names], dim=1)


@functools.lru_cache(maxsize=64)
def _positions(keys: tuple[str, ...], names: tuple[str, ...], device: torch.device) -> torch.Tensor:
    """[F] int64: the position in `keys` of each of `names`."""
    where = {key: i for i, key in enumerate(keys)}
    return torch.tensor([where[name] for name in names], device=device)


class PooledSparseArch(SparseArch):
    """TorchRec's SparseArch, same output [B, F, D], without splitting the pooled embeddings by feature
    and concatenating them again (see `pooled_in_order`: a view, or one gather when reordered)."""

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return pooled_in_order(self.embedding_bag_collection(features), self.sparse_feature_names, self.D)


def lookup_first_forward(net: DLRM, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
    """TorchRec's DLRM forward, with the embedding lookup started before the bottom MLP and awaited after.

    A sharded collection returns an awaitable whose alltoall is in flight while the bottom MLP
    computes. In the backward pass autograd (latest forward op first) then issues the gradients'
    alltoall before the bottom MLP's backward and waits for it after. Same operations, same result.
    dense [B, dense_in], sparse KJT -> logits [B, T].
    """
    sparse = net.sparse_arch
    pooled = sparse.embedding_bag_collection(sparse_features)
    embedded_dense = net.dense_arch(dense_features)
    if isinstance(net.inter_arch, DotInteraction):  # takes the features in the collection's order
        by_key = pooled_by_key(pooled, sparse.sparse_feature_names, sparse.D)
        interaction = net.inter_arch(embedded_dense, by_key[0], by_key[1])
    elif isinstance(net.inter_arch, ConcatDCNInteraction):  # features of several widths, side by side
        embedded_sparse = pooled_concat(pooled, sparse.sparse_feature_names)
        interaction = net.inter_arch(dense_features=embedded_dense, sparse_features=embedded_sparse)
    else:
        embedded_sparse = pooled_in_order(pooled, sparse.sparse_feature_names, sparse.D)
        interaction = net.inter_arch(dense_features=embedded_dense, sparse_features=embedded_sparse)
    return net.over_arch(interaction)


class LookupFirstDLRM(DLRM):
    """TorchRec's DLRM (dot interaction), lookup first: see `lookup_first_forward`."""

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        return lookup_first_forward(self, dense_features, sparse_features)


class LookupFirstDLRM_DCN(DLRM_DCN):
    """TorchRec's DLRM-DCN, lookup first: see `lookup_first_forward`."""

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        return lookup_first_forward(self, dense_features, sparse_features)


class _DotInteraction(torch.autograd.Function):
    """[dense, upper triangle of C C^T] with C = [dense; sparse]: dense [B, D], sparse [B, F, D] ->
    [B, D + P], P = n(n-1)/2, n = F + 1; the triangle row-major, diagonal excluded.

    Forward: one bmm, then a gather of the triangle's columns of the flattened [B, n * n] product.
    Backward, one gather and one product: the symmetric [B, n, n] matrix S with S[i, j] = S[j, i] =
    g[D + (i, j)] (the gradient of the triangle) is gathered straight from the output's gradient
    g [B, D + P] with the fixed `mirror` index, its diagonal zeroed, then grad C = S C.
    """

    @staticmethod
    def forward(
        ctx, dense: torch.Tensor, sparse: torch.Tensor, upper: torch.Tensor, mirror: torch.Tensor
    ) -> torch.Tensor:
        ctx.dense_row = dense.shape[1] > 0  # dense [B, 0]: no dense features, C = sparse, n = F
        combined = torch.cat((dense.unsqueeze(1), sparse), dim=1) if ctx.dense_row else sparse  # [B, n, D]
        products = torch.bmm(combined, combined.transpose(1, 2))  # [B, n, n]
        ctx.save_for_backward(combined, mirror + dense.shape[1])  # columns of the output's gradient
        return torch.cat((dense, products.flatten(1).index_select(1, upper)), dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        combined, mirror = ctx.saved_tensors
        batch, n, dim = combined.shape
        sym = grad.index_select(1, mirror)  # [B, n * n]
        sym[:, :: n + 1] = 0  # the diagonal (gathered from an arbitrary column)
        grad_combined = torch.bmm(sym.view(batch, n, n), combined)  # [B, n, D]
        if not ctx.dense_row:
            return grad[:, :0], grad_combined, None, None
        grad_dense = grad_combined[:, 0] + grad[:, :dim]
        return grad_dense, grad_combined[:, 1:], None, None


class DotInteraction(InteractionArch):
    """TorchRec's dot interaction, same output, with a backward free of scatters, always in fp32.

    forward(dense [B, D], sparse [B, F, D], positions [F] | None) -> [B, D + F + F(F-1)/2] fp32: the
    dense vector, then the upper triangle (row-major, diagonal excluded) of the pairwise dot products
    of [dense; sparse]. With `positions` the model's feature i is sparse row positions[i] (the order a
    sharded collection returns, `pooled_by_key`): the same output as for sparse[:, positions], from
    reordered index buffers instead of a gather of the features.

    Under bf16 autocast the interaction still computes in fp32 (its inputs cast up: the bottom MLP's
    bf16 output exactly, the fp32 embeddings unchanged); the top MLP casts the output once.

    `dense_row=False` (a model without dense features): forward(dense [B, 0], sparse [B, F, D]) ->
    [B, F(F-1)/2], the pairwise products of the features alone.
    """

    def __init__(self, num_sparse_features: int, dense_row: bool = True) -> None:
        super().__init__(num_sparse_features)
        self.dense_row = dense_row
        n = self.F + dense_row
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.register_buffer("upper", rows * n + cols, persistent=False)  # (i, j), i < j, in [B, n * n]
        # The triangle's column holding (min(i, j), max(i, j)), at mirror[i * n + j]; the diagonal
        # takes column 0 (any column: backward zeroes it).
        position = torch.zeros(n, n, dtype=torch.long)
        triangle = torch.arange(rows.numel())
        position[rows, cols] = triangle
        position[cols, rows] = triangle
        self.register_buffer("mirror", position.flatten(), persistent=False)

    def forward(
        self, dense_features: torch.Tensor, sparse_features: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        upper, mirror = (self.upper, self.mirror) if positions is None else self._reordered(positions)
        with torch.autocast(dense_features.device.type, enabled=False):
            dtype = torch.promote_types(torch.promote_types(dense_features.dtype, sparse_features.dtype), torch.float32)
            dense, sparse = dense_features.to(dtype), sparse_features.to(dtype)
            return _DotInteraction.apply(dense, sparse, upper, mirror)

    def _reordered(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`upper` and `mirror` for [dense; sparse] whose row 1 + positions[i] holds the model's feature i
        (row positions[i] without a dense row)."""
        n = self.F + self.dense_row
        upper, mirror = self.get_buffer("upper"), self.get_buffer("mirror")
        row = torch.cat((positions.new_zeros(1), positions + 1)) if self.dense_row else positions  # [n]
        model_row = row.argsort()  # [n]: the model's row of each row
        # the products are symmetric: (row i, row j) in either order
        return row[upper // n] * n + row[upper % n], mirror.view(n, n)[model_row][:, model_row].flatten()


CPU = torch.device("cpu")


def _generator(seed: int, *names: object, device: torch.device = CPU) -> torch.Generator:
    digest = hashlib.blake2b(repr((seed,) + names).encode(), digest_size=8).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest, "little") >> 1)


def table_rows_init(
    seed: int, table: str, rows: int, dim: int, start: int, stop: int, device: torch.device = CPU
) -> torch.Tensor:
    """Rows [start, stop) of a table's initial weights, U(-1/sqrt(rows), 1/sqrt(rows)): [stop-start, D] fp32.

    Values are generated per block of EMBEDDING_INIT_BLOCK_ROWS rows from (seed, table, block), so a
    shard is produced without materialising the table, and identically on any sharding. They are
    generated on `device` by its own generator: the same for any world size on one kind of device
    (a CUDA generator's stream differs from the CPU's, so CPU and GPU runs start differently).
    """
    bound = math.sqrt(1.0 / rows)
    block = EMBEDDING_INIT_BLOCK_ROWS
    pieces = []
    for b in range(start // block, (stop - 1) // block + 1):
        lo, hi = b * block, min((b + 1) * block, rows)
        values = torch.rand(hi - lo, dim, generator=_generator(seed, "table", table, b, device=device), device=device)
        pieces.append(values[max(start, lo) - lo : min(stop, hi) - lo])
    return torch.cat(pieces) * (2 * bound) - bound


def dense_init(seed: int, name: str, shape: tuple[int, ...], std: float, device: torch.device = CPU) -> torch.Tensor:
    """A dense parameter's initial value, N(0, std^2), from (seed, name) alone, generated on `device`."""
    return torch.randn(shape, generator=_generator(seed, "dense", name, device=device), device=device) * std


def initialize(model: torch.nn.Module, cfg: ModelConfig, seed: int) -> None:
    """Overwrite every local parameter with its value in the unsharded model seeded by `seed`.

    Works on the plain model and on a DistributedModelParallel one alike: tables sharded into
    ShardedTensors get each local shard's rows and columns; replicated tensors get the whole value.
    As the DLRM reference: matrices [out, in] ~ N(0, 2 / (out + in)) (Xavier), a layer's bias
    [out] ~ N(0, 1 / out); biases without a sibling weight (the DCN cross net's) start at zero.
    Values are generated where each piece lives (the training device: no host copy), in fp32, and
    rounded to the piece's dtype (model.embedding_precision for the tables).
    """
    tables: dict[str, tuple[int, int]] = {t.name: (t.rows, t.dim) for t in cfg.tables}
    for module in model.modules():
        if isinstance(module, RemappedEmbeddingBagCollection):
            module.reset_rows = functools.partial(reset_rows, tables=tables, seed=seed)
    state = model.state_dict()
    with torch.no_grad():
        for name, value in state.items():
            if ".remap.tables." in name:  # a vocabulary's state (dlrm.models.id_remap): built as it starts
                continue
            table = _table_of(name, tables)
            if table is not None:
                rows, dim = tables[table]
                for shard, (r0, c0), (nr, nc) in local_pieces(value):
                    for lo in range(0, nr, INIT_CHUNK_ROWS):  # bounded memory for huge shards
                        hi = min(lo + INIT_CHUNK_ROWS, nr)
                        full_rows = table_rows_init(seed, table, rows, dim, r0 + lo, r0 + hi, shard.device)
                        shard[lo:hi].copy_(full_rows[:, c0 : c0 + nc])
                continue
            local = value.to_local() if isinstance(value, DTensor) else value
            shape = tuple(local.shape)
            if local.dim() == 2:
                local.copy_(dense_init(seed, name, shape, math.sqrt(2.0 / sum(shape)), local.device))
            elif name.endswith("bias") and name[: -len("bias")] + "weight" in state:
                local.copy_(dense_init(seed, name, shape, math.sqrt(1.0 / shape[0]), local.device))
            else:
                local.zero_()


def reset_rows(
    ebc: torch.nn.Module, freed: dict[str, torch.Tensor], tables: dict[str, tuple[int, int]], seed: int
) -> None:
    """Set rows `freed[table]` ([k] int64) of `ebc`'s tables back to their initial values.

    Args:
        ebc: an embedding bag collection, plain or sharded (the pieces this rank holds are set).
        freed: per table name, the rows a vocabulary gave to new ids, [k] int64.
        tables: per table name, (rows, dim).
        seed: the model's seed (`table_rows_init`).
    """
    with torch.no_grad():
        for name, value in ebc.state_dict().items():
            table = _table_of(name, tables)
            if table is None or table not in freed:
                continue
            rows, dim = tables[table]
            for shard, (r0, c0), (nr, nc) in local_pieces(value):
                wanted = freed[table].to(shard.device)
                wanted = wanted[(wanted >= r0) & (wanted < r0 + nr)]
                block = EMBEDDING_INIT_BLOCK_ROWS
                for b in wanted.div(block, rounding_mode="floor").unique().tolist():
                    lo, hi = b * block, min((b + 1) * block, rows)
                    in_block = wanted[(wanted >= lo) & (wanted < hi)]
                    values = table_rows_init(seed, table, rows, dim, lo, hi, shard.device)
                    shard[in_block - r0] = values[in_block - lo, c0 : c0 + nc].to(shard.dtype)


def _table_of(param_name: str, tables: dict[str, tuple[int, int]]) -> str | None:
    """'...embedding_bags.<table>.weight' -> '<table>', else None."""
    parts = param_name.split(".")
    if len(parts) >= 3 and parts[-1] == "weight" and parts[-3] == "embedding_bags" and parts[-2] in tables:
        return parts[-2]
    return None


def local_pieces(value):
    """(local tensor, (row offset, col offset), (rows, cols)) for each piece this rank holds."""
    if isinstance(value, ShardedTensor):
        for shard in value.local_shards():
            md = shard.metadata
            yield shard.tensor, tuple(md.shard_offsets), tuple(md.shard_sizes)
    elif isinstance(value, DTensor):
        raise TypeError("DTensor embedding tables are not supported; TorchRec should emit ShardedTensor")
    else:
        yield value, (0, 0), tuple(value.shape)
