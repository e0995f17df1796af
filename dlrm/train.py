"""Train and evaluate: `python -m dlrm.train [overrides]` or `torchrun --nproc_per_node=N -m dlrm.train [...]`.

compose -> check -> place -> train -> close. Everything a user can get wrong is refused before torch is
imported or a run directory exists; a user error anywhere is one `error: ...` line (rank 0 for errors
every rank meets) and exit status 2.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from dlrm.common.errors import exit_on_user_error
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
from dlrm.run.job import resolved_run_dir, run_in_hydra_job
from dlrm.run.logs import done_line, enable_fault_handler, setup_logging
from dlrm.run.start import StartSettings, check_output_places, placement, taken_run
from dlrm.trainer.collector import collections_skip_older_objects
from dlrm.trainer.stop import explained_failure

register_configs()


def main() -> None:
    """The command: one run, or the config printed (--cfg), or Hydra's help (--help, --info...)."""
    enable_fault_handler()
    rank, cfg = 0, None  # until the launcher's variables are read, every process speaks
    try:
        world = World.from_env()
        rank = world.rank
        args = command_line(sys.argv[1:])
        if args.help or args.hydra_help or args.info is not None or args.shell_completion:
            return hydra_main()  # prints only, from sys.argv
        with hydra_session():
            composed = compose_job(args.overrides, config_dir=args.config_dir, config_name=args.config_name or "config")
            cfg = to_config(task_part(composed))
            run_dir_given = override_value(args.overrides, "hydra.run.dir")
            validate(cfg)
            validate_world(cfg, world.world_size, world.local_world_size)
            check_output_places(StartSettings.of(cfg), run_dir_given)
            for key, value in placement(world, cfg.run.name, run_dir_given).items():
                OmegaConf.update(composed, key, value, force_add=True)
            if args.cfg:
                return show_config(composed, args) if world.is_main else None
            start(composed, cfg, world)
    except BaseException as e:
        timeout_s = None if cfg is None else cfg.trainer.collective_timeout_s
        exit_on_user_error(explained_failure(e, timeout_s), rank)
        raise


def start(composed: DictConfig, cfg: Config, world: World) -> None:
    """Take the run (its directory locked, its records written), run it in its directory as Hydra's job,
    and print the closing line; a finished run says so and trains nothing."""
    run_dir = resolved_run_dir(composed)
    setup_logging(world.rank, run_dir if world.is_main else None)
    overrides = list(composed.hydra.overrides.task)
    with taken_run(StartSettings.of(cfg), task_part(composed), run_dir, world.is_main, overrides) as to_train:
        if to_train:
            summary = run_in_hydra_job(composed, lambda: run(cfg, run_dir, world))
            if world.is_main:
                print(done_line(summary, run_dir))


def run(cfg: Config, run_dir: Path | None = None, world: World | None = None) -> dict:
    """Train and evaluate a checked config on this rank of `world` (default: the launcher's).

    Args:
        cfg: a validated config.
        run_dir: the run directory (the same on every rank); None: no files written.
        world: this process's rank and the launcher's sizes.

    Returns:
        The run summary, as written to summary.json.

    Raises:
        UserError: a model that cannot fit, bad data, a lost peer explained.
    """
    import torch.distributed as dist

    from dlrm.comms.measured import CommVsModel, checked_bench  # the cost model: outside the core
    from dlrm.distributed.capacity import check_memory  # TorchRec (seconds): once the config is valid
    from dlrm.trainer.build import build
    from dlrm.trainer.loop import train

    world = world or World.from_env()
    bench = checked_bench(cfg, world.local_world_size)  # a bad comms bench file: refused before training
    model = check_memory(cfg, world.world_size)  # refused before any process group
    with collections_skip_older_objects():
        trainer = build(cfg, world, run_dir, model)
        trainer.summary_parts.append(CommVsModel(cfg, world, trainer.plan, trainer.dense_params, bench))
        summary = train(trainer)
        gc.collect()  # the pipeline's reference cycles hold in-flight Gloo work: free it before the teardown
        dist.barrier()
        dist.destroy_process_group()
    return summary


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(dcfg: DictConfig) -> None:
    """Hydra's `@main`, for the flags that only print (--help, --hydra-help, --info, --shell-completion)."""
    raise AssertionError("dlrm.train runs its jobs through main(), not Hydra's @main")


if __name__ == "__main__":
    main()
