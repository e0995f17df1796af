"""The quality benchmark's inputs: the team-shaped log and the hand preprocessing it is compared with."""

from __future__ import annotations

import pyarrow.parquet as pq

from dlrm.bench.quality import hand_preprocess
from dlrm.bench.teamlog import write_log


def test_the_team_log_and_its_hand_preprocessing(tmp_path):
    log = write_log(tmp_path / "csv", rows=1400, days=7)
    assert len(log["files"]) == 7 and log["rows"] == 1400 and 0.7 < log["bayes_auc"] < 0.95
    header = (tmp_path / "csv" / "day-0.csv").read_text().splitlines()[0]
    assert header == "row_id,day,user,item,hour,category,n_views,price_cents,tags,click"
    (tmp_path / "hand").mkdir()
    rows = hand_preprocess(log["files"][:-1], log["files"][-1:], tmp_path / "hand")
    train, evals = (pq.read_table(tmp_path / "hand" / f"{s}.parquet") for s in ("train", "eval"))
    assert train.num_rows == 1200 and evals.num_rows == 200
    for c in ("user", "item", "category"):
        ids = train[c].to_numpy()
        assert ids.min() >= 1 and ids.max() < rows[c]  # 0..n-1 over the train days, row 0 for unseen
        assert evals[c].to_numpy().max() < rows[c]
    dense = train["n_views"].to_numpy()[train["n_views_missing"].to_numpy() == 0]
    assert abs(dense.mean()) < 1e-5 and abs(dense.std() - 1) < 1e-3  # log1p, standardised
