"""`python -m dlrm.data.criteo.check DIR`: the loader's verification of a preprocessed directory, one line per day."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from dlrm.data.criteo.check import main
from dlrm.data.criteo.format import ParseOptions
from dlrm.data.criteo.preprocess import preprocess
from tests.helpers import REPO_ROOT as REPO
from tests.helpers.criteo import SAMPLE

pytestmark = pytest.mark.skipif(not SAMPLE.exists(), reason=f"{SAMPLE} not found")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The sample (day 0, 100 rows) and its first 40 lines (day 1), ids hashed into 2,000 rows."""
    root = tmp_path_factory.mktemp("check")
    half = root / "half.tsv"
    half.write_text("\n".join(SAMPLE.read_text().split("\n")[:40]) + "\n")
    preprocess([str(SAMPLE), str(half)], str(root / "out"), ParseOptions("fail", "modulo", (2000,) * 26))
    return root / "out"


def check(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def refused(rc, out, err, *words):
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, (rc, out, err)
    for w in words:
        assert w in err, err


def test_a_good_directory_passes_with_one_line_per_day(data, capsys):
    rc, out, err = check(capsys, data)
    assert rc == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0].startswith("day 0: 100 rows, 3 files") and "sha256 checked" in lines[0]
    assert lines[1].startswith("day 1: 40 rows, 3 files")
    assert lines[2] == f"{data}: 140 rows ok" and len(lines) == 3
    rc, out, _ = check(capsys, data, "--no-checksums")
    assert rc == 0 and "no checksums" in out


def test_damage_is_refused_with_the_file(data, capsys, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    labels = bad / "day_1_labels.npy"
    raw = bytearray(labels.read_bytes())
    raw[-4] ^= 1  # a label 0 <-> 1: only the checksum can tell
    labels.write_bytes(bytes(raw))
    refused(*check(capsys, bad), str(labels), "sha256")
    assert check(capsys, bad, "--no-checksums")[0] == 0
    raw[-4] = 7
    labels.write_bytes(bytes(raw))
    refused(*check(capsys, bad, "--no-checksums"), str(labels), "label 7")
    (bad / "day_1_dense.npy").write_bytes((bad / "day_1_dense.npy").read_bytes()[:-8])
    refused(*check(capsys, bad), "day_1_dense.npy", "truncated")


def test_ids_beyond_a_models_tables_and_bad_arguments(data, capsys, tmp_path):
    ids = np.load(data / "day_0_sparse.npy")
    limit = int(ids[:, 0].max())  # the largest C1 id equals the limit: one past the table
    refused(
        *check(capsys, data, "--table-sizes", ",".join([str(limit)] + ["2000"] * 25)),
        "day_0_sparse.npy",
        "C1",
        f"only {limit} rows",
    )
    refused(*check(capsys, tmp_path / "absent"), "manifest.json", "not found")
    refused(*check(capsys, data, "--table-sizes", "0"), "--table-sizes")
    refused(*check(capsys, data, "--bogus"), "--bogus")


def test_the_command_line(data):
    r = subprocess.run(
        [sys.executable, "-m", "dlrm.data.criteo.check", str(data)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.count("\n") == 3 and r.stderr == "", r.stderr
