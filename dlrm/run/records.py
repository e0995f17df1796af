"""A run directory's config: written once, compared on every continuation.

A run directory holds `config.yaml`: the resolved config of the invocation that started the run.
A continuation (trainer.resume given, and the run already has a checkpoint) never rewrites it: its
config is compared with it key by key, the changes are logged on one line, the ones that cannot
apply to a checkpoint are refused, and the continuation is recorded as one JSON line in
`continuations.jsonl` (time, its command-line overrides, and the changes {key: [old, new]}).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import yaml

from dlrm.common.errors import UserError
from dlrm.common.io import read_bounded, sha256_file, write_atomic
from dlrm.config import ConfigError

log = logging.getLogger(__name__)

CONFIG = "config.yaml"
CONFIG_LIMIT = 16 << 20  # a resolved config: kilobytes


class _PlainLoader(yaml.SafeLoader):
    """yaml.safe_load without anchors and aliases (a few kilobytes of aliases expand to gigabytes);
    our config.yaml never has them (`_PlainDumper`)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("it holds a YAML alias, which a config written by the trainer never does")
        return super().compose_node(parent, index)


class _PlainDumper(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:
        return True


CONTINUATIONS = "continuations.jsonl"
LOCK = ".lock"


class RunInUseError(UserError):
    """Another training holds the run directory's lock."""


def lock_run_dir(run_dir: Path) -> int:
    """Take the run directory's lock for this process's life (rank 0 of a training).

    An exclusive flock on run_dir/.lock, opened without following a symlink, released by the kernel
    when the process ends however it ends.

    Returns:
        The lock's file descriptor (keep it open).

    Raises:
        RunInUseError: another process holds it; the message names the holder.
    """
    return _lock(run_dir, f"run directory {run_dir}", "give this one another run.name (or hydra.run.dir)")


def lock_checkpoint_dir(checkpoint_dir: Path) -> int:
    """Take a checkpoint.dir's lock as `lock_run_dir` takes a run directory's: two runs writing one
    checkpoint directory would replace and prune each other's checkpoints."""
    return _lock(checkpoint_dir, f"checkpoint directory {checkpoint_dir}", "give this one another checkpoint.dir")


def _lock(directory: Path, what: str, fix: str) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RunInUseError(f"{what} is in use by another training ({holder}); wait for it to end, or {fix}") from None
    os.ftruncate(fd, 0)
    os.pwrite(
        fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode(), 0
    )
    return fd


def check_fresh_start(run_dir: Path, checkpoints: list[Path], resume: str | None, look_at_config: bool) -> None:
    """Refuse a run without trainer.resume that would start over another run's outputs.

    Args:
        run_dir: the run directory.
        checkpoints: the checkpoint directory's complete checkpoints.
        resume: trainer.resume (None: a fresh start).
        look_at_config: also refuse a run directory holding a config.yaml (rank 0, before it writes its own).

    Raises:
        ConfigError: the checkpoint directory holds checkpoints, or the run directory a run's config.yaml.
    """
    if resume:
        return
    config = run_dir / CONFIG
    held = [str(config)] if look_at_config and config.exists() else []
    held += [str(c) for c in checkpoints[-1:]]
    if held:
        raise ConfigError(
            f"run directory {run_dir} already holds a run ({', '.join(held)}): continue it with "
            "trainer.resume=auto, or start this one in another run.name (or hydra.run.dir)"
        )


def check_resume_point(checkpoints: list[Path], resume: str, max_steps: int) -> None:
    """Check where a training resumes, before anything starts.

    The step is the directory's (step_NNNNNNNN); loading checks it against the manifest.

    Args:
        checkpoints: the checkpoint directory's complete checkpoints.
        resume: trainer.resume: auto (the newest of `checkpoints`) or a step_* path.
        max_steps: trainer.max_steps.

    Raises:
        ConfigError: later checkpoints would be replaced, or the step is past max_steps.
    """
    where = (checkpoints[-1] if checkpoints else None) if resume == "auto" else Path(resume)
    digits = where.name.removeprefix("step_") if where is not None else ""
    if not digits.isdigit():
        return
    step = int(digits)
    later = [c for c in checkpoints if int(c.name.removeprefix("step_")) > step]
    if later:
        raise ConfigError(
            f"the checkpoint directory holds {len(later)} checkpoint(s) after step {step} (newest "
            f"{later[-1]}) that this run would replace: resume from the newest (trainer.resume=auto), or "
            "write this run's checkpoints elsewhere (another run.name, hydra.run.dir or checkpoint.dir)"
        )
    if step > max_steps:
        raise ConfigError(
            f"checkpoint {where} is at step {step}, past trainer.max_steps={max_steps}: raise "
            "trainer.max_steps to train on from it, or evaluate it with trainer.eval_only=true"
        )


def planned_steps(max_steps: int, max_samples: int | None, global_batch_size: int) -> int:
    """The steps a run trains in all: trainer.max_steps, or fewer if trainer.max_samples comes first."""
    if max_samples is None:
        return max_steps
    return min(max_steps, max(1, max_samples // global_batch_size))


def finished_at(checkpoints: list[Path], resume: str, total_steps: int) -> int | None:
    """The step of a finished run that `resume` (auto, or a step_* path) would continue from the newest
    of its own `checkpoints`, when that step leaves nothing to train (>= `total_steps`); else None."""
    if not checkpoints:
        return None
    newest = checkpoints[-1]
    if resume != "auto" and Path(resume).absolute() != newest.absolute():
        return None
    digits = newest.name.removeprefix("step_")
    return int(digits) if digits.isdigit() and int(digits) >= total_steps else None


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
        saved = yaml.load(read_bounded(path, CONFIG_LIMIT), Loader=_PlainLoader)
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError, UserError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e).splitlines()[0]
        raise ConfigError(
            f"{path} is not a readable config ({reason}); restore it, or start another run.name"
        ) from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{path} is not a config mapping; restore it, or start another run.name")
    return saved


def recorded_config_sha256(run_dir: Path | None) -> str | None:
    """The sha256 of the run's config.yaml as recorded (checkpoint manifests carry it), or None."""
    path = None if run_dir is None else run_dir / CONFIG
    return None if path is None or not path.is_file() else sha256_file(path)


def check_continuation(run_dir: Path, config: dict, manifest: dict | None = None) -> dict[str, tuple[Any, Any]]:
    """Compare a continuation's resolved config with the run's config.yaml, and log the changes.

    Reads only, so every rank may call it. config.yaml is first checked to be the one the run recorded.

    Args:
        run_dir: the run directory.
        config: the continuation's resolved config, plain data.
        manifest: the checkpoint it continues from, which names config.yaml's sha256.

    Returns:
        {dotted key: (old, new)} (empty when there is no recorded config).

    Raises:
        ConfigError: naming the keys a checkpoint cannot take, or a config.yaml not the recorded one.
    """
    saved = read_config(run_dir)
    if saved is None:
        return {}
    recorded = (manifest or {}).get("run_config_sha256")
    if recorded is not None and recorded != recorded_config_sha256(run_dir):
        raise ConfigError(
            f"{run_dir / CONFIG} is not the config this run recorded (its sha256 differs from the one in its "
            "checkpoints' manifest: edited since?): restore it, and change settings with overrides on the "
            "command line, which are checked and logged in continuations.jsonl"
        )
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
    """Rank 0: record the run in its directory.

    A new run (or one without a checkpoint yet) writes config.yaml atomically; a continuation keeps it
    and adds a line to continuations.jsonl (rewritten atomically).

    Args:
        run_dir: the run directory.
        config: the resolved config, plain data.
        continuing: whether this invocation continues a run with a checkpoint.
        overrides: the invocation's command-line overrides.
        changes: {dotted key: (old, new)} from `check_continuation`.
    """
    if not continuing:
        write_atomic(run_dir / CONFIG, yaml.dump(config, Dumper=_PlainDumper, sort_keys=False).encode())
        return
    path = run_dir / CONTINUATIONS
    before = path.read_bytes() if path.exists() else b""
    line = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "overrides": overrides,
        "changes": {k: [old, new] for k, (old, new) in changes.items()},
    }
    write_atomic(path, before + (json.dumps(line, sort_keys=True) + "\n").encode())
