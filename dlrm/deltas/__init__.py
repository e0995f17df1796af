"""Deltas for serving: the rows of each table changed since the last publication, tracked from the
ids the steps looked up (`tracker`), written by the trainer at its cadence (`publish`), listed and
applied to an export by `python -m dlrm.deltas` (`apply`)."""
