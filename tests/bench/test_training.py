"""The benchmark command: its materialised-batch source, its refusals, and one small real run."""

import json
import os
import subprocess
import sys

import pytest
import torch

from dlrm.bench import training as bench
from dlrm.config import ConfigError
from dlrm.data.source import make_source
from tests.helpers import REPO_ROOT as ROOT
from tests.helpers.cli import TORCHRUN_VARS, assert_one_error


def test_cached_source_repeats_the_first_batches(make_config):
    cfg = make_config("model=tiny", "data.global_batch_size=8")
    source = make_source(cfg)
    cached = bench.CachedSource(source, count=3)
    got = [b for _, b in zip(range(7), cached.batches("train", 1, 2, start_step=2))]
    first = [b for _, b in zip(range(3), source.batches("train", 1, 2))]
    for i, batch in enumerate(got):  # step 2 + i of a 3-batch loop
        assert torch.equal(batch.dense_features, first[(2 + i) % 3].dense_features)
    evals = list(cached.batches("eval", 0, 1))
    assert len(evals) == cfg.data.eval_batches and cached.num_batches("eval") == cfg.data.eval_batches


def test_max_table_rows_caps_every_table():
    cfg = bench.compose_config(["experiment=bench_dcnv2", "topology=cpu"], max_table_rows=1000)
    assert max(t.rows for t in cfg.model.tables) == 1000
    assert min(t.rows for t in cfg.model.tables) == 3  # smaller tables keep their size


def test_a_config_directory_is_composed_as_dlrm_train_does(tmp_path):
    """-cd DIR: a team's own model config group, beside conf/'s."""
    (tmp_path / "model").mkdir()
    tiny = (ROOT / "conf" / "model" / "tiny.yaml").read_text()
    (tmp_path / "model" / "mine.yaml").write_text(tiny.replace("bottom_mlp: [16, 8]", "bottom_mlp: [32, 8]"))
    cfg = bench.compose_config(["model=mine", "topology=cpu"], config_dir=str(tmp_path))
    assert cfg.model.bottom_mlp == [32, 8]
    with pytest.raises(ConfigError, match="did you mean 'mine'"):
        bench.compose_config(["model=mne", "topology=cpu"], config_dir=str(tmp_path))


@pytest.mark.parametrize(
    "args", [["--windows", "0"], ["--window", "0"], ["--warmup", "-1"], ["--max-table-rows", "-5"]]
)
def test_bad_options_exit_2(args, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(args)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_bad_override_is_a_user_error(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["data.global_batch_size=0"])
    assert e.value.code == 2 and "global_batch_size" in capsys.readouterr().err


@pytest.mark.slow  # two processes under torchrun
@pytest.mark.parametrize("args", [["data.global_batch_size=0"]])  # a bad option: the same exit (test above)
def test_user_error_is_one_line_under_torchrun(args):
    """Two ranks meet the same bad config: rank 0 prints it, rank 1 and torchrun nothing."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    launch = [sys.executable, "-m", "dlrm.torchrun", "--standalone", "--nproc_per_node=2", "-m", "dlrm.bench.training"]
    r = subprocess.run([*launch, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert_one_error(r.returncode, r.stdout, r.stderr, args[0].split("=")[0])


@pytest.mark.slow
def test_small_run_reports_median_windows_and_memory(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench.main(
        [
            "model=tiny",
            "data.global_batch_size=32",
            "trainer.progress=none",
            "--warmup",
            "2",
            "--window",
            "2",
            "--windows",
            "3",
            "--profile",
            "1",
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    rates = result["samples_per_s_windows"]
    assert len(rates) == 3 and all(r > 0 for r in rates)
    assert result["samples_per_s_median"] == sorted(rates)[1]
    assert result["world_size"] == 1 and len(result["peak_rss_mb_per_rank"]) == 1 and result["samples_per_cpu_s"] > 0
    assert 0.0 <= result["eval_auc"] <= 1.0 and "Self CPU" in result["profile"]
    phases = result["phase_ms"]  # the profiled step's training thread, split into phases
    assert phases["dense_fwd"] > 0 and phases["backward"] > 0 and "device_phase_ms" not in result
    printed = capsys.readouterr().out
    assert "samples/s median of 3 windows" in printed and "phases, ms per step (training thread): " in printed


def test_source_only_reports_speed_per_rank_against_the_gpu_budget(tmp_path, capsys):
    out = tmp_path / "source.json"
    window = ["--warmup", "1", "--window", "2", "--windows", "3"]
    bench.main(
        [
            "--source-only",
            "--ranks",
            "2",
            "--device",
            "cpu",
            *window,
            "--out",
            str(out),
            "model=tiny",
            "data.global_batch_size=512",
        ]
    )
    result = json.loads(out.read_text())
    assert result["ranks"] == 2 and result["samples_per_rank"] == 256 and result["device"] == "cpu"
    assert result["ids_per_sample"] == 1 + 2 + 1 + 1 + 3  # model=tiny: C1, C2 x2, C3, C5, C4 x3
    assert len(result["source_samples_per_s_windows"]) == 3 and result["source_samples_per_cpu_s"] > 0
    assert result["source_samples_per_s_per_rank"] == sorted(result["source_samples_per_s_windows"])[1]
    assert result["fraction_of_gpu_budget"] == pytest.approx(result["source_samples_per_s_per_rank"] / 1.7e6)
    assert "samples/s per rank" in capsys.readouterr().out


def test_source_only_takes_the_ranks_from_the_topology(capsys):
    """The MLPerf shape on dgx_h100: 8 ranks of 8,192 samples, 214 ids each (tables capped: no memory)."""
    args = ["--source-only", "--device", "cpu", "--warmup", "0", "--window", "1", "--windows", "1"]
    bench.main([*args, "--max-table-rows", "1000", "experiment=bench_dcnv2"])
    out = capsys.readouterr().out
    assert "8,192 samples per rank (8 ranks, 214 ids per sample)" in out


@pytest.mark.parametrize("args", [["--ranks", "-1"], ["--ranks", "3", "model=tiny"]])
def test_source_only_bad_ranks_exit_2(args, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--source-only", *args])
    assert e.value.code == 2 and "--ranks" in capsys.readouterr().err
