"""Bounds on what a command takes: an overlong or non-portable run.name, a run directory whose names or
path pass the filesystem's limits, and an absurd world for dlrm.plan are each one `error:` line
(exit 2) before any work; a corrupted sparse .npy is blamed on its checksum, not on the table size."""

from __future__ import annotations

import numpy as np
import pytest

from dlrm.config import CriteoConfig
from dlrm.data.criteo.loader import CriteoDataError, CriteoSource
from dlrm.plan.cli import main as plan_main
from tests.helpers.cli import assert_one_error, main_in_process
from tests.helpers.criteo import SAMPLE
from tests.helpers.criteo_data import GBS, NAMES, TABLE_ROWS, make_dataset

RUN = ("model=tiny", "trainer.max_steps=1", "trainer.progress=none")
ALLOWED = "letters, digits, '.', '_' and '-'"


@pytest.mark.parametrize("name", ["r" * 300, "'naïve'", "a b", "-x"])
def test_an_overlong_or_non_portable_run_name_is_one_line(monkeypatch, capsys, tmp_path, name):
    monkeypatch.chdir(tmp_path)
    line = assert_one_error(*main_in_process(monkeypatch, capsys, *RUN, f"run.name={name}"), "run.name", ALLOWED)
    assert "255" in line and len(line) < 400
    assert not (tmp_path / "outputs").exists()


def test_a_run_directory_beyond_the_filesystems_limits_is_one_line(monkeypatch, capsys, tmp_path):
    long_name = tmp_path / ("d" * 256)
    assert_one_error(*main_in_process(monkeypatch, capsys, *RUN, f"hydra.run.dir={long_name}"), "hydra.run.dir", "255")
    deep = tmp_path.joinpath(*["d" * 200] * 20)  # every name fits, the path does not
    assert_one_error(
        *main_in_process(monkeypatch, capsys, *RUN, f"checkpoint.dir={deep}", f"hydra.run.dir={tmp_path}/r"),
        "checkpoint.dir",
        "4096",
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "args",
    [
        ["topology.nodes=131072", "--ranks-per-node", "8", "data.global_batch_size=1048576"],  # one sample a rank
        ["--ranks-per-node", "1000000"],
    ],
)
def test_dlrm_plan_refuses_an_absurd_world_in_one_line(capsys, args):
    code = plan_main(["model=tiny", *args])
    out, err = capsys.readouterr()
    assert_one_error(code, out, err, "65,536", "ranks")


def test_dlrm_plan_refuses_an_absurd_scale_in_one_line(capsys):
    code = plan_main(["model=tiny", "topology.ranks_per_node=1", "--scale", "1,1000000"])
    out, err = capsys.readouterr()
    assert_one_error(code, out, err, "--scale", "1000000", "65,536")


@pytest.mark.skipif(not SAMPLE.exists(), reason=f"{SAMPLE} not found")
def test_a_corrupted_sparse_file_is_blamed_on_its_checksum(tmp_path):
    directory = make_dataset(tmp_path / "out")
    sparse = directory / "day_0_sparse.npy"
    ids = np.load(sparse, mmap_mode="r+")
    ids[3, 5] = TABLE_ROWS[5] + 1000  # a flipped bit: an id beyond its table
    ids.flush()
    del ids

    def source(checksums: bool) -> CriteoSource:
        cfg = CriteoConfig(dir=str(directory), train_days=[0], verify_checksums=checksums)
        return CriteoSource(cfg, NAMES, list(TABLE_ROWS), GBS, seed=0)

    with pytest.raises(CriteoDataError, match="sha256") as e:
        source(checksums=True)
    assert str(sparse) in str(e.value) and "rows in the model config" not in str(e.value)
    with pytest.raises(CriteoDataError, match="has only") as e:  # without checksums: what the data say
        source(checksums=False)
