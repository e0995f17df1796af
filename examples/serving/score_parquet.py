"""Score Parquet rows with a dlrm bundle, from its spec.json alone: a reference reader for servers.

    python examples/serving/score_parquet.py BUNDLE_DIR DATA.parquet|DIR [--out scores.npy] [--batch-size N]

Needs torch, numpy and pyarrow only (not the trainer's package). BUNDLE_DIR is written by
`python -m dlrm.export CHECKPOINT_DIR BUNDLE_DIR --format bundle`: model.pt2 (an AOTInductor model
package) and spec.json (the feature spec, described in docs/serving.md). Every row is read in file
order (files sorted by path), turned into the program's inputs exactly as the spec says, and scored;
the probabilities, float32 [N] or [N, T], are written to --out. A value the spec does not allow (a
null id, an id outside its table with id_map none) stops the reader with one line naming it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

SPEC_FORMAT, SPEC_VERSION = "dlrm-serving-spec", 1
MASK64 = (1 << 64) - 1


class BadInput(Exception):
    """A row the spec does not allow, or a spec this reader does not know."""


def string_hash(s: str, constants: dict) -> int:
    """The spec's string hash (hashing.algorithm fnv1a64-splitmix64) of one string."""
    prime = int(constants["fnv_prime"], 16)
    mix1, mix2 = int(constants["mix1"], 16), int(constants["mix2"], 16)
    h = int(constants["fnv_offset"], 16)
    for b in s.encode("utf-8"):
        h = ((h ^ b) * prime) & MASK64
    h ^= h >> 30
    h = (h * mix1) & MASK64
    h ^= h >> 27
    h = (h * mix2) & MASK64
    h ^= h >> 31
    return h & ((1 << 63) - 1)


def check_spec(spec: dict) -> None:
    """Refuse a spec of another format, and a hash that does not reproduce its test vectors."""
    if spec.get("format") != SPEC_FORMAT or spec.get("version") != SPEC_VERSION:
        raise BadInput(
            f"spec format {spec.get('format')!r} version {spec.get('version')!r}: this reader reads "
            f"{SPEC_FORMAT} {SPEC_VERSION}"
        )
    hashing = spec["hashing"]
    if hashing["algorithm"] != "fnv1a64-splitmix64":
        raise BadInput(f"string hash {hashing['algorithm']!r} is not known to this reader")
    for v in hashing["test_vectors"]:
        if string_hash(v["string"], hashing["constants"]) != v["hash"]:
            raise BadInput(f"the string hash of {v['string']!r} differs from the spec's test vector")


def dense_column(arr: pa.ChunkedArray, entry: dict) -> np.ndarray:
    """One dense column as float32 [B]: nulls -> entry['null'] (NaN when null), then entry['transform']."""
    null = np.nan if entry["null"] is None else entry["null"]
    x = pc.fill_null(arr.cast(pa.float64()), null).to_numpy(zero_copy_only=False).astype(np.float64)
    if entry["transform"] == "log1p_max0":
        x = np.log1p(np.maximum(x, 0))
    elif entry["transform"] not in ("identity", "in_program"):  # in_program: the program transforms it
        raise BadInput(f"dense transform {entry['transform']!r} of column {entry['column']!r} is not known")
    return x.astype(np.float32)


def flat_and_lengths(arr: pa.ChunkedArray, is_list: bool, column: str) -> tuple[list | np.ndarray, np.ndarray]:
    """(the column's values, flattened, and the count per row) of a scalar or list column; no nulls."""
    arr = arr.combine_chunks()
    if arr.null_count:
        raise BadInput(f"column {column!r} has a null at row {arr.is_null().to_numpy(zero_copy_only=False).argmax()}")
    if not is_list:
        return arr.to_numpy(zero_copy_only=False), np.ones(len(arr), np.int64)
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(arr)
    if flat.null_count:
        raise BadInput(f"column {column!r} holds a null value")
    return flat.to_numpy(zero_copy_only=False), lengths


def ids_of(table: pa.Table, entry: dict, hashing: dict) -> tuple[np.ndarray, np.ndarray]:
    """(values int64 [N], lengths int64 [B]) of one sparse feature: the column's ids mapped into its table."""
    kind, column, rows = entry["kind"], entry["column"], entry["rows"]
    id_map = entry["id_map"]
    flat, lengths = flat_and_lengths(table.column(column), kind in ("ids", "strings"), column)
    if kind in ("string", "strings"):
        ids = np.array([string_hash(s, hashing["constants"]) for s in flat], np.int64)
    elif kind == "hex":  # Criteo's hexadecimal categorical fields; an empty field is id 0
        ids = np.array([int(s, 16) if s else 0 for s in flat], np.int64)
    elif kind in ("id", "ids"):
        ids = np.asarray(flat, np.int64)
    else:
        raise BadInput(f"sparse kind {kind!r} of column {column!r} is not known")
    if id_map["kind"] in ("modulo", "hash_modulo"):
        ids = ids % id_map["modulus"]  # numpy's %: non-negative for a positive modulus
    elif id_map["kind"] == "vocabulary":  # raw ids: the program maps them with its vocabulary
        if kind in ("string", "strings"):
            ids = ids % id_map["modulus"]
        elif (ids < 0).any():
            raise BadInput(f"column {column!r} holds id {ids[(ids < 0).argmax()]}; ids are >= 0")
    elif id_map["kind"] == "none":
        bad = (ids < 0) | (ids >= rows)
        if bad.any():
            raise BadInput(f"column {column!r} holds id {ids[bad.argmax()]}, outside its table's {rows} rows")
    else:
        raise BadInput(f"id_map {id_map['kind']!r} of column {column!r} is not known")
    return ids, lengths


def weights_of(table: pa.Table, entry: dict, lengths: np.ndarray) -> np.ndarray:
    """float32 [N]: the weights column of a weighted feature, or 1.0 per id when it names none."""
    if not entry["weights"]:
        return np.ones(int(lengths.sum()), np.float32)
    flat, counts = flat_and_lengths(
        table.column(entry["weights"]), entry["kind"] in ("ids", "strings"), entry["weights"]
    )
    if not np.array_equal(counts, lengths):
        raise BadInput(f"weights column {entry['weights']!r} has another count than {entry['column']!r} in some row")
    return np.asarray(flat, np.float32)


def inputs_of(table: pa.Table, spec: dict) -> list[torch.Tensor]:
    """The program's inputs (spec.program.inputs, in order) of a table of rows."""
    dense = [dense_column(table.column(e["column"]), e) for e in spec["dense"]]
    dense_matrix = np.stack(dense, 1) if dense else np.zeros((table.num_rows, 0), np.float32)
    inputs = [torch.from_numpy(np.ascontiguousarray(dense_matrix, np.float32))]
    for entry in spec["sparse"]:
        values, lengths = ids_of(table, entry, spec["hashing"])
        inputs += [torch.from_numpy(values), torch.from_numpy(lengths)]
        if spec["model"]["weighted"]:
            inputs.append(torch.from_numpy(weights_of(table, entry, lengths)))
    if len(inputs) != len(spec["program"]["inputs"]):
        raise BadInput(f"{len(inputs)} inputs made, the program takes {len(spec['program']['inputs'])}")
    return inputs


def score(bundle: Path, data: Path, batch_size: int = 1024) -> np.ndarray:
    """Probabilities float32 [N] (one task) or [N, T] of every row of the Parquet file or directory `data`."""
    spec = json.loads((bundle / "spec.json").read_text())
    check_spec(spec)
    program = torch._inductor.aoti_load_package(str(bundle / spec["program"]["file"]))
    files = sorted(data.rglob("*.parquet")) if data.is_dir() else [data]
    columns = [e["column"] for e in spec["dense"]]
    for e in spec["sparse"]:
        columns += [e["column"]] + ([e["weights"]] if e["weights"] else [])
    out = []
    for file in files:
        for batch in pq.ParquetFile(file).iter_batches(batch_size=batch_size, columns=list(dict.fromkeys(columns))):
            result = program(*inputs_of(pa.Table.from_batches([batch]), spec))
            out.append((result[0] if isinstance(result, list | tuple) else result).numpy())
    tasks = len(spec["tasks"])
    return np.concatenate(out) if out else np.zeros((0,) if tasks == 1 else (0, tasks), np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("data", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--batch-size", type=int, default=1024)
    a = ap.parse_args()
    try:
        p = score(a.bundle, a.data, a.batch_size)
    except (BadInput, OSError, KeyError, pa.ArrowException) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.out is not None:
        np.save(a.out, p)
    print(f"scored {len(p)} rows" + (f"; wrote {a.out}" if a.out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
