"""Distributed DLRM trainer (see README.md).

One import-time setting, for every entry point: fbgemm-gpu 1.6.0 (the GPU image's, beside torch 2.11)
has no row for itself in its own torch compatibility table, so importing it (torchrec does) logs
"_fbgemm_torch_compat_table has no entry for 1.6.0 of FBGEMM" on the root logger once per library it
loads, 14 times, before any one-line error or progress; fbgemm-gpu 1.8.0 (beside torch 2.13) has the
row and is silent. The root logger drops exactly that warning; fbgemm's other ones (a real torch
mismatch, a library that fails to load) still show.
"""

import logging


def _not_fbgemm_table_gap(record: logging.LogRecord) -> bool:
    return "_fbgemm_torch_compat_table has no entry for" not in str(record.msg)


logging.getLogger().addFilter(_not_fbgemm_table_gap)
