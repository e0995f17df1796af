"""Hostile input to `python -m dlrm.data.criteo.preprocess`: every case is one `error: ...` line naming the
flag/file and the fix, exit 2, no traceback, and the previous output of the same --out left intact.

A representative subset runs the real CLI in a subprocess; the rest call `main([...])` in-process.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlrm.data.criteo import preprocess as pp
from dlrm.data.criteo.npy import NpyWriter
from tests.helpers.criteo import ROOT, SAMPLE
from tests.helpers.criteo_data import make_dataset, snapshot

pytestmark = pytest.mark.skipif(not SAMPLE.exists(), reason=f"{SAMPLE} not found")


@pytest.fixture
def out(tmp_path):
    """A --out directory holding a complete earlier run (2 days); tests check it survives."""
    return make_dataset(tmp_path / "out")


def run_cli(args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "dlrm.data.criteo.preprocess", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_error(stderr: str, *words) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("preprocess: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def refused_in_process(capsys, out, args, *words) -> str:
    before = snapshot(out)
    assert pp.main([*args, "--out", str(out)]) == 2
    msg = one_error(capsys.readouterr().err, *words)
    assert snapshot(out) == before, "the earlier output is intact"
    return msg


def refused_cli(out, args, *words) -> str:
    before = snapshot(out)
    r = run_cli([*args, "--out", str(out)])
    assert r.returncode == 2, r.stderr
    msg = one_error(r.stderr, *words)
    assert snapshot(out) == before, "the earlier output is intact"
    return msg


S = str(SAMPLE)


# ------------------------------------------------------------------ flags (subprocess for a few)
@pytest.mark.parametrize(
    "args,words",
    [
        (["--block-mb", "0", "--policy", "skip", S], ["--block-mb 0", "(0, 4096]"]),
        (["--workers", "0", S], ["--workers 0", "at least 1"]),
        (["--id-map", "contiguous", "--min-count", "-3", S], ["--min-count -3", ">= 1"]),
    ],
    ids=["block-mb-0-skip", "workers-0", "min-count-neg"],
)
def test_bad_flag_cli(out, args, words):
    refused_cli(out, args, *words)


@pytest.mark.parametrize(
    "args,words",
    [
        (["--block-mb", "-1", S], ["--block-mb -1", "(0, 4096]"]),
        (["--block-mb", "nan", S], ["--block-mb nan"]),
        (["--block-mb", "1e-9", S], ["--block-mb 0", "(0, 4096]"]),
        (["--block-mb", "100000", S], ["--block-mb 100000", "(0, 4096]"]),
        (["--workers", "-1", S], ["--workers -1", "at least 1"]),
        (["--workers", "two", S], ["--workers", "invalid int value", "--help"]),
        (["--id-map", "contiguous", "--min-count", "0", S], ["--min-count 0", ">= 1"]),
        (["--table-sizes", "0", S], ["--table-sizes '0'", "[1, 2^63)"]),
        (["--table-sizes", "-5", S], ["--table-sizes '-5'"]),
        (["--table-sizes", "abc", S], ["--table-sizes 'abc'", "kaggle, 1tb"]),
        (["--table-sizes", str(2**63), S], [f"--table-sizes '{2**63}'"]),
        (["--table-sizes", ",".join(["10"] * 25), S], ["--table-sizes", "26 comma-separated"]),
        (["--table-sizes", "kaggle", "--id-map", "contiguous", S], ["drop --table-sizes"]),
        (["--shuffle-seed", "-1", S], ["--shuffle-seed -1", ">= 0"]),
        (["--progress-every", "0", S], ["--progress-every 0", "positive"]),
        (["--policy", "ignore", S], ["--policy", "invalid choice"]),
        (["--bogus", S], ["unrecognized arguments: --bogus"]),
        ([], ["the following arguments are required: files"]),
    ],
    ids=[
        "block-mb-neg",
        "block-mb-nan",
        "block-mb-tiny",
        "block-mb-huge",
        "workers-neg",
        "workers-text",
        "min-count-0",
        "table-sizes-0",
        "table-sizes-neg",
        "table-sizes-text",
        "table-sizes-2^63",
        "table-sizes-25",
        "contiguous-with-sizes",
        "shuffle-seed-neg",
        "progress-0",
        "policy-choice",
        "unknown-flag",
        "no-files",
    ],
)
def test_bad_flag(capsys, out, args, words):
    refused_in_process(capsys, out, args, *words)


# ------------------------------------------------------------------ input files
def test_same_file_twice_cli(out, tmp_path):
    refused_cli(out, [S, S], "same file", S, "day 0", "day 1", "leakage", "list it once")


def test_same_file_under_two_names(capsys, out, tmp_path):
    link = tmp_path / "link.tsv"
    link.symlink_to(SAMPLE)
    refused_in_process(capsys, out, [S, str(link)], "same file", S, str(link))


def test_directory_as_input_cli(out, tmp_path):
    refused_cli(out, [str(tmp_path)], str(tmp_path), "is a directory", "files inside it")


def test_missing_input(capsys, out, tmp_path):
    refused_in_process(capsys, out, [str(tmp_path / "nope.tsv")], "nope.tsv", "does not exist")


def test_not_a_regular_file(capsys, out, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused_in_process(capsys, out, [str(fifo)], str(fifo), "not a regular file")


def test_unreadable_input(capsys, out, tmp_path, monkeypatch):
    """chmod 000 does not stop root, so the refusal of open() is simulated for that one path."""
    bad = tmp_path / "secret.tsv"
    bad.write_text(SAMPLE.read_text())
    bad.chmod(0)
    real_open = open

    def fake_open(path, *a, **k):
        if os.fspath(path) == str(bad):
            raise PermissionError(errno.EACCES, "Permission denied", str(bad))
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", fake_open)
    refused_in_process(capsys, out, [str(bad)], str(bad), "cannot be read", "Permission denied", "chmod")


# ------------------------------------------------------------------ --out
def test_out_is_a_file_cli(tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep me")
    r = run_cli([S, "--out", str(f)])
    assert r.returncode == 2
    one_error(r.stderr, str(f), "is a file", "give a directory")
    assert f.read_text() == "keep me"


def test_out_below_a_file(capsys, tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep me")
    assert pp.main([S, "--out", str(f / "sub")]) == 2
    one_error(capsys.readouterr().err, str(f / "sub"))
    assert f.read_text() == "keep me"


def test_concurrent_run_on_one_out_cli(out):
    """A second run on the same --out while the first holds its lock is refused, naming the holder."""
    fd = os.open(out / ".preprocess.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.write(fd, b"4242\n")
        msg = refused_cli(
            out, [S, "--force"], str(out), "in use by another preprocess run", "pid 4242", "another --out"
        )
        assert "wait" in msg
    finally:
        os.close(fd)
    r = run_cli([S, "--out", str(out), "--table-sizes", "2000"])  # once released, runs work again
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------ failures part-way keep the old output
def test_failed_rerun_keeps_the_complete_output(capsys, out, tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text(SAMPLE.read_text().split("\n")[0] + "\n\tnot\ta\tline\n")
    # different options: day 0 would be redone, but it fails on its input before any day completes
    refused_in_process(capsys, out, [str(bad), S, "--table-sizes", "3000"], str(bad), "line 2", "--policy skip")
    from dlrm.data.criteo.verify import load_manifest

    assert [d["rows"] for d in load_manifest(str(out))["days"]] == [100, 40]


def disk_full(monkeypatch, after: int):
    """NpyWriter.append raises ENOSPC after `after` successful appends (a full disk, simulated)."""
    calls = {"n": 0}
    real = NpyWriter.append

    def append(self, arr):
        calls["n"] += 1
        if calls["n"] > after:
            raise OSError(errno.ENOSPC, "No space left on device", self.path)
        return real(self, arr)

    monkeypatch.setattr(NpyWriter, "append", append)


@pytest.mark.parametrize("after", [0, 2])
def test_full_disk(capsys, out, monkeypatch, after):
    disk_full(monkeypatch, after)
    msg = refused_in_process(
        capsys,
        out,
        [S, "--force", "--workers", "1", "--table-sizes", "2000"],
        "No space left on device",
        "free space",
        "another --out",
    )
    assert ".tmp_day_0" in msg, "names the file being written"
    assert not list(Path(out).glob(".tmp*")), "no partial files left behind"


def test_full_disk_while_writing_the_manifest(capsys, out, monkeypatch):
    real = pp.write_json_atomic

    def write_json(path, obj):
        if path.endswith("manifest.json"):
            with open(f"{path}.tmp", "w") as f:
                f.write("{")
            raise OSError(errno.ENOSPC, "No space left on device", f"{path}.tmp")
        return real(path, obj)

    monkeypatch.setattr(pp, "write_json_atomic", write_json)
    assert pp.main([S, "--out", str(out), "--force", "--table-sizes", "2000"]) == 2
    one_error(capsys.readouterr().err, "manifest.json.tmp", "No space left on device", "free space")
    assert not (out / "manifest.json").exists(), "a manifest is either complete or absent"


def test_read_only_out(capsys, out, monkeypatch):
    def makedirs(path, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(pp.os, "makedirs", makedirs)
    refused_in_process(capsys, out, [S, "--force"], "Read-only file system", "--out writable")


def test_damaged_day_json_is_redone_not_a_traceback(out):
    """A day_{i}.json that is not what preprocessing wrote marks the day as not done; the re-run redoes it."""
    (out / "day_0.json").write_text('{"input": 5, "files": []}')
    m = pp.preprocess([S], str(out), pp.ParseOptions("fail", "modulo", tuple([2000] * 26)))
    assert m["last_run"]["days_converted"] == [0]


# ------------------------------------------------------------------ the benchmark's files
def test_bench_needs_a_sample(capsys, monkeypatch):
    from dlrm.bench import criteo_preprocess as bench_preprocess

    monkeypatch.delenv("CRITEO_SAMPLE", raising=False)
    with pytest.raises(SystemExit) as e:
        bench_preprocess.main(["--rows", "10"])
    assert e.value.code == 2
    one_error(capsys.readouterr().err, "--sample", "CRITEO_SAMPLE")


def test_bench_uses_a_private_directory_and_removes_it(tmp_path, capsys):
    from dlrm.bench import criteo_preprocess as bench_preprocess

    keep = tmp_path / "ours"  # a name the old benchmark would have rmtree'd under --dir
    keep.mkdir()
    (keep / "precious").write_text("x")
    bench_preprocess.main(
        ["--rows", "300", "--workers", "1", "--dir", str(tmp_path), "--sample", S, "--skip-torchrec", "--batch", "64"]
    )
    assert (keep / "precious").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours"], "the private directory is gone"
    assert "samples/s" in capsys.readouterr().out


@pytest.mark.parametrize("content", ['{"id_map": 5, "days": 3}', "[1, 2]", "{not json"])
def test_damaged_manifest_in_out_is_redone_for_contiguous_ids(out, content):
    """The reuse check of --id-map contiguous reads the old manifest.json: damage means redo, not a traceback."""
    (out / "manifest.json").write_text(content)
    m = pp.preprocess([S], str(out), pp.ParseOptions(), contiguous_min_count=2)
    assert m["id_map"]["kind"] == "contiguous" and m["last_run"]["days_converted"] == [0]
