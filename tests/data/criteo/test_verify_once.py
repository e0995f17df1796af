"""Data verification runs once per node and job, not once per rank (dlrm.data.criteo.verify._once_per_node):
under torchrun the first rank of the node scans the files, the others wait for it and skip; another
job, or a changed file, scans again; a failed scan leaves nothing behind; the console says which."""

from __future__ import annotations

import os
import threading

import pytest

from dlrm.data.criteo import verify
from dlrm.data.criteo.format import CriteoDataError
from tests.helpers.criteo import needs_sample
from tests.helpers.criteo_data import NAMES, TABLE_ROWS, make_dataset, rewrite

pytestmark = needs_sample


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("verify_once") / "data")


@pytest.fixture
def scans(monkeypatch):
    """Counts the content scans (every file's read) that verify_days starts."""
    counted = []
    real = verify.day_scans

    def counting(*args, **kwargs):
        counted.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(verify, "day_scans", counting)
    return counted


def _job(monkeypatch, run_id: str) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")


def _verify(dataset, days=(0, 1), report=None):
    manifest = verify.load_manifest(str(dataset))
    return verify.verify_days(str(dataset), manifest, list(days), NAMES, TABLE_ROWS, report=report)


def test_the_ranks_of_a_node_scan_once_and_say_so(monkeypatch, scans, dataset):
    _job(monkeypatch, f"job-{os.getpid()}-a")
    results, messages = [], []
    ranks = [
        threading.Thread(target=lambda: results.append(_verify(dataset, report=messages.append))) for _ in range(2)
    ]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join()
    assert len(results) == 2 and all(sorted(r) == [0, 1] for r in results)
    assert len(scans) == 2  # the two days, once: by one of the two "ranks"
    assert sum("verified 2 day(s)" in m and "once for this node's ranks" in m for m in messages) == 1, messages
    assert sum("verified by another rank of this node" in m for m in messages) == 1, messages


def test_another_job_or_a_changed_file_scans_again(monkeypatch, scans, dataset):
    _job(monkeypatch, f"job-{os.getpid()}-b")
    _verify(dataset)
    _verify(dataset)
    assert len(scans) == 2
    _job(monkeypatch, f"job-{os.getpid()}-c")
    _verify(dataset)
    assert len(scans) == 4
    path = dataset / "day_1_labels.npy"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1000))
    _verify(dataset)
    assert len(scans) == 6


def test_without_torchrun_every_call_scans(monkeypatch, scans, dataset):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    _verify(dataset)
    _verify(dataset)
    assert len(scans) == 4


def test_a_failed_scan_leaves_no_stamp(monkeypatch, scans, dataset, tmp_path):
    import shutil

    import numpy as np

    bad = tmp_path / "bad"
    shutil.copytree(dataset, bad)
    labels = np.load(bad / "day_0_labels.npy")
    labels[3] = 7
    rewrite(bad, 0, "labels", labels)
    _job(monkeypatch, f"job-{os.getpid()}-d")
    for _ in range(2):  # the second rank scans too, and fails alike
        with pytest.raises(CriteoDataError, match="day_0_labels.npy"):
            _verify(bad, days=(0,))
    assert len(scans) == 2
