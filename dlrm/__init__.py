"""Distributed DLRM trainer.

One import-time setting, for every entry point: the root logger drops fbgemm-gpu's warning that its
version has no entry in its own torch compatibility table ("_fbgemm_torch_compat_table has no entry
for ..."); fbgemm's other warnings (a real torch mismatch, a library that fails to load) still show.
"""

import logging


def _not_fbgemm_table_gap(record: logging.LogRecord) -> bool:
    return "_fbgemm_torch_compat_table has no entry for" not in str(record.msg)


logging.getLogger().addFilter(_not_fbgemm_table_gap)
