"""The benchmark's baseline (benchmarks/torchrec_example/run_example.py, TorchRec's DLRM example
rebuilt) runs under the project's launcher on 2 Gloo ranks and reports what dlrm.bench reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.harness import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.long
def test_torchrec_example_baseline_reports_speed_and_memory(tmp_path):
    out = tmp_path / "example.json"
    args = ["--num-embeddings", "1000", "--warmup", "2", "--window", "2", "--windows", "3"]
    args += ["--eval-batches", "2", "--num-workers", "1", "--global-batch-size", "256", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "dlrm.torchrun", "--nproc_per_node=2", "--rdzv_backend=c10d",
         f"--rdzv_endpoint=127.0.0.1:{free_port()}",
         str(ROOT / "benchmarks/torchrec_example/run_example.py"), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["global_batch_size"] == 256
    assert len(result["samples_per_s_windows"]) == 3 and result["samples_per_s_median"] > 0
    assert result["samples_per_cpu_s"] > 0 and len(result["peak_rss_mb_per_rank"]) == 2
    assert 0.0 <= result["eval_auroc_random_labels"] <= 1.0
