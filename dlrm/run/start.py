"""Starting a run: where it writes (the run directory, the same for every rank), whether it may write
there (output places, locks, a fresh start or a continuation), and its records (config.yaml,
continuations.jsonl).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dlrm.common.io import output_dir_problem
from dlrm.config import Config, ConfigError, TopologyConfig, TrainerConfig
from dlrm.distributed.world import World
from dlrm.run.records import (
    check_continuation,
    check_fresh_start,
    check_resume_point,
    finished_at,
    lock_checkpoint_dir,
    lock_run_dir,
    planned_steps,
    record,
)


@dataclass(frozen=True)
class StartSettings:
    """The config's values that place a run and decide whether it starts, continues or is finished."""

    trainer: TrainerConfig
    """The loop's section: resume, eval_only and the run's length (max_steps, max_samples, max_epochs)."""
    name: str | None
    """run.name: the run's own directory, outputs/<name>; None: a new one per invocation."""
    checkpoint_dir: str | None
    """checkpoint.dir; None: the run directory's checkpoints/."""
    global_batch_size: int
    """data.global_batch_size: the samples of a step (max_samples in steps)."""
    topology: TopologyConfig
    """The topology a finished run's rebuilt summary names."""

    @classmethod
    def of(cls, cfg: Config) -> StartSettings:
        """The values of `cfg` (the whole Config: it picks them out of four sections)."""
        return cls(cfg.trainer, cfg.run.name, cfg.checkpoint.dir, cfg.data.global_batch_size, cfg.topology)


def check_output_places(settings: StartSettings, run_dir: str | None) -> None:
    """Check where the run will write, before anything starts.

    Args:
        settings: the run's name, checkpoint.dir and trainer.resume.
        run_dir: hydra.run.dir as given on the command line, or None.

    Raises:
        ConfigError: hydra.run.dir or checkpoint.dir is not a directory this process can create or write,
            or trainer.resume=auto has no run another invocation can find again (run.name, hydra.run.dir
            or checkpoint.dir).
    """
    if settings.trainer.resume == "auto" and not (settings.name or run_dir or settings.checkpoint_dir):
        raise ConfigError(
            "trainer.resume=auto continues a run from its own checkpoints, but without run.name (or "
            "hydra.run.dir / checkpoint.dir) every invocation starts in a new timestamped directory and "
            "would never find one: name the run, e.g. run.name=my_run trainer.resume=auto"
        )
    named = f"outputs/{settings.name}" if settings.name and run_dir is None else None
    for key, value in (("hydra.run.dir", run_dir), ("run.name", named), ("checkpoint.dir", settings.checkpoint_dir)):
        problem = None if value is None else output_dir_problem(value, key)
        if problem:
            raise ConfigError(problem)


def placement(world: World, name: str | None, run_dir: str | None) -> dict[str, str | None]:
    """The Hydra settings that place this rank's run: the directory all ranks share (a named run's, or
    one agreed under torchrun) unless hydra.run.dir was given; Hydra's records on rank 0 only."""
    placed: dict[str, str | None] = {}
    if run_dir is None and name:  # a named run: the same directory for every rank and every invocation
        placed["hydra.run.dir"] = f"outputs/{name}"
    elif run_dir is None and world.world_size > 1:
        placed["hydra.run.dir"] = _shared_run_dir()
    if not world.is_main:
        placed["hydra.output_subdir"] = None
    return placed


def _shared_run_dir() -> str:
    """One run directory for all ranks of a torchrun job, agreed through torchrun's own store.

    The first rank to ask proposes outputs/<timestamp>; every rank reads back the same value.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise ConfigError(
            "several ranks but no torchrun store to agree on a run directory; "
            "pass hydra.run.dir=DIR (the same on every rank)"
        )
    import torch.distributed as dist

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60)
    )
    key = f"dlrm/run_dir/{os.environ.get('TORCHELASTIC_RUN_ID', '')}"
    proposal = time.strftime("outputs/%Y-%m-%d_%H-%M-%S")
    return store.compare_set(key, "", proposal).decode()


@contextmanager
def taken_run(
    settings: StartSettings, dcfg: DictConfig, run_dir: Path, is_main: bool, overrides: list[str]
) -> Iterator[bool]:
    """Own the run directory and checkpoint.dir for the block (rank 0 locks them).

    Refuses to start over another run's outputs, then writes the run's config.yaml or, continuing a run
    with a checkpoint, compares the config with it.

    Args:
        settings: the config's values that decide a fresh start, a continuation or a finished run.
        dcfg: the job's composed config, as config.yaml records it.
        run_dir: the run directory; is_main: rank 0 (it locks and writes).
        overrides: the command line's overrides, recorded with a continuation.

    Yields:
        False when the run is already finished (nothing to train; its records stay), else True.

    Raises:
        UserError: the places are locked by another run, hold another run's outputs, or the continuation
            changes a key a checkpoint cannot take.
    """
    tr = settings.trainer
    locks = []
    try:
        if is_main:
            locks.append(lock_run_dir(run_dir))
            own = Path(settings.checkpoint_dir).absolute() if settings.checkpoint_dir else None
            if own is not None and own != run_dir.absolute() and not tr.eval_only:  # another run may share it
                locks.append(lock_checkpoint_dir(own))
        yield _check_and_record(settings, dcfg, run_dir, is_main, overrides)
    finally:
        for fd in locks:
            os.close(fd)


def _check_and_record(
    settings: StartSettings, dcfg: DictConfig, run_dir: Path, is_main: bool, overrides: list[str]
) -> bool:
    """`taken_run`'s checks and records, once the places are locked; False for a finished run."""
    from dlrm.checkpoint import complete_checkpoints, read_manifest  # torch: only once the config is valid

    tr = settings.trainer
    config = OmegaConf.to_container(dcfg, resolve=True, enum_to_str=True)
    assert isinstance(config, dict)
    checkpoints = complete_checkpoints(Path(settings.checkpoint_dir or run_dir / "checkpoints"))
    check_fresh_start(run_dir, checkpoints, tr.resume, look_at_config=is_main)
    if tr.resume and not tr.eval_only and tr.max_epochs is None:  # with max_epochs the data says when it ends
        check_resume_point(checkpoints, tr.resume, tr.max_steps)
        done = finished_at(
            checkpoints, tr.resume, planned_steps(tr.max_steps, tr.max_samples, settings.global_batch_size)
        )
        if done is not None:
            if is_main:
                kept = _kept(settings.topology, settings.global_batch_size, run_dir, checkpoints[-1])
                print(f"already finished at step {done} ({checkpoints[-1]}); nothing to train, {kept}")
            return False
    continuing = bool(checkpoints) and bool(tr.resume)
    changes = check_continuation(run_dir, config, read_manifest(checkpoints[-1])) if continuing else {}
    if is_main:
        record(run_dir, config, continuing, overrides, changes)
    return True


def _kept(topology: TopologyConfig, global_batch_size: int, run_dir: Path, checkpoint: Path) -> str:
    """What a finished run's re-run did to its records: nothing, or rebuild a summary.json gone missing."""
    from dlrm.distributed.topology import backend_for
    from dlrm.run.rebuild import rebuild_summary

    hint = "raise trainer.max_steps to train on, or evaluate it with trainer.eval_only=true"
    if (run_dir / "summary.json").exists() or not (run_dir / "config.yaml").exists():  # kept, or not this run's
        return f"nothing changed: {hint}"
    sources = rebuild_summary(run_dir, checkpoint, backend_for(topology), topology.name, global_batch_size)
    return f"summary.json was missing: rebuilt from {sources}; nothing else changed: {hint}"
