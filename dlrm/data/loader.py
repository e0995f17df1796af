"""Choose the batch source named by `data.source`.

A source has `num_batches(split) -> int | None` (None: endless) and
`batches(split, rank, world_size, start_step) -> Iterator[Batch]`, yielding this rank's slice
(global_batch_size // world_size samples) of global batches start_step, start_step + 1, ...
"""

from __future__ import annotations

from dlrm.config import Config


def feature_layout(cfg: Config) -> tuple[list[str], list[int], list[int]]:
    """(feature names in KJT key order, rows of each feature's table, pooling of each feature)."""
    names, rows, pooling = [], [], []
    for t in cfg.model.tables:
        for f in t.features:
            names.append(f)
            rows.append(t.rows)
            pooling.append(t.pooling)
    return names, rows, pooling


def make_source(cfg: Config):
    """The batch source for this config (synthetic or preprocessed Criteo)."""
    names, rows, pooling = feature_layout(cfg)
    if cfg.data.source == "criteo":
        from dlrm.data.criteo_loader import CriteoSource

        return CriteoSource(cfg.data.criteo, names, rows, cfg.data.global_batch_size, cfg.seed)
    from dlrm.data.synthetic import SyntheticSource

    return SyntheticSource(
        cfg.data.synthetic,
        feature_names=names,
        table_rows=rows,
        pooling=pooling,
        dense_features=cfg.model.dense_in_features,
        global_batch_size=cfg.data.global_batch_size,
        seed=cfg.seed,
        eval_batches=cfg.data.eval_batches,
    )
