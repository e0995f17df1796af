"""Entry point: `python -m dlrm.train [overrides]` or `torchrun --nproc_per_node=N -m dlrm.train [overrides]`.

`main` reads the command line with Hydra's parser, composes the config once (conf/, plus `-cd DIR`),
and `check` refuses bad values, a config that does not match the launcher's world and unusable output
places, all before torch is imported or a run directory is made. Then Hydra's `run_job` runs the job
in the run directory (as `@hydra.main` would: `.hydra/`, `HydraConfig`): `run` checks that the model
can fit, then builds and runs the trainer. Under torchrun all ranks agree on one run directory, and
only rank 0 writes into it. `--cfg` prints the composed config; --help and --info go to Hydra's `@main`.

A user error (`dlrm.errors.UserError`, also when DCP wraps one) prints `error: <message>` once and
exits with status 2, without a traceback: see `exit_on_user_error`. Launch through
`python -m dlrm.torchrun` (the launchers do) to keep torchrun's failure summary off the console too.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import sys
import time
from argparse import Namespace
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from dlrm.config import Config, ConfigError, register_configs, to_config, validate, validate_world
from dlrm.config.compose import CONF_DIR, compose_job, hydra_session, override_value, task_part
from dlrm.distributed.world import World
from dlrm.errors import UsageError, UserError, exit_on_user_error
from dlrm.io import output_dir_problem
from dlrm.trainer.logs import setup_logging

register_configs()
# torch (seconds to import) is imported where needed: a bad command line fails before it.


def run(cfg: Config, run_dir: Path | None = None, world: World | None = None) -> dict:
    """Train and evaluate a config that passed `check` on this rank of `world` (default: the
    launcher's); return the run summary (see docs/configuration.md, Outputs)."""
    import torch.distributed as dist

    from dlrm.distributed.capacity import check_memory  # imports TorchRec (seconds): only once the config is valid
    from dlrm.trainer.trainer import Trainer

    world = world or World.from_env()
    model = check_memory(cfg, world.world_size)  # a model that cannot fit: refused before any process group
    from dlrm.comms.measured import summary_extras  # the cost model, outside the core

    summary = Trainer(cfg, world, run_dir, summary_extras(cfg, world.local_world_size), model=model).train()
    # Collect the trainer now: its pipeline and model form reference cycles that hold in-flight
    # Gloo work; freed only at interpreter exit, they can abort the process ("terminate called
    # without an active exception"). Then tear down together, and only after success: a rank
    # that failed leaves the clean-up to the launcher, as a collective teardown could hang.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return summary


def check(cfg: Config, world: World, run_dir: str | None) -> None:
    """Refuse what can be refused before torch is imported: the config's values, the config against
    the launcher's world, and the places it writes to (`run_dir`: hydra.run.dir as given, if given)."""
    validate(cfg)
    validate_world(cfg, world.world_size, world.local_world_size)
    _check_output_places(cfg, run_dir)


def _start(cfg: Config, task: DictConfig, run_dir: Path, world: World, overrides: list[str]) -> None:
    """Logging (console, train.log; library noise off), then the run's records: rank 0 locks the run
    directory, a start over another run's outputs is refused, config.yaml is written (see `_record_run`)."""
    setup_logging(world.rank, run_dir if world.is_main else None)
    try:
        _record_run(cfg, task, run_dir, world.is_main, overrides)
    except Exception as e:
        exit_on_user_error(e, world.rank)
        raise


def _job(cfg: Config, world: World) -> None:
    """What runs in the run directory once it is started (`_start`) and Hydra has set it up: training
    and the closing line."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        summary = run(cfg, run_dir, world)
    except Exception as e:
        from torch.distributed.checkpoint import CheckpointException

        from dlrm.distributed.topology import collective_failure
        from dlrm.trainer.stop import stopped_meanwhile

        failure = collective_failure(e, cfg.trainer.collective_timeout_s)
        if failure is not None or isinstance(e, CheckpointException):  # a peer gone, maybe by a signal
            failure = stopped_meanwhile() or failure
        exit_on_user_error(failure or e, world.rank)
        raise
    if world.is_main:
        speed = summary["train_samples_per_s"]
        print(
            f"done: {summary['steps']} steps, {f'{speed:.0f}' if speed else 'no'} train samples/s, "
            f"eval auc {summary['eval_auc'] and round(summary['eval_auc'], 4)}, "
            f"logloss {summary['eval_logloss'] and round(summary['eval_logloss'], 4)}; outputs in {run_dir}"
        )


def _run_job(composed: DictConfig, cfg: Config, world: World) -> None:
    """Start the run (`_start`: a refusal leaves the run directory's `.hydra/` as it was), then run
    `_job` on the config composed once, as `@hydra.main` runs its function (Hydra's `run_job`: the
    run directory, `.hydra/`, `HydraConfig`, `hydra.job.env_set`, `hydra.callbacks`).

    Call inside `hydra_session`. Hydra's `Callbacks` is internal: the `@hydra.main` path builds it so;
    tests/hostile/test_cli_errors.py (test_a_run_writes_hydra_records) catches a change.
    """
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job
    from hydra.types import HydraContext, RunMode

    run_dir = Path(str(OmegaConf.select(composed, "hydra.run.dir"))).absolute()
    with open_dict(composed.hydra):
        composed.hydra.mode = RunMode.RUN
        composed.hydra.run.dir = str(run_dir)  # resolved once (${now:...}): where the run started
    _start(cfg, task_part(composed), run_dir, world, list(composed.hydra.overrides.task))
    callbacks = Callbacks(composed)
    callbacks.on_run_start(config=composed, config_name="config")
    context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
    done = run_job(lambda _: _job(cfg, world), composed, "hydra.run.dir", None, context, configure_logging=False)
    callbacks.on_run_end(config=composed, config_name="config", job_return=done)
    _ = done.return_value  # raises the job's exception, if it failed


def _launcher_world() -> World:
    """The launcher's world (`World.from_env`); bad launcher variables: one `error:` line, exit 2."""
    try:
        return World.from_env()
    except UserError as e:
        exit_on_user_error(e, 0)  # the rank itself may be unreadable: every process says it
        raise


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(dcfg: DictConfig) -> None:
    """Hydra's `@main`, for the flags that only print (--help, --hydra-help, --info, --shell-completion):
    it never calls this function then; a run goes through `main`."""
    raise AssertionError("dlrm.train runs its jobs through main(), not Hydra's @main")


def _record_run(cfg: Config, dcfg: DictConfig, run_dir: Path, is_main: bool, overrides: list[str]) -> None:
    """Own the run directory and checkpoint.dir (rank 0 locks them), refuse to start over another run's outputs, then
    write the run's config.yaml, or, continuing a run with a checkpoint, compare with it (see dlrm.trainer.run_dir)."""
    from dlrm.checkpoint import complete_checkpoints, read_manifest
    from dlrm.trainer.run_dir import (
        check_continuation,
        check_fresh_start,
        check_resume_point,
        finished_at,
        lock_checkpoint_dir,
        lock_run_dir,
        planned_steps,
        record,
    )

    global _run_lock, _checkpoint_lock
    tr = cfg.trainer
    if is_main:
        _run_lock = lock_run_dir(run_dir)
        own = Path(cfg.checkpoint.dir).absolute() if cfg.checkpoint.dir else None
        if _checkpoint_lock is not None:  # an earlier run in this process (in-process callers) is over
            os.close(_checkpoint_lock)
            _checkpoint_lock = None
        if own is not None and own != run_dir.absolute() and not tr.eval_only:  # another run may share it
            _checkpoint_lock = lock_checkpoint_dir(own)
    config = OmegaConf.to_container(dcfg, resolve=True, enum_to_str=True)
    assert isinstance(config, dict)
    checkpoints = complete_checkpoints(Path(cfg.checkpoint.dir or run_dir / "checkpoints"))
    check_fresh_start(run_dir, checkpoints, tr.resume, look_at_config=is_main)
    if tr.resume and not tr.eval_only:
        check_resume_point(checkpoints, tr.resume, tr.max_steps)
        done = finished_at(
            checkpoints, tr.resume, planned_steps(tr.max_steps, tr.max_samples, cfg.data.global_batch_size)
        )
        if done is not None:  # a continuation with nothing to train: the run's records stay as they are
            if is_main:
                kept = _kept(cfg, run_dir, checkpoints[-1])
                print(f"already finished at step {done} ({checkpoints[-1]}); nothing to train, {kept}")
            sys.exit(0)
    continuing = bool(checkpoints) and bool(tr.resume)
    changes = check_continuation(run_dir, config, read_manifest(checkpoints[-1])) if continuing else {}
    if is_main:
        record(run_dir, config, continuing, overrides, changes)


def _kept(cfg: Config, run_dir: Path, checkpoint: Path) -> str:
    """What a finished run's re-run did to its records: nothing, or rebuild a summary.json gone missing."""
    from dlrm.distributed.topology import backend_for
    from dlrm.trainer.rebuild import rebuild_summary

    hint = "raise trainer.max_steps to train on, or evaluate it with trainer.eval_only=true"
    if (run_dir / "summary.json").exists() or not (run_dir / "config.yaml").exists():  # kept, or not this run's
        return f"nothing changed: {hint}"
    sources = rebuild_summary(
        run_dir, checkpoint, backend_for(cfg.topology), cfg.topology.name, cfg.data.global_batch_size
    )
    return f"summary.json was missing: rebuilt from {sources}; nothing else changed: {hint}"


_run_lock: int | None = None  # rank 0's lock on its run directory, held for the process's life
_checkpoint_lock: int | None = None  # and on its checkpoint.dir, if set elsewhere


def _shared_run_dir() -> str:
    """One run directory for all ranks of a torchrun job, agreed through torchrun's own store.

    The first rank to ask proposes outputs/<timestamp>; every rank reads back the same value.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise SystemExit(
            "error: several ranks but no torchrun store to agree on a run directory; "
            "pass hydra.run.dir=DIR (the same on every rank)"
        )
    import torch.distributed as dist

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60)
    )
    key = f"dlrm/run_dir/{os.environ.get('TORCHELASTIC_RUN_ID', '')}"
    proposal = time.strftime("outputs/%Y-%m-%d_%H-%M-%S")
    return store.compare_set(key, "", proposal).decode()


def _check_output_places(cfg: Config, run_dir: str | None) -> None:
    """Where the run will write, checked before anything starts: hydra.run.dir and checkpoint.dir must
    be directories this process can create or write; trainer.resume=auto needs a run that another
    invocation can find again (run.name, hydra.run.dir or checkpoint.dir), not a new timestamped one."""
    if cfg.trainer.resume == "auto" and not (cfg.run.name or run_dir or cfg.checkpoint.dir):
        raise ConfigError(
            "trainer.resume=auto continues a run from its own checkpoints, but without run.name (or "
            "hydra.run.dir / checkpoint.dir) every invocation starts in a new timestamped directory and "
            "would never find one: name the run, e.g. run.name=my_run trainer.resume=auto"
        )
    named = f"outputs/{cfg.run.name}" if cfg.run.name and run_dir is None else None
    for key, value in (("hydra.run.dir", run_dir), ("run.name", named), ("checkpoint.dir", cfg.checkpoint.dir)):
        problem = None if value is None else output_dir_problem(value, key)
        if problem:
            raise ConfigError(problem)


def command_line(argv: list[str]) -> Namespace:
    """The command line as Hydra's `@main` reads it (Hydra's own parser; overrides and flags in any
    order); a bad flag or a flag dlrm.train does not take is a UsageError."""
    from hydra._internal.utils import get_args_parser  # Hydra's parser: private, tested in test_cli_errors

    parser = get_args_parser()

    def refuse(message: str) -> NoReturn:
        raise UsageError(f"{message.strip()} (see python -m dlrm.train --help)")

    parser.error = refuse  # type: ignore[method-assign]  # one error line, not argparse's usage + exit
    args = parser.parse_intermixed_args(argv)
    if args.multirun:
        raise UsageError(
            "dlrm.train runs one training per command; -m/--multirun (a Hydra sweep) is not supported: "
            "run one command per setting (e.g. a shell loop over the values)"
        )
    if args.experimental_rerun is not None:
        raise UsageError(
            "dlrm.train does not rerun from a pickled config (--experimental-rerun: loading it can run code); "
            "rerun with the overrides in RUN_DIR/.hydra/overrides.yaml, or continue a named run with "
            "run.name=NAME trainer.resume=auto"
        )
    if args.config_path is not None:
        raise UsageError(
            f"-cp/--config-path {args.config_path}: dlrm.train composes its own conf/; add your config "
            "groups with -cd DIR (--config-dir) instead"
        )
    return args


def main() -> None:
    """Compose the command line's config once, check it, place the run, then run the job in its run
    directory (or print the config: --cfg). Hydra's printing flags (--help, --info...) go to its `@main`."""
    _enable_fault_handler()
    world = _launcher_world()
    try:
        args = command_line(sys.argv[1:])
    except UserError as e:
        exit_on_user_error(e, world.rank)
    if args.help or args.hydra_help or args.info is not None or args.shell_completion:
        hydra_main()  # prints only, from sys.argv
        return
    with hydra_session():
        try:  # fail fast, before torch is imported and a run directory is made
            composed = compose_job(args.overrides, config_dir=args.config_dir, config_name=args.config_name or "config")
            _refuse_chdir(composed)
            cfg = to_config(task_part(composed))
            check(cfg, world, override_value(args.overrides, "hydra.run.dir"))
        except UserError as e:
            exit_on_user_error(e, world.rank)
        for key, value in _placement(world, cfg.run.name, override_value(args.overrides, "hydra.run.dir")).items():
            OmegaConf.update(composed, key, value, force_add=True)
        if not args.cfg:
            _run_job(composed, cfg, world)
        elif world.is_main:
            _show(composed, args)


def _enable_fault_handler() -> None:
    """A rank that crashes in native code (SIGSEGV, SIGABRT: a library's uncaught C++ exception, a
    heap check) prints every thread's Python stack to the process's stderr instead of dying without
    a word. Skipped where that stderr has no file descriptor (an embedding host)."""
    stderr = sys.__stderr__
    if faulthandler.is_enabled() or stderr is None:
        return
    try:
        faulthandler.enable(file=stderr)
    except (ValueError, OSError):  # io.UnsupportedOperation is an OSError: no fileno()
        return


def _placement(world: World, name: str | None, run_dir: str | None) -> dict[str, str | None]:
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


def _show(composed: DictConfig, args: Namespace) -> None:
    """--cfg job|hydra|all [--package P] [--resolve]: print the composed config as Hydra's would."""
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(composed)  # for ${hydra:...} when resolving
    OmegaConf.set_readonly(composed.hydra, None)  # as Hydra's own --cfg: resolving writes into it
    shown = {"job": task_part(composed), "hydra": OmegaConf.masked_copy(composed, ["hydra"]), "all": composed}[args.cfg]
    package = None if args.package in (None, "_global_") else args.package
    if package is not None:
        shown = OmegaConf.select(shown, package)
        if shown is None:
            exit_on_user_error(UsageError(f"--package {package}: no such key in the {args.cfg} config"), 0)
        print(f"# @package {package}")
    if not isinstance(shown, DictConfig | ListConfig):
        print(shown)
        return
    if args.resolve:
        OmegaConf.resolve(shown)
    sys.stdout.write(OmegaConf.to_yaml(shown))


def _refuse_chdir(composed: DictConfig) -> None:
    """hydra.job.chdir=true: refused (the run's relative paths are read from where it starts)."""
    if composed.hydra.job.chdir:
        raise ConfigError(
            "hydra.job.chdir=true is not supported: dlrm.train reads relative paths (data, "
            "checkpoint.dir, trainer.resume) from the directory it starts in; leave it false"
        )


if __name__ == "__main__":
    main()
