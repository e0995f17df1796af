"""Managed vocabularies of a model: building them in front of the tables, reading their figures, the
serving form an export traces, and the sizing rule `inspect` can suggest.

The mapping itself (TorchRec's MCH modules, the global admission) is `RemappedEmbeddingBagCollection`.
Notation: N = ids, R = rows of a table.
"""

from __future__ import annotations

import math

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.config import ModelConfig
from dlrm.models.id_remap import RemappedEmbeddingBagCollection, VocabularyRemap

HEADROOM = 1.5  # rows per distinct id a suggested vocabulary gets: room for the ids later days bring


def managed(cfg: ModelConfig) -> bool:
    """Whether any table of `cfg` maps its ids through a managed vocabulary."""
    return any(t.vocabulary.managed for t in cfg.tables)


def with_vocabularies(cfg: ModelConfig, ebc: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`ebc` behind the vocabularies of `cfg` (a RemappedEmbeddingBagCollection), or `ebc` itself when no
    table has one (the model's modules and state-dict keys as before)."""
    if not managed(cfg):
        return ebc
    return RemappedEmbeddingBagCollection(ebc, VocabularyRemap(list(cfg.tables), device))


def vocabulary_remap(model: torch.nn.Module) -> VocabularyRemap | None:
    """The model's VocabularyRemap (plain, sharded or pipelined model alike), or None."""
    return next((m for m in model.modules() if isinstance(m, VocabularyRemap)), None)


def vocabulary_metrics(model: torch.nn.Module) -> dict[str, float]:
    """vocab_<table>_{occupancy,new_ids,evictions,collisions,collision_rate} since the last call ({}
    without vocabularies): occupancy the share of the R - 1 vocabulary rows holding an id, new_ids the
    ids admitted, evictions the admitted ids that took another id's row, collisions the training
    lookups of ids without a row of their own (served by the last row), collision_rate their share."""
    remap = vocabulary_remap(model)
    return remap.metrics() if remap is not None else {}


# --- serving: the mapping as plain tensors, and a module torch.export traces ---------------------------


def serving_vocabularies(model: torch.nn.Module) -> dict[str, dict]:
    """Each vocabulary as plain tensors: {table: {"features": [names], "sorted_ids": [R] int64 (the
    admitted raw ids ascending, free slots 2**63 - 1 last), "rows": [R] int64 (the row of each),
    "unknown_row": R - 1}}. An id equal to sorted_ids[i] (i < R - 1) maps to rows[i]; any other to
    unknown_row. {} without vocabularies."""
    remap = vocabulary_remap(model)
    if remap is None:
        return {}
    out = {}
    for table in remap.tables:
        mch = remap.mch(table)
        out[table] = {
            "features": list(remap.features[table]),
            "sorted_ids": mch._mch_sorted_raw_ids.detach().cpu().clone(),
            "rows": mch._mch_remapped_ids_mapping.detach().cpu().clone(),
            "unknown_row": int(mch.output_size()) - 1,
        }
    return out


class TableVocabulary(torch.nn.Module):
    """One table's frozen vocabulary: forward(ids [N] int64) -> rows [N] int64, as training maps them
    at evaluation. Plain tensor ops (searchsorted, gather, where): torch.export traces it."""

    sorted_ids: torch.Tensor
    rows: torch.Tensor

    def __init__(self, sorted_ids: torch.Tensor, rows: torch.Tensor, unknown_row: int) -> None:
        super().__init__()
        self.register_buffer("sorted_ids", sorted_ids.to(torch.int64))
        self.register_buffer("rows", rows.to(torch.int64))
        self.unknown_row = int(unknown_row)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        searched = self.sorted_ids[:-1]  # the last slot is the unknown ids' row, never an id's
        at = torch.searchsorted(searched, ids).clamp(max=searched.numel() - 1)
        found = searched[at] == ids
        return torch.where(found, self.rows[at], torch.full_like(ids, self.unknown_row))


class ServingVocabularies(torch.nn.Module):
    """Every vocabulary of a trained model, frozen (`serving_vocabularies`): forward(KJT of raw ids) ->
    KJT of rows, the features of tables without a vocabulary unchanged; `tables[name]` maps one
    table's ids (a `TableVocabulary`)."""

    def __init__(self, vocabularies: dict[str, dict]) -> None:
        super().__init__()
        self.tables = torch.nn.ModuleDict(
            {t: TableVocabulary(v["sorted_ids"], v["rows"], v["unknown_row"]) for t, v in vocabularies.items()}
        )
        self.table_of = {f: t for t, v in vocabularies.items() for f in v["features"]}

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        per_key = features.values().split(features.length_per_key())
        values = [
            self.tables[self.table_of[key]](ids) if key in self.table_of else ids  # type: ignore[operator]
            for key, ids in zip(features.keys(), per_key, strict=True)
        ]
        return KeyedJaggedTensor(
            keys=features.keys(),
            values=torch.cat(values) if values else features.values(),
            lengths=features.lengths(),
            weights=features.weights_or_none(),
            stride=features.stride(),
        )


# --- sizing: what `inspect` can suggest for a column ---------------------------------------------------


def expected_collision_rate(distinct: int, rows: int) -> float:
    """The expected share of `distinct` ids, hashed uniformly into `rows` rows, that share their row
    with another id: 1 - (1 - 1/rows)^(distinct - 1)."""
    if distinct <= 1 or rows <= 0:
        return 0.0
    return 1.0 - math.exp((distinct - 1) * math.log1p(-1.0 / rows)) if rows > 1 else 1.0


def suggest_vocabulary(distinct: int, max_id: int | None, kind: str, headroom: float = HEADROOM) -> dict | None:
    """A managed vocabulary for a sparse column, or None where ids should index the table directly.

    Args:
        distinct: distinct values of the column (measured, or estimated for the whole dataset).
        max_id: the largest id (None for strings).
        kind: the column's kind, id | ids | string | strings (data.parquet.sparse[*].kind).
        headroom: rows per distinct value (room for new ids).

    Returns:
        None when the ids are dense enough to index a table of max_id + 1 rows (at most `headroom`
        rows per distinct id); else {"rows": ceil(distinct * headroom) + 1, "vocabulary": {"policy":
        "lfu"}, "reason": one line}: strings and sparse id spaces (63-bit ids, YYMMDDHH hours) get a
        row per value instead of a table sized by the largest id or a modulo that folds them.
    """
    if distinct <= 0:
        return None
    rows = math.ceil(distinct * headroom) + 1
    if kind in ("string", "strings"):
        reason = f"{distinct:,} distinct strings: a row each instead of hashing them modulo the rows"
    elif max_id is None or max_id + 1 > rows:
        largest = "unknown" if max_id is None else f"{max_id:,}"
        reason = f"{distinct:,} distinct ids up to {largest}: a row each instead of a table sized by the largest id"
    else:
        return None
    return {"rows": rows, "vocabulary": {"policy": "lfu"}, "reason": reason}
