"""The README's main command trains on 2 Gloo ranks and writes a summary with a learned AUC."""

import json
import subprocess

import pytest

from tests.helpers import REPO_ROOT as REPO


@pytest.mark.slow
def test_readme_main_command(tmp_path):
    result = subprocess.run(
        ["bash", "launch/run_cpu.sh", f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["backend"] == "gloo"
    assert summary["eval_auc"] > 0.7, summary
    assert summary["train_samples_per_s"] > 0 and len(summary["peak_rss_mb_per_rank"]) == 2
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if "loss" in r]
    assert [r["step"] for r in train] == list(range(20, 201, 20))
    assert train[-1]["loss"] < train[0]["loss"]
    assert any("eval_auc" in r for r in lines)
    assert (tmp_path / "config.yaml").exists()
    assert "sharding plan (2 ranks, gloo)" in result.stdout
