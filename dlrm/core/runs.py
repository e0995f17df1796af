"""A run directory's config: written once, compared on every continuation.

A run directory holds `config.yaml`: the resolved config of the invocation that started the run.
A continuation (trainer.resume given, and the run already has a checkpoint) never rewrites it: its
config is compared with it key by key, the changes are logged on one line, the ones that cannot
apply to a checkpoint are refused, and the continuation is recorded as one JSON line in
`continuations.jsonl` (time, its command-line overrides, and the changes {key: [old, new]}).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import yaml

from dlrm.config import ConfigError
from dlrm.io import write_atomic

log = logging.getLogger(__name__)

CONFIG = "config.yaml"
CONTINUATIONS = "continuations.jsonl"

# Keys whose change a checkpoint cannot follow. The model: the checkpoint's tensors have its shapes.
# The optimizers: their state is another one's (the checkpoint manifest refuses them too). The global
# batch: the step counter is the data position and the LR schedule's clock, both in batches of it.
FIXED_PREFIXES = ("model.", "optim.embedding.name", "optim.dense.name", "data.global_batch_size")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}, "c": [2]} -> {"a.b": 1, "c": [2]}: dotted keys of the mappings; lists are leaves."""
    if isinstance(tree, dict):
        flat: dict[str, Any] = {}
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: tree}


def config_changes(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """Every dotted key whose value differs between two configs: {key: (old, new)} (None: absent)."""
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def _ignored(key: str) -> bool:
    """Keys that say how to run this invocation, not what the run is: never a change."""
    return key == "trainer.resume"


def read_config(run_dir: Path) -> dict | None:
    """The run's recorded config (plain data: yaml.safe_load), or None if there is none yet."""
    path = run_dir / CONFIG
    if not path.exists():
        return None
    try:
        saved = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not a readable config ({e}); restore it, or start another run.name") from e
    if not isinstance(saved, dict):
        raise ConfigError(f"{path} is not a config mapping; restore it, or start another run.name")
    return saved


def check_continuation(run_dir: Path, config: dict) -> dict[str, tuple[Any, Any]]:
    """Compare a continuation's resolved `config` with the run's config.yaml (every rank may call
    it: it only reads). Logs the changes; ConfigError naming the keys if one cannot apply.
    Returns the changes (empty when there is no recorded config)."""
    saved = read_config(run_dir)
    if saved is None:
        return {}
    changes = {k: v for k, v in config_changes(saved, config).items() if not _ignored(k)}
    fixed = [k for k in changes if k.startswith(FIXED_PREFIXES)]
    if fixed:
        raise ConfigError(
            f"run {run_dir} cannot continue with other {', '.join(fixed)} than its checkpoints "
            f"({'; '.join(f'{k}: {changes[k][0]!r} -> {changes[k][1]!r}' for k in fixed)}): drop these "
            "overrides to continue it, or start another run.name (trainer.resume=<its step_* dir> "
            "starts from its weights)"
        )
    if changes:
        listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items())
        log.info(f"continuing run {run_dir} with {len(changes)} changed key(s): {listed}")
    else:
        log.info(f"continuing run {run_dir} with its config unchanged")
    return changes


def record(run_dir: Path, config: dict, continuing: bool, overrides: list[str], changes: dict) -> None:
    """Rank 0: a new run (or one without a checkpoint yet) writes config.yaml atomically; a
    continuation keeps it and adds a line to continuations.jsonl (rewritten atomically)."""
    if not continuing:
        write_atomic(run_dir / CONFIG, yaml.safe_dump(config, sort_keys=False).encode())
        return
    path = run_dir / CONTINUATIONS
    before = path.read_bytes() if path.exists() else b""
    line = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "overrides": overrides,
        "changes": {k: [old, new] for k, (old, new) in changes.items()},
    }
    write_atomic(path, before + (json.dumps(line, sort_keys=True) + "\n").encode())
