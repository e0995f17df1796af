"""dlrm.run.records: a run's config.yaml is compared with a continuation's, key by key."""

from __future__ import annotations

import json

import pytest
import yaml

from dlrm.config import ConfigError
from dlrm.run.records import check_continuation, config_changes, record

OLD = {"model": {"bottom_mlp": [16, 8]}, "optim": {"embedding": {"name": "adagrad", "lr": 0.1}}, "seed": 0}


def test_changes_name_every_dotted_key_with_old_and_new():
    new = {"model": {"bottom_mlp": [32, 8]}, "optim": {"embedding": {"name": "adagrad", "lr": 0.2}}, "run": {"x": 1}}
    assert config_changes(OLD, new) == {
        "model.bottom_mlp": ([16, 8], [32, 8]),
        "optim.embedding.lr": (0.1, 0.2),
        "run.x": (None, 1),
        "seed": (0, None),
    }


def test_a_run_keeps_its_config_and_records_each_continuation(tmp_path):
    record(tmp_path, OLD, continuing=False, overrides=["seed=0"], changes={})
    new = {**OLD, "seed": 1, "trainer": {"resume": "auto"}}
    changes = check_continuation(tmp_path, new)
    assert changes == {"seed": (0, 1)}  # trainer.resume says how to start, not what the run is
    record(tmp_path, new, continuing=True, overrides=["seed=1"], changes=changes)
    record(tmp_path, new, continuing=True, overrides=["seed=1"], changes=changes)
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == OLD
    lines = [json.loads(line) for line in (tmp_path / "continuations.jsonl").read_text().splitlines()]
    assert [(x["overrides"], x["changes"]) for x in lines] == [(["seed=1"], {"seed": [0, 1]})] * 2


@pytest.mark.parametrize(
    ("key", "value"),
    [("model.bottom_mlp", [32, 8]), ("optim.embedding.name", "sgd"), ("data.global_batch_size", 128)],
)
def test_changes_a_checkpoint_cannot_follow_are_refused_naming_the_key(tmp_path, key, value):
    base = {**OLD, "data": {"global_batch_size": 64}}
    record(tmp_path, base, continuing=False, overrides=[], changes={})
    section, *path = key.split(".")
    new = json.loads(json.dumps(base))
    node = new[section]
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    with pytest.raises(ConfigError, match=rf"{key}.*-> .*another run\.name"):
        check_continuation(tmp_path, new)


def test_a_damaged_config_yaml_is_a_user_error(tmp_path):
    (tmp_path / "config.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="config.yaml is not a readable config"):
        check_continuation(tmp_path, OLD)
