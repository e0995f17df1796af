"""The serving module: the trained network over plain tensors, what `torch.export` captures for a bundle.

forward(dense, *sparse) -> probabilities:
    dense   float32 [B, n]  (n = model.dense_in_features; [B, 0] for a model without dense features; a
            Parquet model with data.parquet.dense_transforms: the raw columns, NaN for a missing value)
    sparse  per feature f, in `feature_names` order (the model's tables, then each table's features):
            values int64 [N_f] (the ids of every row, row after row), lengths int64 [B] (ids per row,
            sum = N_f), and for a weighted model (model.weighted) weights float32 [N_f] (one per id)
    returns float32 [B] (one task) or [B, T] (T tasks, in model.tasks order): sigmoid of the logits.

Every input but the values shares the one dynamic batch dimension B; values and lengths are one
KeyedJaggedTensor key's `values()` and `lengths()`.

Hooks (`ServingHooks`, made by `hooks_of`): `dense_transform` maps dense [B, n] -> [B, n] before the
bottom MLP, and `id_remap[table]` maps a feature's values [N_f] -> [N_f] (ids into its table) before
the lookup: a managed vocabulary's frozen map inside the program (the reader passes raw ids), identity
otherwise. A Parquet model's dense transforms run inside the program too (`DenseTransformModule`:
raw [B, n_raw] -> [B, n]); without them the spec says which transform the reader applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn.functional as F
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dlrm.config import ModelConfig, ParquetConfig
from dlrm.models.dlrm import ConcatDCNInteraction, DotInteraction

INT8_LEVELS = 255  # row-wise int8: (x - min) / scale rounded into 0..255, scale = (max - min) / 255


@dataclass
class ServingHooks:
    """The seams of the serving module. dense_transform: dense [B, n] float32 -> [B, n] float32.
    id_remap: {table name: module mapping a feature's values int64 [N] -> ids int64 [N] in [0, rows)}."""

    dense_transform: torch.nn.Module = field(default_factory=torch.nn.Identity)
    id_remap: dict[str, torch.nn.Module] = field(default_factory=dict)
    dense_inputs: int | None = None  # the program's dense width where dense_transform changes it


def hooks_of(net: DLRM, cfg: ModelConfig, parquet: ParquetConfig | None = None) -> ServingHooks:
    """The hooks of the serving module of `net`, built from `cfg` and trained on `parquet`'s columns.

    Returns:
        Hooks whose id_remap holds each managed vocabulary frozen as a `TableVocabulary` (raw ids ->
        table rows, as at evaluation) and identity for the other tables, and whose dense_transform is
        `parquet`'s dense transforms, if any, else identity.
    """
    from dlrm.data.parquet.transform_module import DenseTransformModule
    from dlrm.data.parquet.transforms import DenseTransform
    from dlrm.models.vocabulary import TableVocabulary, serving_vocabularies

    frozen = serving_vocabularies(net)
    id_remap: dict[str, torch.nn.Module] = {t.name: torch.nn.Identity() for t in cfg.tables}
    for table, v in frozen.items():
        id_remap[table] = TableVocabulary(v["sorted_ids"], v["rows"], v["unknown_row"])
    if parquet is None or not parquet.dense_transforms:
        return ServingHooks(torch.nn.Identity(), id_remap)
    transform = DenseTransformModule(DenseTransform(parquet.dense, parquet.dense_transforms))
    return ServingHooks(transform, id_remap, dense_inputs=len(parquet.dense))


def tables_of(net: DLRM) -> EmbeddingBagCollection:
    """The network's EmbeddingBagCollection, behind its vocabularies where it has them."""
    ebc = net.sparse_arch.embedding_bag_collection
    return cast(EmbeddingBagCollection, getattr(ebc, "ebc", ebc))


def feature_names(cfg: ModelConfig) -> list[str]:
    """The sparse features in input order: the tables in order, then each table's features."""
    return [f for t in cfg.tables for f in t.features]


def input_names(cfg: ModelConfig) -> list[str]:
    """Names of the program's inputs, in order: dense, then per feature its values, lengths (and weights)."""
    per = ("values", "lengths", "weights") if cfg.weighted else ("values", "lengths")
    return ["dense"] + [f"{f}.{part}" for f in feature_names(cfg) for part in per]


class Int8RowwiseBag(torch.nn.Module):
    """An embedding bag whose rows are stored row-wise int8 (fbgemm's byte row-wise layout in three
    tensors): row r = codes[r] * scale[r] + bias[r]. forward(values [N], offsets [B + 1], weights [N] |
    None) -> pooled [B, D] float32, the bag of the dequantized rows (sum or mean)."""

    codes: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor

    def __init__(self, weight: torch.Tensor, mode: str) -> None:
        super().__init__()
        w = weight.detach().float()
        low, high = w.min(1).values, w.max(1).values
        scale = ((high - low) / INT8_LEVELS).clamp_min(torch.finfo(torch.float32).tiny)
        codes = torch.round((w - low[:, None]) / scale[:, None]).clamp(0, INT8_LEVELS).to(torch.uint8)
        self.register_buffer("codes", codes)  # [R, D] uint8
        self.register_buffer("scale", scale)  # [R] float32
        self.register_buffer("bias", low)  # [R] float32
        self.mode = mode

    def dequantized(self) -> torch.Tensor:
        """The table as the program sees it, [R, D] float32."""
        return self.codes.float() * self.scale[:, None] + self.bias[:, None]

    def forward(self, values: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        rows = self.codes.index_select(0, values).float() * self.scale[values, None] + self.bias[values, None]
        positions = torch.arange(values.shape[0], device=values.device)
        return F.embedding_bag(
            positions, rows, offsets, mode=self.mode, per_sample_weights=weights, include_last_offset=True
        )


class FloatBag(torch.nn.Module):
    """The trained table as it is (the EmbeddingBag's weight, shared). forward as `Int8RowwiseBag`'s."""

    def __init__(self, bag: torch.nn.EmbeddingBag) -> None:
        super().__init__()
        self.weight, self.mode = bag.weight, bag.mode

    def forward(self, values: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        pooled = F.embedding_bag(
            values, self.weight, offsets, mode=self.mode, per_sample_weights=weights, include_last_offset=True
        )
        return pooled.float()


class ServingModel(torch.nn.Module):
    """The network `net` (a DLRM of this trainer, unsharded, eval mode) over plain tensors: see the
    module docstring for forward's inputs and output. int8: tables stored row-wise int8."""

    def __init__(self, net: DLRM, cfg: ModelConfig, hooks: ServingHooks | None = None, int8: bool = False) -> None:
        super().__init__()
        hooks = hooks or hooks_of(net, cfg)
        ebc = tables_of(net)
        self.features = feature_names(cfg)
        self.table_of = {f: t.name for t in cfg.tables for f in t.features}
        self.weighted, self.tasks = bool(cfg.weighted), len(cfg.tasks)
        bags = {name: cast(torch.nn.EmbeddingBag, bag) for name, bag in ebc.embedding_bags.items()}
        self.bags = torch.nn.ModuleDict(
            {
                t.name: Int8RowwiseBag(bags[t.name].weight, bags[t.name].mode) if int8 else FloatBag(bags[t.name])
                for t in cfg.tables
            }
        )
        self.dense_transform = hooks.dense_transform
        self.dense_inputs = cfg.dense_in_features if hooks.dense_inputs is None else hooks.dense_inputs
        self.id_remap = torch.nn.ModuleDict(
            {t.name: hooks.id_remap.get(t.name, torch.nn.Identity()) for t in cfg.tables}
        )
        self.dense_arch, self.inter_arch, self.over_arch = net.dense_arch, net.inter_arch, net.over_arch
        self.concat = isinstance(net.inter_arch, ConcatDCNInteraction)
        self.dot = isinstance(net.inter_arch, DotInteraction)

    def pooled(self, sparse: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """Each feature's pooled embedding [B, D_f], in feature order."""
        step = 3 if self.weighted else 2
        if len(sparse) != step * len(self.features):
            raise ValueError(f"{len(sparse)} sparse tensors; the model takes {step} for each of {len(self.features)}")
        out = []
        for i, feature in enumerate(self.features):
            values, lengths = sparse[step * i], sparse[step * i + 1]
            weights = sparse[step * i + 2] if self.weighted else None
            table = self.table_of[feature]
            offsets = F.pad(torch.cumsum(lengths, 0), (1, 0))
            out.append(self.bags[table](self.id_remap[table](values), offsets, weights))
        return out

    def forward(self, dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
        pooled = self.pooled(sparse)
        embedded_dense = self.dense_arch(self.dense_transform(dense))
        if self.concat:
            interaction = self.inter_arch(dense_features=embedded_dense, sparse_features=torch.cat(pooled, 1))
        elif self.dot:
            interaction = self.inter_arch(embedded_dense, torch.stack(pooled, 1), None)
        else:
            interaction = self.inter_arch(dense_features=embedded_dense, sparse_features=torch.stack(pooled, 1))
        logits = self.over_arch(interaction).float()
        probabilities = torch.sigmoid(logits)
        return probabilities.squeeze(-1) if self.tasks == 1 else probabilities
