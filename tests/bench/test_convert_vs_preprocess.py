"""dlrm/bench/convert_vs_preprocess.py writes the same rows for both commands and reports both speeds."""

import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT
from tests.helpers.criteo import SAMPLE, needs_sample


@needs_sample
@pytest.mark.slow
def test_both_commands_run_on_the_same_rows(tmp_path):
    args = [
        sys.executable,
        "-m",
        "dlrm.bench.convert_vs_preprocess",
        "--rows",
        "3000",
        "--rounds",
        "1",
        "--sample",
        str(SAMPLE),
        "--dir",
        str(tmp_path),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("3,000 rows")
    assert any(line.startswith("round 1 preprocess") for line in lines)
    assert any(line.startswith("round 1 convert") for line in lines)
    assert lines[-1].startswith("convert / preprocess speed: ")
    assert list(tmp_path.iterdir()) == []  # its files are removed


def test_the_rows_vary_their_ids_and_match_between_the_two_files(tmp_path):
    from dlrm.bench.convert_vs_preprocess import HEADER, write_rows

    sample = tmp_path / "sample.tsv"
    sample.write_text("1\t5" + "\t" * 12 + "\t0000000a" * 26 + "\n")
    raw, headed = tmp_path / "raw.tsv", tmp_path / "headed.tsv"
    write_rows(sample, 3, raw, headed)
    rows = raw.read_text().splitlines()
    assert headed.read_text().splitlines() == ["\t".join(HEADER), *rows]
    assert [r.split("\t")[14] for r in rows] == ["0000000a", "0000000b", "00000008"]  # 10 ^ 0, 1, 2
