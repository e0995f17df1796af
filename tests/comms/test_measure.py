"""The collective benchmark on 2 Gloo ranks over a short sweep, and its input checks."""

import csv
import json
import os
import subprocess
import sys

import pytest

from dlrm.comms.costmodel import CommsError
from dlrm.comms.measure import COLLECTIVES, check_request, group_layout, main, parse_size, sweep_sizes, uneven_splits
from tests.helpers import REPO_ROOT as ROOT
from tests.helpers.cli import TORCHRUN_VARS, assert_one_error
from tests.helpers.families import PAIR, runs

BENCH = PAIR.dir("comms_bench")
SWEEP = ["--min-bytes", "1K", "--max-bytes", "8K", "--warmup", "1", "--iters", "3", "--out", str(BENCH)]


@pytest.mark.slow
@runs(returned=PAIR.job(main, SWEEP))  # the command's main on each rank
def test_bench_two_gloo_ranks_writes_consistent_files(returned):
    out = BENCH
    assert returned[1] is None  # only rank 0 reports and writes
    data = json.loads((out / "bench.json").read_text())
    rows = data["results"]
    assert data["backend"] == "gloo" and data["world_size"] == 2 and rows == returned[0]
    expected = [(c, n) for c in COLLECTIVES for n in (1024, 2048, 4096, 8192)]
    assert [(r["collective"], r["bytes"]) for r in rows] == expected
    for r in rows:
        factor = 1.0 if r["collective"] == "allreduce" else 0.5  # 2(p-1)/p and (p-1)/p at p=2
        assert r["busbw_factor"] == factor
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor)
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / (r["median_us"] * 1e-6) / 1e9)
        assert 0 < r["median_us"] <= r["p95_us"]
    with open(out / "bench.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    assert float(table[3]["busbw_GBps"]) == pytest.approx(rows[3]["busbw_GBps"])
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in out.iterdir()) == ["bench.csv", "bench.json", "bench.png"]  # no .tmp


def test_bad_input_names_the_value_and_the_fix():
    with pytest.raises(CommsError, match="'broadcast'.*allreduce,alltoall"):
        check_request(["broadcast"], [1024], {"world": 2})
    with pytest.raises(CommsError, match="1000 bytes.*alltoall.*3 ranks.*multiple of 12"):
        check_request(["alltoall"], [1000], {"world": 3})
    with pytest.raises(CommsError, match="reduce_scatter.*multiple of 16"):
        check_request(["allreduce", "reduce_scatter"], [1024, 1028], {"world": 4})
    check_request(["allreduce"], [1028], {"world": 3})  # allreduce splits nothing
    with pytest.raises(CommsError, match="empty sweep.*--min-bytes=2048 --max-bytes=1024"):
        sweep_sizes(2048, 1024)
    with pytest.raises(CommsError, match="empty sweep"):
        check_request(["allreduce"], [], {"world": 2})
    with pytest.raises(CommsError, match="'12X'.*64M"):
        parse_size("12X")
    assert parse_size("64M") == 64 * 2**20 and parse_size("1KiB") == 1024
    assert sweep_sizes(1024, 4096) == [1024, 2048, 4096]


def test_a_bad_option_is_a_usage_error_every_rank_meets():
    """argparse's refusal is a UsageError, which every rank meets alike: rank 0 alone prints it (the
    quiet exit under torchrun is checked with our own refusal below)."""
    from dlrm.common.errors import UsageError
    from dlrm.comms.measure import parse_args

    with pytest.raises(UsageError, match="--warmup.*invalid int value: 'x'") as e:
        parse_args(["--warmup", "x"])
    assert e.value.same_on_all_ranks


@pytest.mark.slow  # two processes under torchrun
@pytest.mark.parametrize("args, words", [(["--scopes", "nowhere"], ["'nowhere'", "world"])])
def test_user_error_is_one_line_under_torchrun(args, words):
    """A bad value on 2 ranks: rank 0 prints it, rank 1 and torchrun nothing."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    launch = [sys.executable, "-m", "dlrm.torchrun", "--standalone", "--nproc_per_node=2", "-m", "dlrm.comms.measure"]
    r = subprocess.run([*launch, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert_one_error(r.returncode, r.stdout, r.stderr, *words)


def test_groups_and_uneven_splits():
    assert group_layout(4, 2, 2) == {"world": [[0, 1, 2, 3]], "intra": [[0, 1], [2, 3]], "inter": [[0, 2], [1, 3]]}
    ins, outs = uneven_splits(1024, 4, 1)
    assert ins == [outs[1]] * 4 and outs == [102, 205, 307, 410]  # rank j sends 256 x 2(j+1)/5 to everyone


@pytest.mark.parametrize("kind", ["file", "empty"])
def test_out_that_cannot_be_a_directory_is_refused_before_measuring(monkeypatch, tmp_path, kind):
    """--out an existing file (or empty) is one error before any process group or measurement."""
    out = tmp_path / "results.json"
    out.write_text("keep me")
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(CommsError, match="is a file, not a directory" if kind == "file" else "--out is empty"):
        main(["--out", str(out) if kind == "file" else " "])
    assert out.read_text() == "keep me"
