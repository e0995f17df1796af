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
from tests.helpers.cli import train_in_process
from tests.helpers.equivalence import assert_matches_reference, reference, tiny
from tests.helpers.families import PAIR, SINGLE, TWO_NODES, Overrides, error_of, runs
from tests.helpers.workers import build_trainer, pieces_of, summary_and_records, train_and_report, train_summary


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


class _NaNInjector:
    """A batch source whose global batch `index` has a NaN dense feature in rank `rank`'s slice."""

    def __init__(self, source, index: int, rank: int) -> None:
        self.source, self.index, self.rank = source, index, rank

    def num_batches(self, split):
        return self.source.num_batches(split)

    def batches(self, split, rank, world_size, start_step=0):
        for step, batch in enumerate(self.source.batches(split, rank, world_size, start_step), start_step):
            if split == "train" and step == self.index and rank == self.rank:
                batch.dense_features[0, 0] = float("nan")
            yield batch


def train_with_a_nan_batch(cfg, index: int, rank: int) -> dict:
    """On each rank: train, with a NaN in rank `rank`'s slice of global batch `index` (the trainer's
    source replaced); the losses, this rank's pieces of the weights and the skipped steps."""
    from dlrm.trainer.loop import train

    trainer = build_trainer(cfg)
    trainer.source = _NaNInjector(trainer.source, index, rank)
    train(trainer)
    return {"losses": trainer.losses, "pieces": pieces_of(trainer.model), "skipped": trainer.skipped_steps}


AT_4 = PAIR.dir("ckpt_a") / "step_00000004"


@pytest.mark.slow
@runs(
    whole=PAIR.job(train_and_report, ckpt_config(PAIR.dir("ckpt_a"), "sharding=table_wise", "checkpoint.keep=3")),
    resumed=PAIR.job(
        train_and_report, ckpt_config(PAIR.dir("ckpt_b"), "sharding=table_wise", f"trainer.resume={AT_4}")
    ),
)
def test_resume_equals_uninterrupted(whole, resumed):
    assert resumed[0]["losses"] == whole[0]["losses"][4:]  # bit-exact: same maths, same order
    a, b = gather(whole), gather(resumed)
    for name in a:
        for (off_a, t_a), (off_b, t_b) in zip(sorted(a[name], key=lambda p: p[0]), sorted(b[name], key=lambda p: p[0])):
            assert off_a == off_b and torch.equal(t_a, t_b), name


SAVED_TABLE_WISE = PAIR.job(train_summary, ckpt_config(PAIR.dir("ckpt_tw"), "sharding=table_wise"))


def evaluate_on_another_plan(family, sharding):
    """An eval-only run of SAVED_TABLE_WISE's last checkpoint with `sharding` on `family`'s ranks."""
    topology = "topology=cpu_2x2" if family is TWO_NODES else "topology=cpu"
    last = PAIR.dir("ckpt_tw") / "step_00000012"
    cfg = ckpt_config(
        family.dir("resharded"), f"sharding={sharding}", topology, f"trainer.resume={last}", "trainer.eval_only=true"
    )
    return family.job(summary_and_records, cfg, family.dir(f"resharded_run_{sharding}"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, sharding",
    [(SINGLE, "row_wise"), (TWO_NODES, "row_wise"), (PAIR, "column_wise")],
    ids=["1x1-row_wise", "2x2-row_wise", "1x2-column_wise"],
)
@runs(saved=SAVED_TABLE_WISE, resharded=evaluate_on_another_plan)
def test_resharding_keeps_the_eval_loss(family, sharding, saved, resharded):
    loaded, records = resharded[0]["summary"], resharded[0]["records"]
    assert loaded["eval_logloss"] == pytest.approx(saved[0]["eval_logloss"], rel=1e-6)
    assert loaded["eval_auc"] == pytest.approx(saved[0]["eval_auc"], rel=1e-6)
    # eval_only records its evaluation in metrics.jsonl too: a start at the checkpoint's step, then the eval.
    assert [{k: r[k] for k in ("event", "step", "resumed")} for r in records[:1]] == [
        {"event": "start", "step": 12, "resumed": True}
    ]
    assert [(r["step"], r["eval_auc"]) for r in records[1:]] == [(12, loaded["eval_auc"])]


@pytest.mark.slow
@runs(results=PAIR.job(train_and_report, ckpt_config(PAIR.dir("ckpt_c"), "sharding=row_wise")))
def test_export_is_the_unsharded_model(tmp_path, results):
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
def test_kill_during_a_save_leaves_the_previous_checkpoint(tmp_path, capfd):
    """SIGKILL the whole 2-rank job while DCP writes a 170 MB checkpoint; resume=auto (here in one
    process, the test's) takes the one before."""
    run_dir, root = tmp_path / "run", tmp_path / "run" / "checkpoints"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    args = [
        "model=bench_cpu",
        f"hydra.run.dir={run_dir}",
        "trainer.max_steps=10",
        "checkpoint.every_steps=5",
        "trainer.progress=none",
        "trainer.breakdown=false",
        "trainer.tensorboard=false",
    ]
    with open(tmp_path / "killed.log", "w") as log:
        job = subprocess.Popen(
            [torchrun, "--standalone", "--nproc_per_node=2", "-m", "dlrm.train", *args],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
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

    code, out, err = train_in_process(capfd, *args, "trainer.resume=auto", cwd=REPO)
    assert code == 0, err[-3000:]
    assert "step_00000005 at step 5" in out, out[-3000:]
    assert not (root / ".step_00000010.partial").exists()  # cleared by the next save
    assert latest_checkpoint(root) == root / "step_00000010"  # saved again, complete this time


def test_incomplete_checkpoints_are_ignored(tmp_path):
    good = tmp_path / "step_00000004"
    good.mkdir()
    (good / "manifest.json").write_text("{}")
    (tmp_path / ".step_00000008.partial").mkdir()  # a save killed part-way
    (tmp_path / "step_00000012").mkdir()  # shards written, manifest not yet: not complete
    assert latest_checkpoint(tmp_path) == good


FOUR_STEPS = SINGLE.dir("ckpt_d") / "step_00000004"


@pytest.mark.slow
@runs(
    saved=SINGLE.job(train_summary, ckpt_config(SINGLE.dir("ckpt_d"), "trainer.max_steps=4")),
    refused=SINGLE.job(
        train_summary,
        ckpt_config(
            SINGLE.dir("ckpt_e"), f"trainer.resume={FOUR_STEPS}", "model.tables.0.rows=200"
        ),  # only the rows differ
        expect_error=True,
    ),
)
def test_incompatible_checkpoint_is_refused(saved, refused):
    error = error_of(refused)
    assert re.search(r"table t_C1: rows 100 in the checkpoint, 200 in this model", error.message), error


DIVERGING = ("optim=sgd", "optim.dense.lr=1e30", "optim.embedding.lr=1e30", "trainer.resume=auto")


@pytest.mark.slow
@runs(
    first=SINGLE.job(train_summary, ckpt_config(SINGLE.dir("nonfinite"), "optim=sgd", "trainer.max_steps=4")),
    diverged=SINGLE.job(train_summary, ckpt_config(SINGLE.dir("nonfinite"), *DIVERGING), expect_error=True),
)
def test_nonfinite_loss_stops_and_names_the_checkpoint(first, diverged):
    error = error_of(diverged)
    pattern = r"loss is (nan|inf) in steps 6\.\.6; last good checkpoint: .*step_00000004"
    assert re.search(pattern, error.message), error


# The job of test_killed_rank_restarts_and_resumes, as overrides: the killed run's command line and,
# on the PAIR family's ranks, its uninterrupted twin.
RESTART_JOB = (
    "trainer.max_steps=20",
    "checkpoint.every_steps=10",
    "trainer.resume=auto",
    "trainer.progress=lines",
    "trainer.log_every_steps=5",
    "trainer.breakdown=false",  # no profiled steps: the test is about the restart
    "trainer.tensorboard=false",
)


def _torchrun(run_dir: Path) -> subprocess.Popen:
    """RESTART_JOB under torchrun with one restart allowed (its agent hosts the store on a port the kernel
    picks); output goes to run_dir.log (a pipe could fill and block it)."""
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
            *RESTART_JOB,
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
@runs(clean=PAIR.job(train_summary, Overrides(f"checkpoint.dir={PAIR.dir('restart_clean')}", *RESTART_JOB)))
def test_killed_rank_restarts_and_resumes(tmp_path, clean):
    """A rank SIGKILLed after the first checkpoint: torchrun restarts the job, which resumes and ends
    with the weights of an uninterrupted run of the same job (on the PAIR family's 2 ranks)."""
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

    a = export(PAIR.dir("restart_clean") / "step_00000020", tmp_path / "clean.pt")
    b = export(tmp_path / "killed" / "checkpoints" / "step_00000020", tmp_path / "killed.pt")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)


NAN_SKIP = tiny("sharding=row_wise", "trainer.pipeline=false", "trainer.on_nonfinite=skip")


@pytest.mark.slow
@runs(results=PAIR.job(train_with_a_nan_batch, NAN_SKIP, 3, 1))
def test_nonfinite_batch_is_skipped_on_every_rank(results):
    """A NaN in rank 1's slice of batch 3: both ranks drop that batch, and training equals the
    unsharded model trained without it."""
    assert [r["skipped"] for r in results] == [[4], [4]]  # 1-based step 4 = batch 3
    assert_matches_reference(results, *reference(NAN_SKIP, skip_batches=(3,)))
