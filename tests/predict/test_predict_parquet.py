"""`python -m dlrm.predict` on Parquet data: the export records the data.parquet columns, and the scorer
reads rows with them, as the trainer does.

One module fixture: the helper's Parquet dataset (a one-id, a jagged list<int> feature with per-id
weights, a hashed string, two labels), a training (in the test process) of a tiny weighted two-task model with a
separate eval file, and its export (the checkpoint then deleted).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.data.parquet.hashing import hash_strings
from dlrm.export import content_sha256, export, load_exported
from tests.helpers.cli import assert_one_error, train_quietly
from tests.helpers.cli import predict_in_process as predict
from tests.helpers.parquet_data import ROWS, TABLES, table, two_task_overrides, write_dataset

GBS, EVAL_ROWS = 32, 192  # the trainer's eval: 6 full batches, every row of the eval file
TASKS = ("click", "convert")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(eval directory, run directory, exported model)."""
    root = tmp_path_factory.mktemp("predict_parquet")
    train_dir, eval_dir, run_dir, model = root / "train", root / "eval", root / "run", root / "model.pt"
    write_dataset(train_dir)
    eval_dir.mkdir()
    pq.write_table(table(EVAL_ROWS, first=ROWS), eval_dir / "part-0.parquet", row_group_size=40)
    ckpt = train_quietly(run_dir, 20, *two_task_overrides(train_dir, eval_dir, GBS, EVAL_ROWS))
    export(ckpt, model)
    shutil.rmtree(ckpt.parent)
    return eval_dir, run_dir, model


def printed(stdout: str) -> dict[str, tuple[float, float]]:
    """{task: (auc, logloss)} of the scorer's per-task lines `TASK: auc A logloss L`."""
    found = {}
    for line in stdout.splitlines():
        task, _, rest = line.partition(": ")
        words = rest.split()
        if words[:1] == ["auc"]:
            found[task] = (float(words[1]), float(words[3]))
    return found


def test_the_export_records_how_the_model_read_its_parquet_columns(trained):
    _, _, model = trained
    d = torch.load(model, weights_only=True)
    assert d["version"] == 2 and d["data"]["source"] == "parquet"
    columns = d["data"]["parquet"]
    assert set(columns) == {"dense", "sparse", "labels", "id_policy"}  # no paths: they belong to one dataset
    assert columns["dense"] == ["pos", "x"] and columns["labels"] == ["label", "label2"]
    assert columns["sparse"][1] == {"name": "items", "column": None, "kind": "ids", "weights": "items_w"}
    assert columns["sparse"][2]["kind"] == "string" and columns["id_policy"] == "refuse"
    assert json.loads(json.dumps(d["data"])) == d["data"]  # plain data


def test_scores_equal_the_trainers_eval_on_every_task(trained, capsys, tmp_path):
    """The trainer scored every row of the eval file (6 batches of 32) with the model it exported: the
    scorer's per-task AUC (the same logits, the same exact AUC) and log loss (fp32 sums over 192 rows)
    equal the ones it recorded, and the written probabilities give that log loss."""
    eval_dir, run_dir, model = trained
    rc, out, err = predict(capsys, model, "--data", eval_dir, "--batch-size", 50, "--out", tmp_path / "s.npy")
    assert rc == 0, err
    assert f"scored {EVAL_ROWS} rows" in out
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in records if "eval_samples" in r][-1]
    assert final["eval_samples"] == EVAL_ROWS
    figures = printed(out)
    assert list(figures) == list(TASKS)
    for task in TASKS:
        auc, logloss = figures[task]
        assert final[f"eval_auc/{task}"] is not None and auc == pytest.approx(final[f"eval_auc/{task}"], abs=2e-6)
        assert logloss == pytest.approx(final[f"eval_logloss/{task}"], rel=1e-5)
    scores = np.load(tmp_path / "s.npy", allow_pickle=False)
    assert scores.dtype == np.float32 and scores.shape == (EVAL_ROWS, 2)
    rows = pq.read_table(eval_dir)
    for t, (task, column) in enumerate(zip(TASKS, ("label", "label2"), strict=True)):
        y = rows.column(column).to_numpy().astype(np.float64)
        p = scores[:, t].astype(np.float64).clip(1e-7, 1 - 1e-7)
        assert -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)) == pytest.approx(figures[task][1], rel=1e-4)
    # a glob of the same files, and the first rows only (a partial last batch): the same scores
    rc, out, err = predict(
        capsys,
        model,
        "--data",
        f"{eval_dir}/*.parquet",
        "--max-rows",
        37,
        "--batch-size",
        16,
        "--out",
        tmp_path / "f.npy",
    )
    assert rc == 0 and "scored 37 rows" in out, err
    np.testing.assert_allclose(np.load(tmp_path / "f.npy"), scores[:37], rtol=1e-5, atol=1e-7)
    assert not list(tmp_path.glob(".*tmp"))


def test_scores_equal_the_model_on_rows_built_by_hand(trained, capsys, tmp_path):
    """The written probabilities equal the exported network's on a batch built here from the rows with
    pyarrow (ids, jagged lists with their weights, hashed strings), fp32 forward passes of other batch
    shapes: within 1e-5; the same rows without the per-id weights score measurably differently."""
    eval_dir, _, model = trained
    rc, _, err = predict(capsys, model, "--data", eval_dir, "--batch-size", 64, "--out", tmp_path / "s.npy")
    assert rc == 0, err
    rows = pq.read_table(eval_dir)
    items = rows.column("items").combine_chunks()
    values = {
        "user": rows.column("user").to_numpy(),
        "items": items.flatten().to_numpy(),
        "city": hash_strings(rows.column("city")) % TABLES["city"],
    }
    lengths = {"user": np.ones(EVAL_ROWS), "items": items.value_lengths().to_numpy(), "city": np.ones(EVAL_ROWS)}
    weights = {k: np.ones(len(v), np.float32) for k, v in values.items()}
    weights["items"] = rows.column("items_w").combine_chunks().flatten().to_numpy()
    dense = torch.from_numpy(np.stack([rows.column(c).to_numpy() for c in ("pos", "x")], 1).astype(np.float32))
    net = load_exported(model).model
    probabilities = []
    for w in (weights, {k: np.ones_like(v) for k, v in weights.items()}):
        kjt = KeyedJaggedTensor(
            keys=list(values),
            values=torch.from_numpy(np.concatenate(list(values.values())).astype(np.int64)),
            lengths=torch.from_numpy(np.concatenate(list(lengths.values())).astype(np.int32)),
            weights=torch.from_numpy(np.concatenate(list(w.values())).astype(np.float32)),
        )
        with torch.no_grad():
            probabilities.append(torch.sigmoid(net(dense, kjt)).numpy())
    scores = np.load(tmp_path / "s.npy")
    np.testing.assert_allclose(scores, probabilities[0], rtol=1e-5, atol=1e-6)
    assert np.abs(probabilities[1] - scores).max() > 1e-4  # the weights were read and used


def test_unlabeled_rows_are_scored_without_metrics(trained, capsys, tmp_path):
    eval_dir, _, model = trained
    rc, _, err = predict(capsys, model, "--data", eval_dir, "--out", tmp_path / "labeled.npy")
    assert rc == 0, err
    unlabeled = tmp_path / "unlabeled.parquet"
    pq.write_table(pq.read_table(eval_dir).drop_columns(["label", "label2"]), unlabeled, row_group_size=64)
    rc, out, err = predict(capsys, model, "--data", unlabeled, "--out", tmp_path / "u.npy")
    assert rc == 0, err
    assert f"scored {EVAL_ROWS} rows" in out and "auc" not in out
    np.testing.assert_allclose(np.load(tmp_path / "u.npy"), np.load(tmp_path / "labeled.npy"), rtol=1e-5, atol=1e-7)


def resigned(model: Path, path: Path, drop: str = "", **changes) -> Path:
    """The export with `changes` (and without key `drop`), its sha256 recomputed: only the structural
    checks can catch it."""
    d = {k: v for k, v in {**torch.load(model, weights_only=True), **changes}.items() if k != drop}
    torch.save({**d, "sha256": content_sha256(d)}, path)
    return path


def test_a_model_and_data_of_different_sources_are_refused(trained, capsys, tmp_path):
    eval_dir, _, model = trained
    tsv = tmp_path / "rows.tsv"
    tsv.write_text("\t".join(["1"] * 40) + "\n")
    assert_one_error(*predict(capsys, model, "--data", tsv, "--table-sizes", "10"), str(model), "Parquet", "items")
    criteo = resigned(model, tmp_path / "criteo.pt", data={"source": "criteo"})
    older = resigned(model, tmp_path / "older.pt", data=None)  # a checkpoint from before the manifest's record
    version1 = resigned(model, tmp_path / "v1.pt", drop="data", version=1)  # an export from before the record
    for other, words in ((criteo, ("data.source=criteo",)), (older, ("Criteo-shaped",)), (version1, ("Criteo",))):
        assert_one_error(*predict(capsys, other, "--data", eval_dir), str(eval_dir), "is Parquet", *words)
    edited = resigned(model, tmp_path / "edited.pt", data={"source": "parquet", "parquet": {"dense": ["pos"]}})
    assert_one_error(*predict(capsys, edited, "--data", eval_dir), "edited.pt", "disagree", "re-export")
    d = torch.load(model, weights_only=True)
    unsigned = tmp_path / "unsigned.pt"
    torch.save({**d, "data": {"source": "criteo"}}, unsigned)  # the data record is covered by the sha256
    assert_one_error(*predict(capsys, unsigned, "--data", eval_dir), "sha256")


def test_parquet_that_does_not_fit_the_model_is_refused(trained, capsys, tmp_path):
    eval_dir, _, model = trained
    rows = pq.read_table(eval_dir)
    cases = {
        "no_items.parquet": (rows.drop_columns(["items"]), ("no column 'items'", "sparse feature 'items'")),
        "no_weights.parquet": (rows.drop_columns(["items_w"]), ("'items_w'", "weights")),
        "one_label.parquet": (rows.drop_columns(["label2"]), ("['label']", "['label2']", "or none")),
        "flat_items.parquet": (
            rows.drop_columns(["items"]).append_column("items", rows.column("user")),
            ("'items'", "int64", "sparse feature 'items', kind ids"),
        ),
    }
    for name, (t, words) in cases.items():
        pq.write_table(t, tmp_path / name)
        assert_one_error(*predict(capsys, model, "--data", tmp_path / name), name, *words)
    bad_id = rows.drop_columns(["user"]).append_column("user", pa.array(rows.column("user").to_numpy() + 1000))
    pq.write_table(bad_id, tmp_path / "bad_id.parquet", write_statistics=False)  # found as the rows are read
    assert_one_error(*predict(capsys, model, "--data", tmp_path / "bad_id.parquet"), "'user'", "bad_id.parquet, row 0")
    assert_one_error(*predict(capsys, model, "--data", f"{tmp_path}/none-*.parquet"), "--data", "no Parquet files")
    assert_one_error(*predict(capsys, model, "--data", eval_dir, "--days", "0"), "--days", "Criteo")
    assert_one_error(*predict(capsys, model, "--data", eval_dir, "--max-rows", 0), "no rows to score")
    before = (eval_dir / "part-0.parquet").read_bytes()
    out = eval_dir / "part-0.parquet"
    assert_one_error(*predict(capsys, model, "--data", eval_dir, "--out", out), "would overwrite")
    assert out.read_bytes() == before
