"""A ParquetSource over the dataset of tests/helpers/parquet_data.py, and what tests compare its batches with."""

from __future__ import annotations

import numpy as np
import torch

from dlrm.config import ParquetConfig, SparseColumnConfig
from dlrm.config.choices import SparseKind
from dlrm.data.parquet.source import ParquetSource
from tests.helpers.parquet_data import ROWS, TABLES

NAMES, ROWS_OF = list(TABLES), list(TABLES.values())
B = 96


def config(path, **kw) -> ParquetConfig:
    sparse = [
        SparseColumnConfig(name="user", kind=SparseKind.id),
        SparseColumnConfig(name="items", kind=SparseKind.ids, weights=kw.pop("weights", None)),
        SparseColumnConfig(name="city", kind=SparseKind.string),
    ]
    return ParquetConfig(path=str(path), dense=["pos", "x"], sparse=kw.pop("sparse", sparse), **kw)


def source(path, batch=B, seed=0, names=NAMES, rows=ROWS_OF, **kw) -> ParquetSource:
    return ParquetSource(config(path, **kw), names, rows, batch, seed)


def rows_of(batch) -> np.ndarray:
    """The dataset rows a batch holds (its pos feature names them)."""
    return np.rint(batch.dense_features[:, 0].double().numpy() * ROWS).astype(np.int64)


def assert_batches_equal(a, b) -> None:
    torch.testing.assert_close(a.dense_features, b.dense_features, rtol=0, atol=0)
    torch.testing.assert_close(a.labels, b.labels, rtol=0, atol=0)
    assert a.sparse_features.keys() == b.sparse_features.keys()
    for key, x in a.sparse_features.to_dict().items():
        y = b.sparse_features.to_dict()[key]
        assert torch.equal(x.lengths(), y.lengths()) and torch.equal(x.values(), y.values()), key
        if x.weights_or_none() is not None:
            assert torch.equal(x.weights(), y.weights()), key
