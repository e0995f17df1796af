"""Raw ids -> table rows through managed vocabularies (TorchRec's MCHManagedCollisionModule), in front of
the embedding tables.

`VocabularyRemap` holds one TorchRec MCH module per table with a vocabulary (model.tables[*].vocabulary)
and rewrites a KeyedJaggedTensor's ids of those tables' features into rows. In training each step's
ids are admitted first (MCH `profile`: eviction every step), from the GLOBAL batch: every rank
all-gathers the ids of the vocabulary tables and profiles them all, so the vocabularies are replicated,
identical on every rank, and equal to one process's on the same global batches, whatever the tables'
sharding. Then the ids are mapped (MCH `remap`, a sorted search): an id without a row (not admitted,
or unseen at evaluation) gets the table's last row. The state is plain buffers (the model's state
dict): a checkpoint holds it, and it loads on any world size and plan.

`RemappedEmbeddingBagCollection` is an EmbeddingBagCollection with a `remap` in front of it; it resets
the rows that the vocabulary frees (evicted ids) to their initial values before they serve a new id.
Notation: N = ids of a feature or table in a batch, R = rows of a table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    MCHEvictionPolicy,
    MCHManagedCollisionModule,
)
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

from dlrm.config import TableConfig
from dlrm.config.choices import VocabularyPolicy

EMPTY_ID = torch.iinfo(torch.int64).max  # MCH's mark of a free slot: the one raw id a vocabulary cannot hold


def eviction_policy(table: TableConfig) -> MCHEvictionPolicy:
    """TorchRec's eviction policy of `table.vocabulary` (lfu, lru or distance_lfu)."""
    vocab = table.vocabulary
    if vocab.policy == VocabularyPolicy.lfu:
        return LFU_EvictionPolicy()
    if vocab.policy == VocabularyPolicy.lru:
        return LRU_EvictionPolicy(decay_exponent=vocab.decay_exponent)
    if vocab.policy == VocabularyPolicy.distance_lfu:
        return DistanceLFU_EvictionPolicy(decay_exponent=vocab.decay_exponent)
    raise ValueError(f"table {table.name}: vocabulary policy {vocab.policy} manages no ids")


def managed_collision_module(table: TableConfig, device: torch.device) -> MCHManagedCollisionModule:
    """TorchRec's MCH module of `table`: `table.rows` slots (the last for ids without a row), eviction
    at every profiled step (so no id history lives outside the state dict between steps)."""
    return MCHManagedCollisionModule(
        zch_size=table.rows, device=device, eviction_policy=eviction_policy(table), eviction_interval=1, name=table.name
    )


# --- TorchRec internals (torchrec 1.8 MCHManagedCollisionModule), in one place ---------------------------
# tests/models/test_vocabulary.py::test_mch_internals_are_as_expected fails when a TorchRec release
# changes them. MCH keeps its step count as a Python int read once from `_current_iter_tensor`; a
# checkpoint loads that tensor in place (DCP), so the int is re-read at every profile. Its history
# buffer is sized by the first batch (1.25x): a larger batch later is re-sized, not truncated.


def _prepare_profile(mch: MCHManagedCollisionModule, ids: int) -> None:
    """Before `mch.profile` of `ids` ids: the step count from its state tensor, a history buffer that
    holds them all."""
    mch._current_iter = -1  # re-read from _current_iter_tensor (loaded in place by a checkpoint)
    mch._current_history_buffer_offset = 0  # eviction_interval=1: the history is empty between steps
    if ids > mch._input_history_buffer_size:
        mch._input_history_buffer_size = -1  # re-sized from this batch by profile


def _free_stale_slots(mch: MCHManagedCollisionModule, max_age: int) -> torch.Tensor:
    """Free the slots of ids last seen more than `max_age` steps ago (lru, distance_lfu); their rows [k]."""
    step = int(cast(torch.Tensor, mch._current_iter_tensor).item())
    raw = mch._mch_sorted_raw_ids
    last_seen = mch._mch_metadata["last_access_iter"]
    stale = (raw != EMPTY_ID) & (step - last_seen > max_age)
    rows = mch._mch_remapped_ids_mapping[stale]
    if rows.numel():
        raw[stale] = EMPTY_ID
        for values in mch._mch_metadata.values():
            values[stale] = 0
        mch._sort_mch_buffers()
    return rows


def _size(mch: MCHManagedCollisionModule) -> int:
    """R: the vocabulary's slots, the last for ids without a row."""
    return int(mch._zch_size)


def _set_device(mch: MCHManagedCollisionModule, device: torch.device) -> None:
    """MCH allocates its history on the device it was built for: follow its buffers when moved."""
    mch._device = device


# ----------------------------------------------------------------------------------------------------------


@dataclass
class VocabularyCounts:
    """A table's vocabulary figures since they were last read (`VocabularyRemap.take_counts`)."""

    new_ids: int = 0  # ids admitted (given a row)
    evictions: int = 0  # admitted ids that took the row of another id (the table was full, or its id aged out)
    collisions: int = 0  # ids looked up in training that had no row of their own (the shared last row)
    lookups: int = 0  # ids looked up in training


class VocabularyRemap(torch.nn.Module):
    """Raw ids -> rows for the tables with a managed vocabulary; other features pass unchanged.

    forward(KJT) -> KJT: the same keys, lengths and weights, the vocabulary features' ids replaced by
    rows in [0, R). In training mode the GLOBAL batch's ids are admitted first (an all-gather over
    `group` when a process group of several ranks exists), so every rank holds the same vocabularies.

    Args:
        tables: the model's tables (those with vocabulary.policy none are left out).
        device: where the vocabularies live (the meta device builds them on the CPU: the sharded model
            moves them with its dense part).
    """

    def __init__(self, tables: list[TableConfig], device: torch.device) -> None:
        super().__init__()
        where = torch.device("cpu") if device.type == "meta" else device
        managed = [t for t in tables if t.vocabulary.managed]
        self.tables = torch.nn.ModuleDict({t.name: managed_collision_module(t, where) for t in managed})
        self.features = {t.name: list(t.features) for t in managed}
        self.max_age = {t.name: t.vocabulary.max_age_steps for t in managed}
        self.counts = {t.name: VocabularyCounts() for t in managed}
        self.freed_rows: dict[str, list[torch.Tensor]] = {t.name: [] for t in managed}  # to reset
        self.group: dist.ProcessGroup | None = None  # None: the default group

    def _apply(self, fn, recurse: bool = True):
        module = super()._apply(fn, recurse)
        for table in self.tables:
            mch = self.mch(table)
            _set_device(mch, mch._mch_sorted_raw_ids.device)
        return module

    def mch(self, table: str) -> MCHManagedCollisionModule:
        """The TorchRec module of `table`'s vocabulary."""
        return cast(MCHManagedCollisionModule, self.tables[table])

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        keys = features.keys()
        per_key = list(features.values().long().split(features.length_per_key()))  # raw ids: int64
        where = {key: i for i, key in enumerate(keys)}
        present = {t: [f for f in feats if f in where] for t, feats in self.features.items()}  # keys may be a subset
        local = {t: torch.cat([per_key[where[f]] for f in feats]) for t, feats in present.items() if feats}
        if self.training:
            rows = self._admit_and_map(local)
        else:
            rows = {t: self.map_ids(t, ids) for t, ids in local.items()}
        for table, feats in present.items():
            if not feats:
                continue
            parts = rows[table].split([per_key[where[f]].numel() for f in feats])
            for f, part in zip(feats, parts, strict=True):
                per_key[where[f]] = part
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat(per_key) if per_key else features.values(),
            lengths=features.lengths(),
            weights=features.weights_or_none(),
            stride=features.stride(),
        )

    def map_ids(self, table: str, ids: torch.Tensor) -> torch.Tensor:
        """Raw ids [N] of `table` -> rows [N] int64 (the last row for an id without one); admits nothing."""
        mch, ids = self.mch(table), ids.long()
        return mch.remap({table: JaggedTensor(values=ids, lengths=ids.new_tensor([ids.numel()]))})[table].values()

    def _admit_and_map(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Admit the global batch's ids into every vocabulary, count, and map this rank's ids."""
        everyone, offset = _gather_ids(list(local.values()), self.group)
        rows = {}
        for i, ((table, mine), ids) in enumerate(zip(local.items(), everyone, strict=True)):
            mch = self.mch(table)
            occupied = _occupied(mch)
            _prepare_profile(mch, ids.numel())
            mch.profile({table: JaggedTensor(values=ids, lengths=ids.new_tensor([ids.numel()]))})
            taken = mch.evict()  # rows given to new ids this step (free or evicted)
            counts = self.counts[table]
            if taken is not None and taken.numel():
                counts.new_ids += taken.numel()
                counts.evictions += taken.numel() - (_occupied(mch) - occupied)
                self.freed_rows[table].append(taken)
            age = self.max_age[table]
            if age is not None:
                aged = _free_stale_slots(mch, age)
                if aged.numel():
                    counts.evictions += aged.numel()
                    self.freed_rows[table].append(aged)
            global_rows = self.map_ids(table, ids)
            counts.collisions += int((global_rows == _size(mch) - 1).sum().item())
            counts.lookups += ids.numel()
            rows[table] = global_rows[offset[i] : offset[i] + mine.numel()]
        return rows

    def take_freed_rows(self) -> dict[str, torch.Tensor]:
        """The rows freed or re-assigned since the last call, per table (unique, sorted), then forgotten."""
        out = {t: torch.cat(rows).unique() for t, rows in self.freed_rows.items() if rows}
        for rows in self.freed_rows.values():
            rows.clear()
        return out

    def take_counts(self) -> dict[str, VocabularyCounts]:
        """The figures since the last call, per table, then reset."""
        out = self.counts
        self.counts = {t: VocabularyCounts() for t in out}
        return out

    def occupancy(self) -> dict[str, float]:
        """The share of each table's R - 1 vocabulary rows holding an id."""
        return {t: _occupied(self.mch(t)) / max(1, _size(self.mch(t)) - 1) for t in self.tables}

    def metrics(self) -> dict[str, float]:
        """vocab_<table>_{occupancy,new_ids,evictions,collisions,collision_rate} since the last call
        (the log window's); the same on every rank."""
        record: dict[str, float] = {}
        occupancy = self.occupancy()
        for table, c in self.take_counts().items():
            record[f"vocab_{table}_occupancy"] = occupancy[table]
            record[f"vocab_{table}_new_ids"] = c.new_ids
            record[f"vocab_{table}_evictions"] = c.evictions
            record[f"vocab_{table}_collisions"] = c.collisions
            record[f"vocab_{table}_collision_rate"] = c.collisions / c.lookups if c.lookups else 0.0
        return record


def _occupied(mch: MCHManagedCollisionModule) -> int:
    """Slots holding an id (of the R - 1 a vocabulary has)."""
    return _size(mch) - 1 - int(mch.open_slots().item())


def _gather_ids(local: list[torch.Tensor], group: dist.ProcessGroup | None) -> tuple[list[torch.Tensor], list[int]]:
    """Every rank's ids of each table, in rank order, and where this rank's start in them.

    local: per table this rank's ids [N_t]. Returns (per table the ids of all ranks [sum over ranks of
    N_t], per table position the offset of this rank's ids). Without a process group of several ranks:
    the local ids, offsets 0. Two all-gathers (the sizes, then the ids padded to the largest).
    """
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return local, [0] * len(local)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    mine = torch.cat(local) if local else torch.empty(0, dtype=torch.int64)
    sizes = torch.tensor([ids.numel() for ids in local], dtype=torch.int64, device=mine.device)
    all_sizes = [torch.empty_like(sizes) for _ in range(world)]
    dist.all_gather(all_sizes, sizes, group=group)
    per_rank = torch.stack(all_sizes).cpu()  # [world, T]
    longest = int(per_rank.sum(1).max().item())
    padded = torch.full((longest,), EMPTY_ID, dtype=torch.int64, device=mine.device)
    padded[: mine.numel()] = mine
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    tables: list[list[torch.Tensor]] = [[] for _ in local]
    for r, part in enumerate(parts):
        for t, ids in enumerate(part[: int(per_rank[r].sum())].split(per_rank[r].tolist())):
            tables[t].append(ids)
    offsets = per_rank[:rank].sum(0).tolist() if rank else [0] * len(local)
    return [torch.cat(ids) for ids in tables], [int(o) for o in offsets]


class RemappedEmbeddingBagCollection(torch.nn.Module):
    """An EmbeddingBagCollection (`ebc`, sharded like any) behind a `remap` (VocabularyRemap).

    forward(KJT of raw ids) -> the collection's pooled output of the mapped rows. Rows a vocabulary
    re-assigns (an evicted or aged-out id's) are reset to their initial values (`reset_row`, which the
    model's `initialize` sets) before the lookup, so a new id does not start from another's weights.
    """

    def __init__(self, ebc: torch.nn.Module, remap: VocabularyRemap) -> None:
        super().__init__()
        self.ebc, self.remap = ebc, remap
        self.reset_rows: Callable[[torch.nn.Module, dict[str, torch.Tensor]], None] | None = None

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self.ebc.embedding_bag_configs()  # type: ignore[operator]

    def forward(self, features: KeyedJaggedTensor):
        rows = self.remap(features)
        freed = self.remap.take_freed_rows()
        if freed and self.reset_rows is not None:
            self.reset_rows(self.ebc, freed)
        return self.ebc(rows)
