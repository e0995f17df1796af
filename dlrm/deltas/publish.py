"""Writing deltas during training: at each publication, the rows of every table that the steps since
the previous one looked up (`ChangedRows`), their values now, and the dense weights.

A delta file (torch.save of tensors and plain data only; `torch.load(weights_only=True)` reads it):

    {"format": "dlrm-delta", "version": 1, "step": int, "base_step": int,
     "tables": {state-dict key: {"ids": int64 [n], "rows": [n, dim]}},   # the changed rows
     "dense": {state-dict key: tensor},                                   # every other weight
     "sha256": `delta_sha256` of the above}

`manifest.json` in the deltas directory lists them in order ({"step", "base_step", "file", "rows",
"bytes"}); a delta applies to a model at its base_step.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from dlrm.common.io import atomic_path, write_json_atomic
from dlrm.config import ModelConfig
from dlrm.deltas.tracker import ChangedRows
from dlrm.models.dlrm import local_pieces

FORMAT, VERSION = "dlrm-delta", 1
MANIFEST = "manifest.json"


def delta_sha256(payload: dict) -> str:
    """sha256 of a delta's metadata and tensors (names, dtypes, shapes, bytes), in name order."""
    h = hashlib.sha256()
    meta = {k: payload[k] for k in ("format", "version", "step", "base_step")}
    h.update(json.dumps(meta, sort_keys=True).encode())
    tensors = {f"tables/{k}/{part}": v[part] for k, v in payload["tables"].items() for part in ("ids", "rows")}
    tensors |= {f"dense/{k}": v for k, v in payload["dense"].items()}
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"\n{name}:{t.dtype}:{list(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def table_keys(state_keys: list[str], cfg: ModelConfig) -> list[str]:
    """The state-dict key of each table's weight, in table order."""
    keys = []
    for t in cfg.tables:
        found = [
            k for k in state_keys if k.endswith((f"embedding_bags.{t.name}.weight", f"embeddings.{t.name}.weight"))
        ]
        if len(found) != 1:
            raise RuntimeError(f"table {t.name}: {len(found)} state-dict keys hold its weight ({found}); expected one")
        keys.append(found[0])
    return keys


class Publisher:
    """Tracks the changed rows (`tracker`) and writes a delta when due (all ranks call `publish`).

    Args:
        cfg: the model's config (its tables and features); root: the deltas directory (rank 0 writes).
        every_steps, at_end: the cadence; pg: the training process group; is_main: rank 0.
    """

    def __init__(self, cfg: ModelConfig, root: Path, every_steps: int, at_end: bool, pg, is_main: bool) -> None:
        features = [f for t in cfg.tables for f in t.features]
        tables = [i for i, t in enumerate(cfg.tables) for _ in t.features]
        self.cfg, self.root, self.pg, self.is_main = cfg, root, pg, is_main
        self.every_steps, self.at_end = every_steps, at_end
        self.tracker = ChangedRows(features, tables)
        self.last_step = 0

    def start(self, step: int) -> None:
        """Tracking begins at `step` (the model as it is there is the next delta's base)."""
        self.last_step = step
        self.tracker.pending.clear()

    def due(self, step: int, last: bool) -> bool:
        return (step % self.every_steps == 0) or (last and self.at_end and step > self.last_step)

    def publish(self, step: int, model: torch.nn.Module) -> Path | None:
        """Write the delta from the last publication to `step` (a collective); its path on rank 0."""
        world = dist.get_world_size(self.pg)
        mine_ids = self.tracker.take(step)
        every: list = [None] * world
        dist.all_gather_object(every, mine_ids, group=self.pg)
        ids = [np.unique(np.concatenate([e[t] for e in every])) for t in range(len(self.cfg.tables))]
        state = model.state_dict()
        keys = table_keys(list(state), self.cfg)
        pieces = []
        for t, key in enumerate(keys):
            for tensor, (r0, c0), (nr, _) in local_pieces(state[key]):
                sel = ids[t][(ids[t] >= r0) & (ids[t] < r0 + nr)]
                if len(sel):
                    pieces.append((t, c0, sel, tensor[torch.from_numpy(sel - r0)].detach().cpu().clone()))
        gathered: list = [None] * world
        dist.all_gather_object(gathered, pieces, group=self.pg)
        base, self.last_step = self.last_step, step
        if not self.is_main:
            return None
        tables = {}
        for t, key in enumerate(keys):
            dim, dtype = self.cfg.tables[t].dim, state[key].dtype
            rows = torch.zeros(len(ids[t]), dim, dtype=dtype)
            for pieces_of_rank in gathered:
                for tt, c0, sel, values in pieces_of_rank:
                    if tt == t:
                        rows[torch.from_numpy(np.searchsorted(ids[t], sel)), c0 : c0 + values.shape[1]] = values
            tables[key] = {"ids": torch.from_numpy(ids[t].astype(np.int64)), "rows": rows}
        dense = {k: v.detach().cpu().clone() for k, v in state.items() if k not in keys}
        payload = {"format": FORMAT, "version": VERSION, "step": step, "base_step": base, "tables": tables}
        payload["dense"] = dense
        payload["sha256"] = delta_sha256(payload)
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"delta_{step:08d}.pt"
        with atomic_path(path) as tmp:
            torch.save(payload, tmp)
        entries = [e for e in read_manifest(self.root) if e["step"] != step]
        entries.append(
            {
                "step": step,
                "base_step": base,
                "file": path.name,
                "rows": {k.rsplit(".", 2)[-2]: len(v["ids"]) for k, v in tables.items()},
                "bytes": path.stat().st_size,
            }
        )
        write_json_atomic(self.root / MANIFEST, {"format": FORMAT, "deltas": sorted(entries, key=lambda e: e["step"])})
        return path


def read_manifest(root: Path) -> list[dict]:
    """The deltas a directory's manifest.json lists ([] without one)."""
    path = root / MANIFEST
    if not path.is_file():
        return []
    return list(json.loads(path.read_text()).get("deltas", []))
