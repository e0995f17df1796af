"""Self-contained export and the scorer (`python -m dlrm.predict`) on the real Criteo sample rows.

One module fixture: the 100 sample rows preprocessed (ids hashed into 2,000 rows), a one-process
training of dlrm_small (in the test process) on the first 80 with a checkpoint, and its export; the
checkpoint directory is then deleted, so everything below runs from the export file alone.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dlrm.data.criteo.format import ParseOptions
from dlrm.data.criteo.preprocess import preprocess
from dlrm.export import content_sha256, export, load_exported
from tests.helpers import REPO_ROOT as REPO
from tests.helpers.cli import predict_in_process as predict
from tests.helpers.cli import train_quietly
from tests.helpers.criteo import SAMPLE

pytestmark = pytest.mark.skipif(not SAMPLE.exists(), reason=f"{SAMPLE} not found")
GBS, EVAL_FRACTION = 8, 0.2  # 80 train rows, 20 held out: the trainer's eval scores 2 full batches (16 rows)


def run(*args, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(data dir, run dir, exported model file)."""
    root = tmp_path_factory.mktemp("predict")
    data, run_dir, model = root / "data", root / "run", root / "model.pt"
    preprocess([str(SAMPLE)], str(data), ParseOptions("fail", "modulo", (2000,) * 26))
    ckpt = train_quietly(
        run_dir,
        20,
        "data=criteo_kaggle",
        f"data.criteo.dir={data}",
        f"data.criteo.eval_fraction={EVAL_FRACTION}",
        f"data.global_batch_size={GBS}",
        "data.eval_batches=100",
    )
    export(ckpt, model)
    shutil.rmtree(ckpt.parent)
    return data, run_dir, model


def metrics(stdout: str) -> tuple:
    words = stdout.split()
    auc = words[words.index("auc") + 1]
    return (None if auc == "n/a" else float(auc)), float(words[words.index("logloss") + 1])


def test_scores_of_the_export_equal_the_trainers_eval(trained, capsys, tmp_path):
    data, run_dir, model = trained
    summary = json.loads((run_dir / "summary.json").read_text())
    eval_rows = (20 // GBS) * GBS  # the trainer drops the last partial eval batch
    rc, out, err = predict(
        capsys,
        model,
        "--data",
        data,
        "--eval-fraction",
        EVAL_FRACTION,
        "--max-rows",
        eval_rows,
        "--batch-size",
        GBS,
        "--out",
        tmp_path / "scores.npy",
    )
    assert rc == 0, err
    auc, logloss = metrics(out)
    assert summary["eval_auc"] is not None and auc == pytest.approx(summary["eval_auc"], abs=1e-6)
    assert logloss == pytest.approx(summary["eval_logloss"], rel=1e-5)
    scores = np.load(tmp_path / "scores.npy", allow_pickle=False)
    assert scores.dtype == np.float32 and scores.shape == (eval_rows,) and ((scores > 0) & (scores < 1)).all()
    labels = np.load(data / "day_0_labels.npy")[80 : 80 + eval_rows, 0]
    p = scores.astype(np.float64).clip(1e-7, 1 - 1e-7)  # the printed log loss is that of the written scores
    assert -np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)) == pytest.approx(logloss, rel=1e-4)
    assert not list(tmp_path.glob(".*tmp"))  # written atomically: no temporary left


def test_scoring_the_raw_tsv_equals_scoring_its_preprocessed_directory(trained, capsys, tmp_path):
    data, _, model = trained
    rc, out_dir, err = predict(capsys, model, "--data", data, "--out", tmp_path / "dir.npy", "--batch-size", 32)
    assert rc == 0, err
    rc, out_tsv, err = predict(
        capsys, model, "--data", SAMPLE, "--options-from", data, "--out", tmp_path / "tsv.npy", "--batch-size", 32
    )
    assert rc == 0, err
    rc, out_flags, err = predict(
        capsys, model, "--data", SAMPLE, "--table-sizes", "2000", "--out", tmp_path / "flags.npy", "--batch-size", 32
    )
    assert rc == 0, err
    by_dir = np.load(tmp_path / "dir.npy")
    assert by_dir.shape == (100,)
    np.testing.assert_allclose(np.load(tmp_path / "tsv.npy"), by_dir, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.load(tmp_path / "flags.npy"), by_dir, rtol=1e-6, atol=1e-7)
    assert metrics(out_tsv) == pytest.approx(metrics(out_dir), rel=1e-6) == metrics(out_flags)
    # Kaggle's test.txt has no label column: the same rows without it score alike, with no metrics
    unlabeled = tmp_path / "test.txt.gz"
    lines = SAMPLE.read_text().splitlines()
    unlabeled.write_bytes(gzip.compress("".join(ln.split("\t", 1)[1] + "\n" for ln in lines).encode()))
    rc, out, err = predict(
        capsys, model, "--data", unlabeled, "--table-sizes", "2000", "--out", tmp_path / "u.npy", "--batch-size", 32
    )
    assert rc == 0, err
    assert "auc" not in out and "scored 100 rows" in out
    np.testing.assert_allclose(np.load(tmp_path / "u.npy"), by_dir, rtol=1e-6, atol=1e-7)


def test_the_export_alone_loads_weights_only_in_a_fresh_process(trained, tmp_path):
    _, run_dir, model = trained
    assert not (run_dir / "checkpoints").exists()
    alone = tmp_path / "elsewhere" / "m.pt"
    alone.parent.mkdir()
    shutil.copy(model, alone)
    script = f"""
import torch
d = torch.load({str(alone)!r}, weights_only=True)
def plain(x):
    if isinstance(x, dict): return all(isinstance(k, str) and plain(v) for k, v in x.items())
    if isinstance(x, list): return all(plain(v) for v in x)
    return x is None or isinstance(x, (str, int, float, bool, torch.Tensor))
assert plain(d), "not plain data"
assert d["format"] == "dlrm-export" and d["model"]["interaction"] == "dot"
assert [t["rows"] for t in d["tables"]] == [2000] * 26 and d["tables"][2]["features"] == ["C3"]
from dlrm.data.criteo.format import ParseOptions
from dlrm.data.criteo.preprocess import preprocess
from dlrm.export import content_sha256, export, load_exported
m = load_exported({str(alone)!r})
sd = m.state_dict()
assert set(sd) == set(d["state_dict"]) and all(torch.equal(sd[k], v) for k, v in d["state_dict"].items())
assert not any(t.is_meta for t in sd.values())
print("ok", d["step"])
"""
    r = run("-c", script, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["ok", "20"], r.stderr[-2000:]


# ---------------------------------------------------------------- hostile input: one line, exit 2
def assert_one_line(rc, out, err, *words):
    assert rc == 2 and out == "", (rc, out, err)
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def damaged_exports(model: Path, tmp_path: Path):
    """(file, words its refusal must name) for each way an export can be wrong."""
    good = torch.load(model, weights_only=True)
    cases = []

    def save(name, obj, *words, sign=True):
        """Crafted content with a matching sha256 (sign): the structural checks must catch it."""
        p = tmp_path / name
        if sign and isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
            obj = {**obj, "sha256": content_sha256(obj)}
        torch.save(obj, p)
        cases.append((p, (str(p), *words)))

    raw = model.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(raw[: len(raw) // 2])
    cases.append((tmp_path / "truncated.pt", (str(tmp_path / "truncated.pt"), "re-export")))
    mid = len(raw) // 2  # inside the embedding tables' bytes
    (tmp_path / "flipped.pt").write_bytes(raw[:mid] + bytes([raw[mid] ^ 0x10]) + raw[mid + 1 :])
    cases.append((tmp_path / "flipped.pt", ("sha256",)))
    (tmp_path / "empty.pt").write_bytes(b"")
    cases.append((tmp_path / "empty.pt", ("re-export",)))
    save("bare_state_dict.pt", good["state_dict"], "older export")
    save("object.pt", {"format": "dlrm-export", "x": shutil.copy}, "weights-only")  # a pickled callable: never run
    save("version.pt", {**good, "version": 99}, "version 99")
    save("edited.pt", {**good, "step": 7}, "sha256", sign=False)
    save("bad_config.pt", {**good, "model": {**good["model"], "interaction": 3, "bottom_mlp": "x"}}, "model config")
    save("tables.pt", {**good, "tables": good["tables"][:-1]}, "'tables'")
    sd = dict(good["state_dict"])
    name = next(k for k in sd if "embedding_bags" in k)
    save("shape.pt", {**good, "state_dict": {**sd, name: sd[name][:10]}}, name, "[10, 16]", "[2000, 16]")
    save("missing.pt", {**good, "state_dict": {k: v for k, v in sd.items() if k != name}}, "missing", name)
    nan = sd[name].clone()
    nan[5, 3] = float("nan")
    save("nan.pt", {**good, "state_dict": {**sd, name: nan}}, name, "NaN")
    save("list.pt", [1, 2], "'format'")
    save("sparse.pt", {**good, "state_dict": {**sd, name: sd[name].to_sparse()}}, name, "sparse", sign=False)
    return cases


def test_damaged_or_wrong_export_files_are_refused(trained, capsys, tmp_path):
    data, _, model = trained
    for path, words in damaged_exports(model, tmp_path):
        assert_one_line(*predict(capsys, path, "--data", data), *words)
        with pytest.raises(Exception) as e:
            load_exported(path)
        assert type(e.value).__name__ == "UserError", (path, e.value)
    assert_one_line(*predict(capsys, tmp_path / "absent.pt", "--data", data), "absent.pt", "dlrm.export")
    assert_one_line(*predict(capsys, tmp_path, "--data", data), "directory")


def test_bad_data_and_flags_are_refused(trained, capsys, tmp_path):
    data, _, model = trained
    assert_one_line(*predict(capsys, model), "--data")
    assert_one_line(*predict(capsys, model, "--data", tmp_path / "nope"), "nope", "does not exist")
    bad = tmp_path / "bad.tsv"
    lines = SAMPLE.read_text().splitlines()
    lines[6] = lines[6].replace("\t", "\tzz", 1)  # line 7: a dense value that is not a number
    bad.write_text("\n".join(lines) + "\n")
    assert_one_line(
        *predict(capsys, model, "--data", bad, "--table-sizes", "2000"), f"{bad}, line 7, field I1", "--policy skip"
    )
    rc, out, err = predict(capsys, model, "--data", bad, "--table-sizes", "2000", "--policy", "skip")
    assert rc == 0 and "scored 99 rows" in out and "1 bad lines skipped" in out, (out, err)
    assert_one_line(*predict(capsys, model, "--data", bad), "--options-from", "--table-sizes")
    assert_one_line(*predict(capsys, model, "--data", SAMPLE, "--table-sizes", "kaggle"), "C3", "2000 rows")
    truncated = tmp_path / "t.tsv.gz"
    truncated.write_bytes(gzip.compress(SAMPLE.read_bytes())[:-40])
    assert_one_line(*predict(capsys, model, "--data", truncated, "--table-sizes", "2000"), str(truncated), "gzip")
    assert_one_line(*predict(capsys, model, "--data", data, "--days", "3"), "--days", "[0]")
    assert_one_line(*predict(capsys, model, "--data", data, "--days", "0,0"), "--days 0,0", "more than once")
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    assert_one_line(*predict(capsys, model, "--data", empty, "--table-sizes", "2000"), "no rows to score")
    all_bad = tmp_path / "all_bad.tsv"
    all_bad.write_text("x\ty\n")
    words = ("no rows to score", "1 bad lines skipped")
    assert_one_line(*predict(capsys, model, "--data", all_bad, "--table-sizes", "2000", "--policy", "skip"), *words)
    assert_one_line(*predict(capsys, model, "--data", data, "--eval-fraction", "1.5"), "--eval-fraction")
    assert_one_line(*predict(capsys, model, "--data", data, "--batch-size", "0"), "--batch-size")
    assert_one_line(*predict(capsys, model, "--data", data, "--out", tmp_path / "no" / "s.npy"), "--out")
    assert_one_line(*predict(capsys, model, "--data", data, "--table-sizes", "2000"), "for a TSV")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(data, corrupt)
    arr = np.load(corrupt / "day_0_sparse.npy")
    arr[3, 4] = 1999 if arr[3, 4] != 1999 else 0
    np.save(corrupt / "day_0_sparse.npy", arr)
    assert_one_line(*predict(capsys, model, "--data", corrupt), "day_0_sparse.npy", "sha256")
    for same in (model, SAMPLE):  # an output that is an input: refused, the input intact
        before = Path(same).read_bytes()
        assert_one_line(
            *predict(capsys, model, "--data", SAMPLE, "--table-sizes", "2000", "--out", same), "would overwrite"
        )
        assert Path(same).read_bytes() == before
    (tmp_path / "keep.npy").write_bytes(b"old")
    assert_one_line(*predict(capsys, model, "--data", corrupt, "--out", tmp_path / "keep.npy"))
    assert (tmp_path / "keep.npy").read_bytes() == b"old"  # a failure never replaces an earlier output


def test_the_command_line(trained, capsys, tmp_path):
    """--help shows the defaults; through the real entry point, a refusal is one line, exit 2, no traceback."""
    data, _, model = trained
    code, out, _ = predict(capsys, "--help")
    assert code == 0 and "default: 4096" in out, out
    r = run("-m", "dlrm.predict", str(model), "--data", str(tmp_path / "missing.tsv"), timeout=120)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, (
        r.stderr
    )


def test_quantized_tables_score_close_to_fp32(trained, capsys, tmp_path):
    """--quantize int8|fp16: TorchRec's inference tables. Row-wise int8 keeps each weight within
    (row max - row min) / 510 of fp32 here (weights ~1e-2): probabilities move by far less than 1e-3."""
    data, _, model = trained
    scores = {}
    for q in ("none", "int8", "fp16"):
        rc, out, err = predict(capsys, model, "--data", data, "--quantize", q, "--out", tmp_path / f"{q}.npy")
        assert rc == 0, err
        scores[q] = np.load(tmp_path / f"{q}.npy")
    for q in ("int8", "fp16"):
        np.testing.assert_allclose(scores[q], scores["none"], atol=1e-3)
    assert not np.array_equal(scores["int8"], scores["none"])  # the quantized tables were used
