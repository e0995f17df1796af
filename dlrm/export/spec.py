"""The feature spec of a bundle (`spec.json`): all a reader needs to turn rows into the program's inputs.

    {"format": "dlrm-serving-spec", "version": 1,
     "program": {"file", "inputs": [{"name", "dtype", "shape"}], "output": {"name", "dtype", "shape"}},
     "source": "synthetic" | "criteo" | "parquet" | null,
     "dense": [{"column", "null", "transform"}],              # in input order: dense[:, k]
     "sparse": [{"feature", "table", "rows", "dim", "pooling", "column", "kind", "weights", "id_map"}],
     "hashing": {"algorithm", "steps", "constants", "test_vectors"},
     "tasks": [{"name", "label"}],
     "model": {"interaction", "weighted", "tables", "step", "int8", "export_sha256"},
     "versions": {"torch", "torchrec", "fbgemm_gpu", "dlrm", "python"},
     "dlrm": {"model": the model config, "data": the export's data record}}   # for this package's scorer

Sparse kinds: id (an integer per row), ids (a list of integers per row), string / strings (hashed,
`hashing`), hex (Criteo's hexadecimal strings: int(s, 16)). id_map says how a column's value becomes
a table row: {"kind": "none"} (ids must lie in [0, rows)), {"kind": "modulo", "modulus": rows}
(value % rows, non-negative), for strings {"kind": "hash_modulo", "modulus": rows} (hash % rows), or
for a table with a managed vocabulary {"kind": "vocabulary"} (ids >= 0 passed raw, strings hashed
modulo 2**63 - 1: the program maps them to rows with the vocabulary it carries).
Dense transforms: "identity" or "log1p_max0" (log(1 + max(x, 0)) computed in float64, then float32);
`null` is the value of a missing entry, before the transform. "in_program": the program applies the
column's data.parquet.dense_transforms (`parameters`, for reference) and its missing flags; the reader
passes the value as read, NaN for a missing one (`null` is null).
"""

from __future__ import annotations

import platform
from importlib import metadata

import pyarrow as pa
import torch
from omegaconf import OmegaConf

from dlrm.config import ModelConfig, ParquetConfig
from dlrm.data.criteo.format import NUM_DENSE, SPARSE_NAMES
from dlrm.data.parquet.hashing import hash_strings
from dlrm.data.source import RAW_ID_BOUND
from dlrm.export.file import ExportedData
from dlrm.export.serving import feature_names, input_names

SPEC_FORMAT, SPEC_VERSION = "dlrm-serving-spec", 1
PROGRAM_FILE, SPEC_FILE = "model.pt2", "spec.json"
TEST_STRINGS = ("", "a", "click", "Zürich", "東京", "a string longer than one 64-bit word of bytes")

HASHING = {
    "algorithm": "fnv1a64-splitmix64",
    "steps": [
        "h = fnv_offset (uint64)",
        "for each byte b of the string's UTF-8: h = (h xor b) * fnv_prime mod 2**64",
        "h ^= h >> 30; h = h * mix1 mod 2**64; h ^= h >> 27; h = h * mix2 mod 2**64; h ^= h >> 31",
        "hash = h & (2**63 - 1); row = hash % rows",
    ],
    "constants": {
        "fnv_offset": "0xcbf29ce484222325",
        "fnv_prime": "0x100000001b3",
        "mix1": "0xbf58476d1ce4e5b9",
        "mix2": "0x94d049bb133111eb",
    },
}


def _versions() -> dict:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    fbgemm = version("fbgemm-gpu-cpu") or version("fbgemm-gpu")
    return {
        "torch": torch.__version__,
        "torchrec": version("torchrec"),
        "fbgemm_gpu": fbgemm,
        "dlrm": version("dlrm"),
        "python": platform.python_version(),
    }


def hashing() -> dict:
    """The string hash's description, with test vectors computed by the trainer's own hash."""
    hashes = hash_strings(pa.array(list(TEST_STRINGS), pa.string()))
    vectors = [{"string": s, "hash": int(h)} for s, h in zip(TEST_STRINGS, hashes, strict=True)]
    return {**HASHING, "test_vectors": vectors}


def _columns(cfg: ModelConfig, data: ExportedData) -> tuple[list, list, list]:
    """(dense, sparse, tasks) entries: the columns a reader reads, per the export's data record."""
    tables = {f: t for t in cfg.tables for f in t.features}
    features = feature_names(cfg)

    def sparse_entry(feature: str, column: str, kind: str, weights: str | None, id_map: dict) -> dict:
        t = tables[feature]
        return {
            "feature": feature,
            "table": t.name,
            "rows": int(t.rows),
            "dim": int(t.dim),
            "pooling": str(t.pooling_type),
            "column": column,
            "kind": kind,
            "weights": weights,
            "id_map": id_map,
        }

    if data.source == "parquet" and data.parquet is not None:
        p = data.parquet
        dense = [_parquet_dense(c, p) for c in p.dense]
        by_name = {s.name: s for s in p.sparse}
        sparse = []
        for f in features:
            s = by_name[f]
            rows = int(tables[f].rows)
            if tables[f].vocabulary.managed:
                id_map = {"kind": "vocabulary", "modulus": RAW_ID_BOUND}
            elif str(s.kind) in ("string", "strings"):
                id_map = {"kind": "hash_modulo", "modulus": rows}
            else:
                id_map = {"kind": "modulo", "modulus": rows} if str(p.id_policy) == "modulo" else {"kind": "none"}
            sparse.append(sparse_entry(f, s.column or s.name, str(s.kind), s.weights, id_map))
        tasks = [{"name": t.name, "label": c} for t, c in zip(cfg.tasks, p.labels, strict=True)]
        return dense, sparse, tasks
    criteo = data.source == "criteo" and cfg.dense_in_features == NUM_DENSE and len(features) == len(SPARSE_NAMES)
    if criteo:  # Criteo's raw fields, as dlrm.data.criteo.preprocess reads them (tables of `rows` ids)
        dense = [{"column": f"I{k + 1}", "null": 0.0, "transform": "log1p_max0"} for k in range(NUM_DENSE)]
        sparse = [
            sparse_entry(f, c, "hex", None, {"kind": "modulo", "modulus": int(tables[f].rows)})
            for f, c in zip(features, SPARSE_NAMES, strict=True)
        ]
    else:  # synthetic data, or an export that does not say: the model's inputs as they are
        dense = [{"column": f"dense_{k}", "null": 0.0, "transform": "identity"} for k in range(cfg.dense_in_features)]
        sparse = [sparse_entry(f, f, "ids", None, {"kind": "none"}) for f in features]
    tasks = [{"name": t.name, "label": "label" if len(cfg.tasks) == 1 else t.name} for t in cfg.tasks]
    return dense, sparse, tasks


def _parquet_dense(column: str, p: ParquetConfig) -> dict:
    """The spec entry of a Parquet dense column: passed as read (NaN for a missing value) when the
    model's dense transforms run in the program, else missing -> 0 and no transform."""
    if not p.dense_transforms:
        return {"column": column, "null": 0.0, "transform": "identity"}
    t = p.dense_transforms.get(column)
    parameters = OmegaConf.to_container(OmegaConf.structured(t)) if t is not None else None
    return {"column": column, "null": None, "transform": "in_program", "parameters": parameters}


def dense_inputs(cfg: ModelConfig, data: ExportedData) -> int:
    """The width of the program's dense input: the raw columns where their transforms run in it."""
    p = data.parquet
    return len(p.dense) if data.source == "parquet" and p is not None and p.dense_transforms else cfg.dense_in_features


def build_spec(cfg: ModelConfig, data: ExportedData, record: dict | None, step: int, sha256: str, int8: bool) -> dict:
    """The feature spec of a bundle, as written to spec.json.

    Args:
        cfg: the model config.
        data: how the model read its rows; `record` is the export's raw data record.
        step: the training step of the exported weights.
        sha256: the export's content digest.
        int8: the tables are stored row-wise int8.
    """
    dense, sparse, tasks = _columns(cfg, data)
    inputs = []
    for name in input_names(cfg):
        part = name.rsplit(".", 1)[-1]
        if name == "dense":
            inputs.append({"name": name, "dtype": "float32", "shape": ["B", dense_inputs(cfg, data)]})
        elif part == "lengths":
            inputs.append({"name": name, "dtype": "int64", "shape": ["B"]})
        else:
            dtype = "float32" if part == "weights" else "int64"
            inputs.append({"name": name, "dtype": dtype, "shape": [f"N_{name.rsplit('.', 1)[0]}"]})
    output_shape = ["B"] if len(cfg.tasks) == 1 else ["B", len(cfg.tasks)]
    return {
        "format": SPEC_FORMAT,
        "version": SPEC_VERSION,
        "program": {
            "file": PROGRAM_FILE,
            "inputs": inputs,
            "output": {"name": "probabilities", "dtype": "float32", "shape": output_shape},
        },
        "source": data.source,
        "dense": dense,
        "sparse": sparse,
        "hashing": hashing(),
        "tasks": tasks,
        "model": {
            "interaction": str(cfg.interaction),
            "weighted": bool(cfg.weighted),
            "tables": [{"name": t.name, "rows": int(t.rows), "dim": int(t.dim)} for t in cfg.tables],
            "step": int(step),
            "int8": bool(int8),
            "export_sha256": sha256,
        },
        "versions": _versions(),
        "dlrm": {"model": OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True), "data": record},
    }
