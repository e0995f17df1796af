"""Entry point: `python -m dlrm.train [overrides]` or `torchrun --nproc_per_node=N -m dlrm.train [overrides]`.

`main` reads the command line with Hydra's parser, composes the config once (conf/, plus `-cd DIR`),
and `check` refuses bad values, a config that does not match the launcher's world and unusable output
places, all before torch is imported or a run directory is made. Then Hydra's `run_job` runs the job
in the run directory (as `@hydra.main` would: `.hydra/`, `HydraConfig`): `run` checks that the model
can fit, then builds and runs the trainer. Under torchrun all ranks agree on one run directory, and
only rank 0 writes into it. `--cfg` prints the composed config; --help and --info go to Hydra's `@main`.

A user error (`dlrm.common.errors.UserError`, also when DCP wraps one) prints `error: <message>` once and
exits with status 2, without a traceback: see `exit_on_user_error`. Launch through
`python -m dlrm.torchrun` (the launchers do) to keep torchrun's failure summary off the console too.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from dlrm.common.errors import UserError, exit_on_user_error
from dlrm.config import Config, register_configs, to_config, validate, validate_world
from dlrm.config.compose import (
    CONF_DIR,
    command_line,
    compose_job,
    hydra_session,
    override_value,
    show_config,
    task_part,
)
from dlrm.distributed.world import World
from dlrm.run.logs import setup_logging
from dlrm.run.start import check_output_places, placement, take_run

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
    check_output_places(cfg, run_dir)


def _start(cfg: Config, task: DictConfig, run_dir: Path, world: World, overrides: list[str]) -> list[int]:
    """Logging (console, train.log; library noise off), then the run taken (`take_run`): rank 0 locks the
    run directory, a start over another run's outputs is refused, config.yaml is written. The locks."""
    setup_logging(world.rank, run_dir if world.is_main else None)
    try:
        return take_run(cfg, task, run_dir, world.is_main, overrides)
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
    tests/test_train_cli.py (test_a_run_writes_hydra_records) catches a change.
    """
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job
    from hydra.types import HydraContext, RunMode

    run_dir = Path(str(OmegaConf.select(composed, "hydra.run.dir"))).absolute()
    with open_dict(composed.hydra):
        composed.hydra.mode = RunMode.RUN
        composed.hydra.run.dir = str(run_dir)  # resolved once (${now:...}): where the run started
    locks = _start(cfg, task_part(composed), run_dir, world, list(composed.hydra.overrides.task))
    try:
        callbacks = Callbacks(composed)
        config_name = composed.hydra.job.config_name  # -cn, as Hydra recorded it
        callbacks.on_run_start(config=composed, config_name=config_name)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        done = run_job(lambda _: _job(cfg, world), composed, "hydra.run.dir", None, context, configure_logging=False)
        callbacks.on_run_end(config=composed, config_name=config_name, job_return=done)
        _ = done.return_value  # raises the job's exception, if it failed
    finally:
        for fd in locks:
            os.close(fd)


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
            cfg = to_config(task_part(composed))
            run_dir = override_value(args.overrides, "hydra.run.dir")
            check(cfg, world, run_dir)
            for key, value in placement(world, cfg.run.name, run_dir).items():
                OmegaConf.update(composed, key, value, force_add=True)
            if args.cfg:
                return show_config(composed, args) if world.is_main else None
        except UserError as e:
            exit_on_user_error(e, world.rank)
        _run_job(composed, cfg, world)


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


if __name__ == "__main__":
    main()
