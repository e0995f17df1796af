"""Managed vocabularies in one process: ids get rows of their own while there is room, eviction by the
policy and the age limit, rows reset when re-assigned, the serving form maps as training did (and
torch.export traces it), the config's one-line refusals, the sizing helper, and the TorchRec internals
dlrm.models.id_remap relies on."""

import pytest
import torch
from torchrec.modules.mc_modules import LFU_EvictionPolicy, MCHManagedCollisionModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.checkpoint.manifest import model_signature, signature_differences
from dlrm.config import ConfigError, TableConfig, VocabularyConfig
from dlrm.config.compose import compose
from dlrm.data.source import make_source
from dlrm.models.dlrm import build_model, initialize, reset_rows, table_rows_init
from dlrm.models.id_remap import EMPTY_ID, VocabularyRemap
from dlrm.models.vocabulary import (
    ServingVocabularies,
    TableVocabulary,
    expected_collision_rate,
    serving_vocabularies,
    suggest_vocabulary,
    vocabulary_metrics,
    vocabulary_remap,
)

CPU = torch.device("cpu")
BIG = 1 << 62  # 63-bit raw ids


def _table(policy="lfu", rows=4, max_age=None, features=("f",)):
    return TableConfig(
        name="t",
        rows=rows,
        dim=4,
        features=list(features),
        vocabulary=VocabularyConfig(policy=policy, max_age_steps=max_age),
    )


def _kjt(ids, key="f"):
    ids = torch.tensor(ids, dtype=torch.int64)
    return KeyedJaggedTensor(keys=[key], values=ids, lengths=torch.ones(len(ids), dtype=torch.int32))


def _rows(remap, ids):
    return remap(_kjt(ids)).values().tolist()


def test_every_id_gets_a_row_of_its_own_while_the_table_has_room():
    remap = VocabularyRemap([_table(rows=32)], CPU)
    ids = [BIG + 7 * i for i in range(20)] + [BIG, BIG + 7]  # 20 distinct 63-bit ids, two seen twice
    rows = _rows(remap, ids)
    assert len(set(rows[:20])) == 20 and max(rows) < 31, "distinct rows, none the unknown ids' last row"
    assert rows[20:] == rows[:2]
    remap.eval()
    assert _rows(remap, ids) == rows, "evaluation maps as training did"
    assert _rows(remap, [BIG + 1]) == [31], "an unseen id gets the last row, and is not admitted"
    figures = remap.metrics()
    assert figures["vocab_t_new_ids"] == 20 and figures["vocab_t_evictions"] == 0
    assert figures["vocab_t_collisions"] == 0 and figures["vocab_t_occupancy"] == pytest.approx(20 / 31)


def test_lfu_evicts_the_least_frequent_id_when_full_and_frees_its_row():
    remap = VocabularyRemap([_table("lfu", rows=4)], CPU)  # 3 ids fit
    a, b, c, d = BIG + 1, BIG + 2, BIG + 3, BIG + 4
    rows = _rows(remap, [a, b, c])
    first = dict(zip([a, b, c], rows))
    remap.take_freed_rows()
    _rows(remap, [a, a, a, b, b])  # c is now the least frequent
    after = _rows(remap, [d, d, d])
    assert after == [first[c]] * 3, "d took c's row"
    assert remap.take_freed_rows()["t"].tolist() == [first[c]]
    remap.eval()
    assert _rows(remap, [a, b, c]) == [first[a], first[b], 3], "c lost its row: the unknown ids' row"
    assert remap.metrics()["vocab_t_evictions"] == 1


def test_an_age_limit_frees_the_rows_of_ids_not_seen_for_longer():
    remap = VocabularyRemap([_table("lru", rows=8, max_age=2)], CPU)
    old, fresh = BIG + 1, BIG + 2
    row = _rows(remap, [old, fresh])[0]
    remap.metrics()
    _rows(remap, [fresh])
    _rows(remap, [fresh])
    assert _rows(remap, [fresh]) != [7]
    remap.eval()
    assert _rows(remap, [old]) == [7], "old was last seen 3 steps ago: evicted"
    figures = remap.metrics()
    assert figures["vocab_t_evictions"] == 1 and figures["vocab_t_occupancy"] == pytest.approx(1 / 7)
    assert row in remap.take_freed_rows()["t"].tolist()


def test_a_re_assigned_row_starts_again_from_its_initial_values():
    cfg = compose(["model=tiny", "model.tables.3.vocabulary.policy=lru"])
    model = build_model(cfg.model, CPU)
    initialize(model, cfg.model, cfg.seed)
    assert vocabulary_remap(model) is not None
    ebc = model.model.sparse_arch.embedding_bag_collection.ebc
    weight = ebc.embedding_bags["t_C4"].weight
    with torch.no_grad():
        weight.add_(1.0)
    tables = {t.name: (t.rows, t.dim) for t in cfg.model.tables}
    reset_rows(ebc, {"t_C4": torch.tensor([2, 17])}, tables, cfg.seed)
    init = table_rows_init(cfg.seed, "t_C4", 30, 8, 0, 30)
    torch.testing.assert_close(weight[[2, 17]], init[[2, 17]], rtol=0, atol=0)
    torch.testing.assert_close(weight[[0, 1]], init[[0, 1]] + 1.0)


def test_a_model_with_vocabularies_trains_and_reports_them():
    cfg = compose(["model=tiny", "data.global_batch_size=64", "model.tables.1.vocabulary.policy=distance_lfu"])
    model = build_model(cfg.model, CPU)
    initialize(model, cfg.model, cfg.seed)
    batches = make_source(cfg).batches("train", rank=0, world_size=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss, _ = model(next(batches))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    figures = vocabulary_metrics(model)
    assert set(figures) == {
        f"vocab_t_C2_{k}" for k in ("occupancy", "new_ids", "evictions", "collisions", "collision_rate")
    }
    assert 0 < figures["vocab_t_C2_occupancy"] <= 1 and figures["vocab_t_C2_new_ids"] > 0
    assert vocabulary_metrics(build_model(compose(["model=tiny"]).model, CPU)) == {}


def test_the_serving_vocabularies_map_as_the_trained_model_and_export():
    remap = VocabularyRemap([_table("lfu", rows=16, features=("f", "g"))], CPU)
    seen = [BIG + 3 * i for i in range(12)]
    remap(KeyedJaggedTensor(keys=["f", "g"], values=torch.tensor(seen), lengths=torch.ones(12, dtype=torch.int32)))
    remap.eval()
    probe = torch.tensor(seen + [BIG + 1, 5, -3, EMPTY_ID - 1])
    holder = torch.nn.Module()
    holder.add_module("remap", remap)
    frozen = serving_vocabularies(holder)["t"]
    assert frozen["features"] == ["f", "g"] and frozen["unknown_row"] == 15
    serving = ServingVocabularies(serving_vocabularies(holder))
    kjt = KeyedJaggedTensor(keys=["g"], values=probe, lengths=torch.ones(len(probe), dtype=torch.int32))
    assert serving(kjt).values().tolist() == remap(kjt).values().tolist()
    table = TableVocabulary(frozen["sorted_ids"], frozen["rows"], frozen["unknown_row"])
    exported = torch.export.export(table, (probe,))
    assert exported.module()(probe).tolist() == remap.map_ids("t", probe).tolist()


def test_vocabulary_config_refusals_are_one_line():
    for table, match in [
        (_table("lfu", max_age=3), "lfu records no time of last use"),
        (_table("none", max_age=3), "an age limit needs a vocabulary"),
        (_table("lru", rows=1), "rows >= 2"),
    ]:
        with pytest.raises(ConfigError, match=match) as caught:
            table.check("model.tables[0]")
        assert "\n" not in str(caught.value) and "model.tables[0].vocabulary" in str(caught.value)


def test_a_checkpoint_of_another_vocabulary_policy_is_refused():
    saved = model_signature(compose(["model=tiny", "model.tables.0.vocabulary.policy=lfu"]).model)
    current = model_signature(compose(["model=tiny", "model.tables.0.vocabulary.policy=lru"]).model)
    assert signature_differences(saved, current) == [
        "table t_C1: vocabulary policy lfu in the checkpoint, lru in this model (a vocabulary's state is the "
        "policy's: resume with the same policy)"
    ]
    for table in saved["tables"]:  # a record written before vocabularies existed: policy none
        del table["vocabulary"]
    assert signature_differences(saved, model_signature(compose(["model=tiny"]).model)) == []


def test_suggest_vocabulary_and_the_expected_modulo_collisions():
    assert suggest_vocabulary(1000, 999, "id") is None  # dense ids index a table directly
    hours = suggest_vocabulary(1, 14102100, "id")  # Avazu's YYMMDDHH hour: one value
    assert hours is not None and hours["rows"] == 3 and hours["vocabulary"] == {"policy": "lfu"}
    users = suggest_vocabulary(50_000, (1 << 63) - 2, "id")
    assert users is not None and users["rows"] == 75_001
    assert suggest_vocabulary(10, None, "strings") == {
        "rows": 16,
        "vocabulary": {"policy": "lfu"},
        "reason": "10 distinct strings: a row each instead of hashing them modulo the rows",
    }
    assert expected_collision_rate(1, 10) == 0.0
    assert expected_collision_rate(1000, 1000) == pytest.approx(1 - (1 - 1 / 1000) ** 999)


def test_mch_internals_are_as_expected():
    """dlrm.models.id_remap touches these TorchRec internals: a release that changes them fails here."""
    mch = MCHManagedCollisionModule(zch_size=8, device=CPU, eviction_policy=LFU_EvictionPolicy(), eviction_interval=1)
    for name in ("_current_iter", "_current_history_buffer_offset", "_input_history_buffer_size", "_mch_metadata"):
        assert hasattr(mch, name), name
    assert mch._zch_size == 8 and mch._device == CPU and callable(mch._sort_mch_buffers)
    assert {"_current_iter_tensor", "_mch_sorted_raw_ids", "_mch_remapped_ids_mapping", "_mch_counts"} <= set(
        dict(mch.named_buffers())
    )
    remap = VocabularyRemap([_table("lfu", rows=64)], CPU)
    _rows(remap, [BIG])  # the history buffer sized by a batch of one id
    many = [BIG + i for i in range(1, 40)]
    assert 63 not in _rows(remap, many), "a larger batch later is profiled whole"
    remap.mch("t")._current_iter_tensor.fill_(100)  # a checkpoint loads it in place
    _rows(remap, [BIG])
    assert int(remap.mch("t")._current_iter_tensor.item()) == 101


def test_jagged_ids_of_several_features_map_per_table():
    remap = VocabularyRemap([_table("lfu", rows=16, features=("f", "g"))], CPU)
    kjt = KeyedJaggedTensor(  # 2 samples: f [[BIG, BIG + 1], []], g [[BIG], [123456789]], h [[5], [6]]
        keys=["f", "g", "h"],
        values=torch.tensor([BIG, BIG + 1, BIG, 123456789, 5, 6]),
        lengths=torch.tensor([2, 0, 1, 1, 1, 1], dtype=torch.int32),
    )
    out = remap(kjt)
    f, g, h = (out[k].values().tolist() for k in ("f", "g", "h"))
    assert f[0] == g[0] and f[1] != f[0] and g[1] not in f, "one vocabulary for the table's features"
    assert h == [5, 6], "a feature without a vocabulary passes unchanged"
    assert out.lengths().tolist() == kjt.lengths().tolist()


def test_parquet_ids_reach_a_vocabulary_raw_and_are_mapped_to_rows(tmp_path):
    """63-bit ids and hashed strings of a table with a vocabulary are read as they are (no range check
    against the rows, no modulo), and the model maps them to rows."""
    import pyarrow.parquet as pq

    from tests.helpers import parquet_data

    rows = parquet_data.table(480)
    rows = rows.set_column(rows.schema.get_field_index("user"), "user", pa_int64(rows["user"].to_numpy() + BIG))
    pq.write_table(rows, tmp_path / "part-0.parquet", row_group_size=40)
    cfg = compose(
        [
            *parquet_data.overrides(tmp_path),
            "model=tiny",
            "model.bottom_mlp=[16,8]",
            "model.tables=[{name:t_user,rows:16,dim:8,features:[user],vocabulary:{policy:lfu}},"
            "{name:t_items,rows:50,dim:8,features:[items],pooling:3},"
            "{name:t_city,rows:40,dim:8,features:[city],vocabulary:{policy:lru}}]",
            "model.dense_in_features=2",
            "data.global_batch_size=64",
        ]
    )
    batch = next(make_source(cfg).batches("train", rank=0, world_size=1))
    raw = batch.sparse_features.to_dict()
    assert raw["user"].values().min() >= BIG, "user ids read raw"
    assert raw["city"].values().max() >= 40, "strings hashed to 63 bits, not modulo the rows"
    model = build_model(cfg.model, CPU)
    initialize(model, cfg.model, cfg.seed)
    remap = vocabulary_remap(model)
    assert remap is not None
    rows_of = remap(batch.sparse_features).to_dict()
    assert rows_of["user"].values().max() < 16 and rows_of["city"].values().max() < 40
    assert torch.equal(rows_of["items"].values(), raw["items"].values().long())
    loss, _ = model(batch)
    assert torch.isfinite(loss)


def pa_int64(values):
    import pyarrow as pa

    return pa.array(values, pa.int64())


def test_an_exported_state_rebuilt_on_the_meta_device_maps_ids_as_the_trained_model():
    """dlrm.export's load path (build_model on meta, load_state_dict(assign=True)) keeps the mapping."""
    cfg = compose(["model=tiny", "model.tables.0.vocabulary.policy=lfu", "model.tables.0.rows=16"])
    trained = build_model(cfg.model, CPU)
    initialize(trained, cfg.model, cfg.seed)
    remap = vocabulary_remap(trained)
    assert remap is not None
    remap(_kjt([BIG + i for i in range(10)], key="C1"))
    rebuilt = build_model(cfg.model)
    rebuilt.load_state_dict(trained.state_dict(), assign=True)
    trained.eval()
    rebuilt.eval()
    probe = _kjt([BIG + i for i in range(12)], key="C1")
    again = vocabulary_remap(rebuilt)
    assert again is not None
    assert again(probe).values().tolist() == remap(probe).values().tolist()
    assert remap(probe).values().tolist()[10:] == [15, 15]


def test_a_training_run_logs_each_vocabulary_to_metrics_and_tensorboard(capfd, tmp_path):
    """`python -m dlrm.train` with a vocabulary (in the test process): vocab_<table>_* in metrics.jsonl and
    TensorBoard."""
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.helpers import REPO_ROOT
    from tests.helpers.cli import train_in_process

    code, out, err = train_in_process(
        capfd,
        "model=tiny",
        "model.tables.3.vocabulary.policy=lru",
        "trainer.max_steps=4",
        "trainer.log_every_steps=2",
        "data.global_batch_size=64",
        "data.eval_batches=1",
        "trainer.progress=none",
        f"hydra.run.dir={tmp_path}",
        cwd=REPO_ROOT,
    )
    assert code == 0, (out + err)[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if "vocab_t_C4_occupancy" in r]
    assert [r["step"] for r in windows] == [2, 4]
    assert windows[0]["vocab_t_C4_new_ids"] > 0 and 0 < windows[-1]["vocab_t_C4_occupancy"] <= 1
    assert all(f"vocab_t_C4_{k}" in windows[0] for k in ("evictions", "collisions", "collision_rate"))
    tags = EventAccumulator(str(tmp_path / "tensorboard")).Reload().Tags()["scalars"]
    assert "train/vocab_t_C4_occupancy" in tags and "train/vocab_t_C4_new_ids" in tags


def test_the_vocabularies_page_runs_as_written():
    """docs/vocabularies.md: its command runs and prints both mappings' figures."""
    import subprocess
    import sys

    from tests.helpers import REPO_ROOT

    page = (REPO_ROOT / "docs" / "vocabularies.md").read_text()
    commands = page.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(commands) == 1 and commands[0].startswith("python -m dlrm.bench.vocab")
    argv = commands[0].split()
    result = subprocess.run([sys.executable, *argv[1:]], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("log: 3 days x 4,000 rows") and "Bayes AUC" in lines[0]
    assert lines[1].startswith("modulo") and lines[2].startswith("managed") and "eval AUC" in lines[2]
