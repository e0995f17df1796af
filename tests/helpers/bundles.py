"""Two trained models and their bundles, made once per session (AOTInductor compiles each in about a
minute here) and shared by the bundle tests.

criteo_job: the README's main job's model (dlrm_small, dot) trained in one process on the real Criteo
sample rows (ids hashed into its 2,000-row tables), its held-out last 20 rows evaluated by the trainer.
parquet_job: a weighted two-task model on the Parquet helper's rows (a one-id, a weighted list and a
hashed string feature), evaluated by the trainer on a separate eval file.

Training and both exports run in the test process (`dlrm.train.main`, `dlrm.export`'s functions); the
bundle tests score the bundle in a fresh process. The tests' compile skips what only serves a
deployed program's speed or profiling (`TEST_COMPILE`): the kernels, and so the numbers, are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dlrm.data.criteo.format import ParseOptions
from dlrm.data.criteo.preprocess import preprocess
from tests.helpers.cli import train_quietly
from tests.helpers.criteo import SAMPLE
from tests.helpers.parquet_data import ROWS, table, two_task_overrides, write_dataset

CRITEO_GBS, EVAL_FRACTION = 8, 0.2  # 80 train rows, 20 held out: the trainer scores 2 full batches (16 rows)
PARQUET_GBS, PARQUET_EVAL_ROWS = 32, 192
TASKS = ("click", "convert")
STEPS = 20
TEST_COMPILE = {  # AOTInductor options that change no arithmetic: the same generated code, the same -O3 kernels
    "aot_inductor.compile_wrapper_opt_level": "O0",  # the wrapper only calls kernels: no arithmetic of its own
    "aot_inductor.precompile_headers": False,  # a header built for one model's flags is not reused
    "aot_inductor.enable_line_tables": False,  # debug line tables, for profilers
    "aot_inductor.enable_frame_pointer": False,  # for profilers
}


@dataclass(frozen=True)
class Job:
    """A finished training: its run directory, checkpoint, data (preprocessed dir or eval Parquet dir),
    exported file and bundle."""

    run: Path
    checkpoint: Path
    data: Path
    file: Path
    bundle: Path


def _train_and_export(root: Path, data: Path, *train: str) -> Job:
    import torch._inductor.config  # imported when a bundle test runs, not at collection

    from dlrm.export.bundle import bundle
    from dlrm.export.file import export

    run = root / "run"
    ckpt = train_quietly(run, STEPS, *train)
    job = Job(run, ckpt, data, root / "model.pt", root / "bundle")
    export(ckpt, job.file)
    with torch._inductor.config.patch(TEST_COMPILE):
        bundle(ckpt, job.bundle)
    return job


@pytest.fixture(scope="session")
def criteo_job(tmp_path_factory) -> Job:
    if not SAMPLE.exists():
        pytest.skip(f"{SAMPLE} not found")
    root = tmp_path_factory.mktemp("criteo_job")
    data = root / "data"
    preprocess([str(SAMPLE)], str(data), ParseOptions("fail", "modulo", (2000,) * 26))
    return _train_and_export(
        root,
        data,
        "model=dlrm_small",
        "data=criteo_kaggle",
        f"data.criteo.dir={data}",
        f"data.criteo.eval_fraction={EVAL_FRACTION}",
        f"data.global_batch_size={CRITEO_GBS}",
        "data.eval_batches=100",
    )


@pytest.fixture(scope="session")
def parquet_job(tmp_path_factory) -> Job:
    root = tmp_path_factory.mktemp("parquet_job")
    train_dir, eval_dir = root / "train", root / "eval"
    write_dataset(train_dir)
    eval_dir.mkdir()
    rows = table(PARQUET_EVAL_ROWS, first=ROWS)
    x = rows.column("x").to_numpy()
    missing = pa.array(np.arange(len(x)) % 7 == 3)  # missing dense values: the transform's missing flag
    rows = rows.set_column(
        rows.schema.get_field_index("x"), "x", pc.if_else(missing, pa.nulls(len(x), pa.float32()), x)
    )
    pq.write_table(rows, eval_dir / "part-0.parquet", row_group_size=40)
    conf = root / "conf"  # a dense transform with a missing flag: YAML, as inspect writes it
    conf.mkdir()
    (conf / "transformed.yaml").write_text(
        "defaults:\n  - config\n  - _self_\ndata:\n  parquet:\n    dense_transforms:\n"
        "      x: {log1p: true, mean: 0.3, std: 0.7, clip: [-1.0, 2.5], missing_flag: true}\n"
    )
    return _train_and_export(
        root,
        eval_dir,
        "-cd",
        str(conf),
        "-cn",
        "transformed",
        *two_task_overrides(train_dir, eval_dir, PARQUET_GBS, PARQUET_EVAL_ROWS),
        "model.dense_in_features=3",
    )
