"""Checkpoints: resume == uninterrupted, resharding, elastic recovery, atomicity, guards, export."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dlrm.checkpoint import latest_checkpoint
from dlrm.export import export, load_exported
from tests.helpers import REPO_ROOT as REPO
from tests.helpers.equivalence import assert_matches_reference, reference, tiny
from tests.helpers.families import PAIR, SINGLE, TWO_NODES, error_of
from tests.helpers.workers import summary_and_records, train_and_report, train_summary, train_with_a_nan_batch


def ckpt_config(root, *overrides):
    # Default optimizers (row-wise Adagrad + Adagrad, with state) and a warmup across the resume point.
    return tiny(
        "optim=rowwise_adagrad",
        "optim.schedule.warmup_steps=8",
        f"checkpoint.dir={root}",
        "checkpoint.every_steps=4",
        "trainer.max_steps=12",
        *overrides,
    )


def gather(results):
    """{name: [(offsets, tensor)...]} of every rank, merged."""
    merged = {}
    for result in results:
        for name, pieces in result["pieces"].items():
            merged.setdefault(name, []).extend(pieces)
    return merged


RESHARDED = ((SINGLE, "row_wise"), (TWO_NODES, "row_wise"), (PAIR, "column_wise"))
NAN_SKIP = tiny("sharding=row_wise", "trainer.pipeline=false", "trainer.on_nonfinite=skip")

WHOLE = PAIR.add(
    "ckpt/whole", train_and_report, ckpt_config(PAIR.dir("ckpt_a"), "sharding=table_wise", "checkpoint.keep=3")
)
_AT_4 = PAIR.dir("ckpt_a") / "step_00000004"
RESUMED = PAIR.add(
    "ckpt/resumed", train_and_report, ckpt_config(PAIR.dir("ckpt_b"), "sharding=table_wise", f"trainer.resume={_AT_4}")
)
SAVED = PAIR.add("ckpt/saved", train_summary, ckpt_config(PAIR.dir("ckpt_tw"), "sharding=table_wise"))
_LAST = PAIR.dir("ckpt_tw") / "step_00000012"
RESHARDED_RUNS = {}  # (family, sharding): an eval-only run of SAVED's last checkpoint on another plan
for _family, _sharding in RESHARDED:
    _topology = "topology=cpu_2x2" if _family is TWO_NODES else "topology=cpu"
    _overrides = (f"sharding={_sharding}", _topology, f"trainer.resume={_LAST}", "trainer.eval_only=true")
    _cfg = ckpt_config(_family.dir("resharded"), *_overrides)
    RESHARDED_RUNS[_family, _sharding] = _family.add(
        f"ckpt/resharded/{_sharding}", summary_and_records, _cfg, _family.dir(f"resharded_run_{_sharding}")
    )
EXPORTED = PAIR.add("ckpt/export", train_and_report, ckpt_config(PAIR.dir("ckpt_c"), "sharding=row_wise"))
NAN_BATCH = PAIR.add("nan_batch", train_with_a_nan_batch, NAN_SKIP, 3, 1)
# INCOMPATIBLE resumes this run's checkpoint with a changed table.
SINGLE.add("ckpt/four_steps", train_summary, ckpt_config(SINGLE.dir("ckpt_d"), "trainer.max_steps=4"))
INCOMPATIBLE = SINGLE.add(
    "ckpt/incompatible",
    train_summary,
    ckpt_config(
        SINGLE.dir("ckpt_e"),
        f"trainer.resume={SINGLE.dir('ckpt_d') / 'step_00000004'}",
        "model.tables.0.rows=200",  # only the rows differ
    ),
    expect_error=True,
)
NONFINITE_FIRST = SINGLE.add(
    "nonfinite/first", train_summary, ckpt_config(SINGLE.dir("nonfinite"), "optim=sgd", "trainer.max_steps=4")
)
NONFINITE_DIVERGED = SINGLE.add(
    "nonfinite/diverged",
    train_summary,
    ckpt_config(
        SINGLE.dir("nonfinite"), "optim=sgd", "optim.dense.lr=1e30", "optim.embedding.lr=1e30", "trainer.resume=auto"
    ),
    expect_error=True,
)


@pytest.mark.slow
def test_resume_equals_uninterrupted():
    whole, resumed = WHOLE.results(), RESUMED.results()
    assert resumed[0]["losses"] == whole[0]["losses"][4:]  # bit-exact: same maths, same order
    a, b = gather(whole), gather(resumed)
    for name in a:
        for (off_a, t_a), (off_b, t_b) in zip(sorted(a[name], key=lambda p: p[0]), sorted(b[name], key=lambda p: p[0])):
            assert off_a == off_b and torch.equal(t_a, t_b), name


@pytest.mark.slow
@pytest.mark.parametrize("family, sharding", RESHARDED, ids=["1x1-row_wise", "2x2-row_wise", "1x2-column_wise"])
def test_resharding_keeps_the_eval_loss(family, sharding):
    saved = SAVED.results()[0]
    resharded = RESHARDED_RUNS[family, sharding].results()[0]
    loaded, records = resharded["summary"], resharded["records"]
    assert loaded["eval_logloss"] == pytest.approx(saved["eval_logloss"], rel=1e-6)
    assert loaded["eval_auc"] == pytest.approx(saved["eval_auc"], rel=1e-6)
    # eval_only records its evaluation in metrics.jsonl too: a start at the checkpoint's step, then the eval.
    assert [{k: r[k] for k in ("event", "step", "resumed")} for r in records[:1]] == [
        {"event": "start", "step": 12, "resumed": True}
    ]
    assert [(r["step"], r["eval_auc"]) for r in records[1:]] == [(12, loaded["eval_auc"])]


@pytest.mark.slow
def test_export_is_the_unsharded_model(tmp_path):
    results = EXPORTED.results()
    root = PAIR.dir("ckpt_c")
    assert sorted(p.name for p in root.iterdir()) == ["step_00000008", "step_00000012"]  # keep=2
    exported = export(root / "step_00000012", tmp_path / "model.pt")
    for name, pieces in gather(results).items():
        for (r0, c0), piece in pieces:
            full = exported[name]
            expected = full[r0 : r0 + piece.shape[0], c0 : c0 + piece.shape[1]] if full.dim() == 2 else full
            assert torch.equal(piece, expected), name
    model = load_exported(tmp_path / "model.pt")
    assert set(model.state_dict()) == set(exported)


@pytest.mark.slow
def test_kill_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    """SIGKILL the whole job while DCP writes a 170 MB checkpoint; resume=auto takes the one before."""
    run_dir, root = tmp_path / "run", tmp_path / "run" / "checkpoints"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    args = [
        torchrun,
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "dlrm.train",
        "model=bench_cpu",
        f"hydra.run.dir={run_dir}",
        "trainer.max_steps=10",
        "checkpoint.every_steps=5",
        "trainer.progress=none",
        "trainer.breakdown=false",
        "trainer.tensorboard=false",
    ]
    with open(tmp_path / "killed.log", "w") as log:
        job = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 240
        while not (root / ".step_00000010.partial").exists():
            assert job.poll() is None and time.time() < deadline, (tmp_path / "killed.log").read_text()[-2000:]
            time.sleep(0.005)
        ranks = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
        for pid in ranks:  # torchrun puts its ranks in sessions of their own: kill them by pid
            os.kill(int(pid), signal.SIGKILL)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        assert ranks, "no rank processes found under torchrun"
    assert (root / ".step_00000010.partial").exists(), "the save finished before the kill: nothing was tested"
    assert latest_checkpoint(root) == root / "step_00000005"

    resumed = subprocess.run(args + ["trainer.resume=auto"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step_00000005 at step 5" in resumed.stdout, resumed.stdout[-3000:]
    assert not (root / ".step_00000010.partial").exists()  # cleared by the next save
    assert latest_checkpoint(root) == root / "step_00000010"  # saved again, complete this time


def test_incomplete_checkpoints_are_ignored(tmp_path):
    good = tmp_path / "step_00000004"
    good.mkdir()
    (good / "manifest.json").write_text("{}")
    (tmp_path / ".step_00000008.partial").mkdir()  # a save killed part-way
    (tmp_path / "step_00000012").mkdir()  # shards written, manifest not yet: not complete
    assert latest_checkpoint(tmp_path) == good


@pytest.mark.slow
def test_incompatible_checkpoint_is_refused():
    error = error_of(INCOMPATIBLE.results())
    assert re.search(r"table t_C1: rows 100 in the checkpoint, 200 in this model", error.message), error


@pytest.mark.slow
def test_nonfinite_loss_stops_and_names_the_checkpoint():
    NONFINITE_FIRST.results()
    error = error_of(NONFINITE_DIVERGED.results())
    pattern = r"loss is (nan|inf) in steps 6\.\.6; last good checkpoint: .*step_00000004"
    assert re.search(pattern, error.message), error


def _torchrun(run_dir: Path, *overrides: str) -> subprocess.Popen:
    """torchrun with one restart allowed (its agent hosts the store on a port the kernel picks); output
    goes to run_dir.log (a pipe could fill and block it)."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    log = open(f"{run_dir}.log", "w")
    return subprocess.Popen(
        [
            torchrun,
            "--nproc_per_node=2",
            "--max-restarts=1",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:0",
            "-m",
            "dlrm.train",
            f"hydra.run.dir={run_dir}",
            "trainer.max_steps=40",
            "checkpoint.every_steps=10",
            "trainer.resume=auto",
            "trainer.progress=lines",
            "trainer.log_every_steps=5",
            "trainer.breakdown=false",  # no profiled steps: the test is about the restart
            "trainer.tensorboard=false",
            *overrides,
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop(job: subprocess.Popen) -> None:
    """Kill a torchrun job and its ranks if still running, so a failed test leaves nothing behind."""
    if job.poll() is None:
        for pid in subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        job.kill()
        job.wait()


@pytest.mark.slow
def test_killed_rank_restarts_and_resumes(tmp_path):
    clean = _torchrun(tmp_path / "clean")
    try:
        assert clean.wait(timeout=300) == 0, (tmp_path / "clean.log").read_text()[-3000:]
    finally:
        _stop(clean)

    job = _torchrun(tmp_path / "killed")
    try:
        first = tmp_path / "killed" / "checkpoints" / "step_00000010"
        deadline = time.time() + 240
        while not (first / "manifest.json").exists():
            assert job.poll() is None and time.time() < deadline, "the job ended before its first checkpoint"
            time.sleep(0.005)
        ranks = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
        assert ranks, "no worker processes found under torchrun"
        os.kill(int(ranks[-1]), signal.SIGKILL)
        job.wait(timeout=300)
    finally:
        _stop(job)
    output = (tmp_path / "killed.log").read_text()
    assert job.returncode == 0, output[-3000:]
    assert "resumed from" in output, "the job must have restarted and resumed, not finished first"

    a = export(tmp_path / "clean" / "checkpoints" / "step_00000040", tmp_path / "clean.pt")
    b = export(tmp_path / "killed" / "checkpoints" / "step_00000040", tmp_path / "killed.pt")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_nonfinite_batch_is_skipped_on_every_rank():
    """A NaN in rank 1's slice of batch 3: both ranks drop that batch, and training equals the
    unsharded model trained without it."""
    results = NAN_BATCH.results()
    assert [r["skipped"] for r in results] == [[4], [4]]  # 1-based step 4 = batch 3
    assert_matches_reference(results, *reference(NAN_SKIP, skip_batches=(3,)))
