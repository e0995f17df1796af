"""Where a command writes is checked before it starts, and a bad place is one line, exit 2, with
nothing lost: a run directory or checkpoint directory that is a file or empty, trainer.resume=auto
that could never find its checkpoints, a checkpoint past trainer.max_steps, the export command's
bad arguments, a symlink planted as the preprocessing lock."""

from __future__ import annotations

import pytest

from dlrm.data.criteo.format import CriteoDataError
from dlrm.data.criteo.preprocess import _locked
from dlrm.export import main as export_main
from tests.helpers.checkpoints import NEW, ckpts, saved_checkpoints
from tests.helpers.cli import assert_one_error, main_in_process

__all__ = ["ckpts", "saved_checkpoints"]  # fixtures

RUN = ("model=tiny", "data.global_batch_size=96", "trainer.max_steps=2", "trainer.progress=none")


def test_resume_auto_without_a_stable_run_is_one_error(monkeypatch, capsys):
    result = main_in_process(monkeypatch, capsys, *RUN, "trainer.resume=auto")
    assert_one_error(*result, "trainer.resume=auto", "run.name=")


@pytest.mark.parametrize("key", ["hydra.run.dir", "checkpoint.dir"])
def test_a_run_or_checkpoint_directory_that_is_a_file_is_one_error(monkeypatch, capsys, tmp_path, key):
    file = tmp_path / "taken"
    file.write_text("keep me")
    extra = () if key == "hydra.run.dir" else (f"hydra.run.dir={tmp_path / 'run'}",)
    result = main_in_process(monkeypatch, capsys, *RUN, *extra, f"{key}={file}")
    assert_one_error(*result, f"{key}={file}", "is a file")
    assert file.read_text() == "keep me"


def test_an_empty_run_directory_is_one_error(monkeypatch, capsys):
    assert_one_error(*main_in_process(monkeypatch, capsys, *RUN, "hydra.run.dir="), "hydra.run.dir is empty")


def test_a_checkpoint_past_max_steps_is_one_error(monkeypatch, capsys, ckpts, tmp_path):
    args = (*RUN, "sharding=table_wise", "optim=rowwise_adagrad", f"hydra.run.dir={tmp_path / 'run'}")
    result = main_in_process(monkeypatch, capsys, *args, f"trainer.resume={ckpts / NEW}")
    assert_one_error(*result, "at step 4, past trainer.max_steps=2", "trainer.eval_only=true")


@pytest.mark.parametrize("argv", [[], ["only_one"], ["a", "b", "--bogus"]])
def test_the_export_commands_bad_arguments_are_one_line(capsys, argv):
    assert export_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "--help" in err, err


def test_the_preprocessing_lock_never_follows_a_planted_symlink(tmp_path):
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".preprocess.lock").symlink_to(precious)
    with pytest.raises(CriteoDataError, match="lock"):
        with _locked(str(out)):
            pass
    assert precious.read_text() == "keep me"
