"""Hostile checkpoints through `trainer.resume`: the trainer refuses before training, with one
message naming the file (or the differing optimizer) and the fix, exit 2, on every rank alike."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from dlrm.checkpoint import CheckpointError
from dlrm.config import Config, validate
from dlrm.distributed.world import World
from tests.helpers.checkpoints import NEW, OLD, SAVED, ckpts, digests, flip, saved_checkpoints
from tests.helpers.cli import train_in_process
from tests.helpers.families import PAIR, Overrides, runs
from tests.helpers.harness import default_group

__all__ = ["ckpts", "saved_checkpoints"]  # fixtures

RUN = [
    "model=tiny",
    "sharding=table_wise",
    "data.global_batch_size=96",
    "data.eval_batches=1",
    "trainer.max_steps=6",
    "trainer.progress=none",
]


def resume_error(cfg: Config) -> str:
    """On each rank: build a trainer that resumes (cfg.trainer.resume); the CheckpointError it raises."""
    from dlrm.trainer.build import build

    validate(cfg)
    try:
        build(cfg, World.from_env())
    except CheckpointError as e:
        return str(e)
    raise AssertionError("the checkpoint was loaded")


def resume_error_of_a_flipped_copy(cfg: Config, saved: str, copy: str, file: str) -> str:
    """On each rank: rank 0 copies the checkpoints directory `saved` to `copy` and flips one byte of
    `file` (relative to it); then `resume_error` of cfg (which resumes from the copy)."""
    if World.from_env().rank == 0:
        shutil.copytree(saved, copy)
        flip(Path(copy) / file, 100)
    torch.distributed.barrier(group=default_group())
    return resume_error(cfg)


def train_cli(capfd, tmp_path: Path, *overrides: str) -> tuple[int, str]:
    """`python -m dlrm.train` in one process (no torchrun), run in the test process: (exit status, stderr)."""
    code, _, err = train_in_process(capfd, *RUN, f"hydra.run.dir={tmp_path / 'run'}", *overrides)
    return code, err


def assert_one_error(result: tuple[int, str], run_dir: Path, *names: str) -> None:
    """Exit 2, one `error:` line naming `names`, no traceback, no training outputs."""
    code, stderr = result
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert code == 2, stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    for name in names:
        assert name in errors[0], (name, errors[0])
    assert not (run_dir / "summary.json").exists() and not (run_dir / "checkpoints").exists()


@pytest.mark.slow
def test_resume_from_a_corrupt_checkpoint_is_refused(ckpts, tmp_path, capfd):
    before = digests(ckpts / OLD)
    corrupt = ckpts / NEW / "__0_0.distcp"
    flip(corrupt, corrupt.stat().st_size // 2)
    result = train_cli(capfd, tmp_path, "optim=rowwise_adagrad", f"trainer.resume={ckpts / NEW}")
    assert_one_error(result, tmp_path / "run", str(ckpts / NEW / "__0_0.distcp"), f"trainer.resume={ckpts / OLD}")
    assert digests(ckpts / OLD) == before


@pytest.mark.slow
def test_resume_with_another_optimizer_is_refused(ckpts, tmp_path, capfd):
    result = train_cli(capfd, tmp_path, "optim=sgd", f"trainer.resume={ckpts / NEW}")
    assert_one_error(
        result,
        tmp_path / "run",
        "optim.embedding.name: rowwise_adagrad in the checkpoint, sgd in this run",
        "optim.dense.name: adagrad in the checkpoint, sgd in this run",
        "resume with the same optim",
    )


FLIPPED = PAIR.dir("refused_alike")  # a copy of the saved checkpoints, __1_0.distcp flipped


@pytest.mark.slow
@runs(
    saved=SAVED,
    messages=PAIR.job(
        resume_error_of_a_flipped_copy,
        Overrides(*RUN, "optim=rowwise_adagrad", f"trainer.resume={FLIPPED / NEW}"),
        str(PAIR.dir("saved_checkpoints")),
        str(FLIPPED),
        f"{NEW}/__1_0.distcp",
    ),
)
def test_every_rank_refuses_alike(saved, messages):
    """Rank 1 hashes __1_0.distcp; both ranks raise its error (rank 0 is the one that prints)."""
    assert messages[0] == messages[1] and f"{FLIPPED / NEW / '__1_0.distcp'} is corrupt" in messages[0]
