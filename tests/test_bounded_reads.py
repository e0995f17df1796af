"""Every small file a command reads is bounded: a FIFO, /dev/zero, a file over the format's size, JSON
nested 200,000 deep or a YAML alias bomb gives one clear refusal naming the file, never a hang, a
memory blow-up or a RecursionError traceback."""

from __future__ import annotations

import os

import pytest

from dlrm.checkpoint import CheckpointError, read_manifest
from dlrm.common.io import UnreadableFileError, parse_json, read_bounded
from dlrm.comms.costmodel import CommsError
from dlrm.comms.report import load_bench
from dlrm.config import ConfigError
from dlrm.plan.projection import load_measured
from dlrm.run.records import CONFIG, read_config, record
from tests.helpers.checkpoints import NEW, ckpts, saved_checkpoints

__all__ = ["ckpts", "saved_checkpoints"]  # fixtures

DEEP = b"[" * 200_000 + b"]" * 200_000
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9)
)


def _fifo(path):
    os.mkfifo(path)
    return path


def _plant(path, content: str) -> None:
    """Put a hostile file at `path`: a FIFO, 200,000-deep JSON, or a link to /dev/zero."""
    if content == "fifo":
        _fifo(path)
    elif content == "deep":
        path.write_bytes(DEEP)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory", "too_large"])
def test_read_bounded_refuses_what_is_not_a_small_regular_file(tmp_path, kind):
    path = {
        "fifo": lambda: _fifo(tmp_path / "f"),
        "dev_zero": lambda: "/dev/zero",
        "directory": lambda: tmp_path,
        "too_large": lambda: (tmp_path / "big").write_bytes(b"x" * 101) and tmp_path / "big",
    }[kind]()
    with pytest.raises(UnreadableFileError, match=str(path)):
        read_bounded(path, 100)


def test_parse_json_reports_deep_nesting_as_bad_json():
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_json(DEEP)


@pytest.mark.parametrize("content", ["fifo", "deep", "dev_zero"])
def test_a_checkpoint_manifest_that_is_not_a_manifest_is_refused(ckpts, content):
    manifest = ckpts / NEW / "manifest.json"
    manifest.unlink()
    _plant(manifest, content)
    with pytest.raises(CheckpointError, match="manifest.json"):
        read_manifest(ckpts / NEW)


@pytest.mark.parametrize("content", ["alias_bomb", "deep", "fifo"])
def test_a_run_config_that_is_not_a_config_is_refused(tmp_path, content):
    path = tmp_path / CONFIG
    if content == "alias_bomb":
        path.write_text(ALIAS_BOMB)  # 10 levels of 9: 3.5 billion leaves once expanded
    elif content == "deep":
        path.write_text("a: " + "[" * 200_000 + "]" * 200_000 + "\n")
    else:
        _fifo(path)
    with pytest.raises(ConfigError, match=f"{path} is not a readable config"):
        read_config(tmp_path)


def test_the_trainers_own_config_yaml_has_no_aliases_and_reads_back(tmp_path):
    shared = [1, 2]  # one object in two places: a plain YAML dump would write an anchor and an alias
    record(tmp_path, {"a": shared, "b": shared}, continuing=False, overrides=[], changes={})
    text = (tmp_path / CONFIG).read_text()
    assert "&" not in text and "*" not in text
    assert read_config(tmp_path) == {"a": [1, 2], "b": [1, 2]}


@pytest.mark.parametrize("content", ["fifo", "deep", "dev_zero"])
def test_a_bench_or_summary_json_that_is_not_json_is_refused(tmp_path, content):
    path = tmp_path / "x.json"
    _plant(path, content)
    with pytest.raises(CommsError, match="is not JSON"):
        load_bench(str(path))
    with pytest.raises(ConfigError, match="not readable JSON"):
        load_measured(str(path))


def test_predict_refuses_a_data_file_that_never_ends(capsys, tmp_path):
    from dlrm.predict.cli import main

    assert main([str(tmp_path / "model.pt"), "--data", "/dev/zero"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--data /dev/zero is not a regular file" in err, err
