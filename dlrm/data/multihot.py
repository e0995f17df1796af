"""KeyedJaggedTensors of fixed-length features, and MLPerf DLRM-DCNv2's multi-hot expansion, as torch ops.

Every feature f has a fixed number of ids per sample (its pooling P_f), so a batch's lengths,
offsets and per-key sizes depend only on the batch size: `MultiHotLayout` makes them once, on the
device, and `kjt(base)` builds each batch's KJT from one base id per (feature, sample) without a
device synchronisation (the KJT is handed every size it would otherwise compute with `.tolist()`).
Multi-hot ids follow MLPerf DLRM-DCNv2's synthesis of multi-hot Criteo: id j of feature f is
(base + offsets[f][j]) mod rows[f], offsets[f][0] = 0, with offsets fixed for the dataset.
`BaseIdBatch` carries the base ids only and expands them when moved to a device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

_INT32_MAX = torch.iinfo(torch.int32).max
_HOST_BLOCK = 1 << 18  # values per block of the host expansion: 1 MiB of int32, about a core's L2


class MultiHotLayout:
    """The constant parts of a KJT of `count` samples, fixed ids per feature, and the expansion.

    Args:
        keys: feature names, in KJT order.
        rows: rows of the table behind each feature (ids are below it).
        offsets: per feature, its P_f offsets, the first 0, each in [0, rows[f]).
        count: samples per batch (B).
        device: where the constants live and batches are built.

    Values are key-major (all of feature 0, then feature 1, ...), each sample's P_f ids contiguous;
    int32 when every table fits (fbgemm takes int32 indices), else int64. lengths and offsets are
    int32 [F * B] and [F * B + 1], made once and shared (read-only) by every batch.
    """

    def __init__(
        self,
        keys: Sequence[str],
        rows: Sequence[int],
        offsets: Sequence[Sequence[int]],
        count: int,
        device: torch.device,
    ) -> None:
        self.keys, self.count = list(keys), count
        rows = [int(r) for r in rows]
        pooling = [len(o) for o in offsets]
        if len(rows) != len(self.keys) or len(pooling) != len(self.keys) or min(pooling, default=1) < 1:
            raise ValueError(f"one row count and at least one offset per key: {len(self.keys)} keys")
        top = max(rows, default=1)
        self.id_dtype = torch.int32 if top <= _INT32_MAX else torch.int64
        # base + offset < 2 * rows: int32 arithmetic below 2**30 rows
        self._sum_dtype = torch.int32 if 2 * top <= _INT32_MAX else torch.int64
        # Made on the host and moved by blocking copies: complete before any CUDA stream reads them.
        per_sample = torch.tensor(pooling, dtype=torch.int32).repeat_interleave(count)
        self.lengths = per_sample.to(device)
        starts = torch.cat([torch.zeros(1, dtype=torch.int32), per_sample.cumsum(0, dtype=torch.int32)])
        self.offsets = starts.to(device)
        self.length_per_key = [count * p for p in pooling]
        self.offset_per_key = [0, *np.cumsum(self.length_per_key).tolist()]
        self.multi_hot = max(pooling, default=1) > 1
        self._host_shifted = [
            np.asarray([int(o) - r for o in offs], np.int64) for offs, r in zip(offsets, rows, strict=True)
        ]
        self._rows = rows
        if self.multi_hot:
            # id j of feature f, sample b: base[f, b] + offsets[f][j] - rows[f], plus rows[f] if negative
            self._shifted = [
                torch.tensor([int(o) - r for o in offs]).to(self._sum_dtype).to(device)
                for offs, r in zip(offsets, rows, strict=True)
            ]
            self._total = count * sum(pooling)
            self._offset_lists = [list(o) for o in offsets]
            # A GPU's expansion reads constants per value: made now (a host only makes them if asked).
            self._per_value = None if torch.device(device).type == "cpu" else self._values_constants(device)

    def kjt(self, base: torch.Tensor) -> KeyedJaggedTensor:
        """The batch's KJT from its base ids [F, B] (any integer dtype and strides, on the device)."""
        return self.kjt_of_values(self.expand(base))

    def kjt_of_values(self, values: torch.Tensor) -> KeyedJaggedTensor:
        """The batch's KJT from its key-major values (`expand` or `expand_host`)."""
        return KeyedJaggedTensor(
            keys=self.keys,
            values=values,
            lengths=self.lengths,
            offsets=self.offsets,
            stride=self.count,
            length_per_key=self.length_per_key,
            offset_per_key=self.offset_per_key,
        )

    def expand(self, base: torch.Tensor) -> torch.Tensor:
        """Base ids [F, B] -> key-major values [sum(P) * B] of the layout's id dtype.

        Each base id is repeated P_f times, its offsets added, then wrapped into [0, rows) without
        branches; one-hot: one copy. On a GPU a fixed handful of kernels for any number of features;
        on the host per feature, in cache-sized blocks.
        """
        if not self.multi_hot:
            out = torch.empty(base.shape, dtype=self.id_dtype, device=base.device)
            return out.copy_(base).reshape(-1)
        base = base.to(self._sum_dtype)
        if base.device.type == "cpu":
            values = torch.empty(self._total, dtype=self._sum_dtype)
            self._expand_blocks(base, values)
        else:
            values = self._expand_gathered(base)
        return values if values.dtype == self.id_dtype else values.to(self.id_dtype)

    def _expand_gathered(self, base: torch.Tensor) -> torch.Tensor:
        """`expand` of base ids [F, B] (the sum dtype, on the layout's device) over all values at once:
        a repeat of each base id P_f times (sizes known: no device synchronisation), one add of every
        value's offset minus rows, one wrap. A fixed handful of kernels for any number of features."""
        if self._per_value is None:
            self._per_value = self._values_constants(base.device)
        shifted, limit = self._per_value
        values = torch.repeat_interleave(base.reshape(-1), self.lengths, output_size=self._total)
        values += shifted
        wrap = values >> (8 * values.element_size() - 1)  # -1 where negative, else 0
        values += wrap.bitwise_and_(limit)
        return values

    def _values_constants(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """Per value, as `expand` lays them out: its offset minus its table's rows, and those rows."""
        pairs = list(zip(self._offset_lists, self._rows, strict=True))
        shifted = torch.cat([torch.tensor([int(o) - r for o in offs]).repeat(self.count) for offs, r in pairs])
        limit = torch.cat([torch.full((self.count * len(offs),), r, dtype=torch.int64) for offs, r in pairs])
        return shifted.to(self._sum_dtype).to(device), limit.to(self._sum_dtype).to(device)

    def _expand_blocks(self, base: torch.Tensor, values: torch.Tensor) -> None:
        """`expand` on the host into `values`: per feature, blocks of samples whose ids fit in cache,
        each added, then wrapped (plus rows where negative) through a small scratch buffer."""
        shift = 8 * values.element_size() - 1
        scratch = torch.empty(min(_HOST_BLOCK, self._total), dtype=values.dtype)
        start = 0
        for f, (shifted, rows) in enumerate(zip(self._shifted, self._rows, strict=True)):
            p = shifted.numel()
            out = values[start : start + self.count * p]
            start += self.count * p
            if p == 1:  # offset 0: the base id itself, already below rows
                out.copy_(base[f])
                continue
            step = max(1, _HOST_BLOCK // p)  # samples per block
            for first in range(0, self.count, step):
                n = min(step, self.count - first)
                block = out[first * p : (first + n) * p]
                torch.add(base[f, first : first + n, None], shifted, out=block.view(n, p))
                wrap = torch.bitwise_right_shift(block, shift, out=scratch[: n * p])  # -1 where negative
                block += wrap.bitwise_and_(rows)

    def expand_host(self, ids: np.ndarray) -> torch.Tensor:
        """`expand` of base ids [B, F] (sample-major, as files hold them) in numpy, on one thread.

        Returns:
            The same key-major values [sum(P) * B] as `expand`, on the host.
        """
        dtype = np.int32 if self._sum_dtype == torch.int32 else np.int64
        ids = ids.astype(dtype, copy=False)
        count = ids.shape[0]
        values = np.empty(count * sum(s.size for s in self._host_shifted), dtype)
        scratch = np.empty(min(_HOST_BLOCK, values.size), dtype)
        shift = 8 * values.itemsize - 1
        start = 0
        for f, (shifted, rows) in enumerate(zip(self._host_shifted, self._rows, strict=True)):
            p = shifted.size
            out = values[start : start + count * p]
            start += count * p
            if p == 1:  # offset 0: the base id itself
                out[:] = ids[:, f]
                continue
            shifted, rows = shifted.astype(dtype), dtype(rows)  # base + offset - rows, then plus rows if negative
            step = max(1, _HOST_BLOCK // p)  # samples per block: its values stay in cache (as `expand`)
            for first in range(0, count, step):
                n = min(step, count - first)
                block, wrap = out[first * p : (first + n) * p], scratch[: n * p]
                np.add(ids[first : first + n, f, None], shifted, out=block.reshape(n, p))
                np.right_shift(block, shift, out=wrap)  # -1 where negative, else 0
                np.bitwise_and(wrap, rows, out=wrap)
                np.add(block, wrap, out=block)
        return torch.from_numpy(values.astype(np.int32 if self.id_dtype == torch.int32 else np.int64, copy=False))


class BaseIdBatch(Batch):
    """A Batch of one base id per (sample, feature) that becomes the multi-hot Batch when moved.

    `to(device)` copies dense [B, N] f32, the base ids and labels [B] f32, and expands the ids there
    (`MultiHotLayout.expand`). Its own `sparse_features` are the base ids, one per feature, key-major.

    Args:
        dense: [B, N] f32 dense features.
        base: [B, F] base ids.
        labels: [B] f32.
        layout_for: the `MultiHotLayout` of B samples on a device.
    """

    def __init__(
        self,
        dense: torch.Tensor,
        base: torch.Tensor,
        labels: torch.Tensor,
        layout_for: Callable[[torch.device], MultiHotLayout],
    ) -> None:
        keys = layout_for(base.device).keys
        key_major = torch.from_numpy(
            np.ascontiguousarray(base.numpy().T).reshape(-1)
        )  # a view if base is [F, B]'s .t()
        # numpy, not torch: a reader thread's torch ops would queue on the training thread's intra-op pool
        ones = torch.from_numpy(np.ones(base.numel(), np.int32))
        sparse = KeyedJaggedTensor(keys=keys, values=key_major, lengths=ones, stride=base.shape[0])
        super().__init__(dense_features=dense, sparse_features=sparse, labels=labels)
        self.base, self.layout_for = base, layout_for

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        base = self.base.to(device, non_blocking=non_blocking)
        return Batch(
            dense_features=self.dense_features.to(device, non_blocking=non_blocking),
            sparse_features=self.layout_for(torch.device(device)).kjt(base.t()),
            labels=self.labels.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> BaseIdBatch:
        return BaseIdBatch(
            self.dense_features.pin_memory(), self.base.pin_memory(), self.labels.pin_memory(), self.layout_for
        )

    def record_stream(self, stream) -> None:
        for t in (self.dense_features, self.base, self.labels):
            t.record_stream(stream)
