"""Entry point: `python -m dlrm.train [overrides]` or `torchrun --nproc_per_node=N -m dlrm.train [overrides]`.

The overrides are checked against the schema and conf/ first (an unknown key or option gets a
"did you mean"), then Hydra composes the config; `run` validates it, checks that the model can fit,
then builds and runs the trainer. Under torchrun all ranks agree on one run directory, and only
rank 0 writes into it.

A user error (`dlrm.errors.UserError`, also when DCP wraps one) prints `error: <message>` once and
exits with status 2, without a traceback: see `exit_on_user_error`. Launch through
`python -m dlrm.torchrun` (the launchers do) to keep torchrun's failure summary off the console too.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Optional

import hydra
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dlrm.config import Config, compose, register_configs, to_config, validate, validate_world
from dlrm.errors import UserError
from dlrm.topology import World

register_configs()


def run(cfg: Config, run_dir: Optional[Path] = None) -> dict:
    """Validate, train and evaluate on this rank; return the run summary (see README)."""
    validate(cfg)
    world = World.from_env()
    validate_world(cfg, world.world_size, world.local_world_size)
    from dlrm.plan import check_memory  # imports TorchRec (seconds): only once the config is valid
    from dlrm.trainer import Trainer

    check_memory(cfg, world.world_size)  # a model that cannot fit: refused before any process group

    summary = Trainer(cfg, world, run_dir).train()
    # Collect the trainer now: its pipeline and model form reference cycles that hold in-flight
    # Gloo work; freed only at interpreter exit, they can abort the process ("terminate called
    # without an active exception"). Then tear down together, and only after success: a rank
    # that failed leaves the clean-up to the launcher, as a collective teardown could hang.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return summary


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def hydra_main(dcfg: DictConfig) -> None:
    world = World.from_env()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    logging.getLogger("torchrec").setLevel(logging.WARNING)  # its INFO lines drown the progress
    warnings.filterwarnings("ignore", category=FutureWarning, module="torchrec")
    try:
        cfg = to_config(dcfg)
        if world.is_main:
            (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(dcfg, resolve=True))
        summary = run(cfg, run_dir)
    except Exception as e:
        exit_on_user_error(e, world)
        raise
    if world.is_main:
        speed = summary["train_samples_per_s"]
        print(
            f"done: {summary['steps']} steps, {f'{speed:.0f}' if speed else 'no'} train samples/s, "
            f"eval auc {summary['eval_auc']}, logloss {summary['eval_logloss']}; outputs in {run_dir}"
        )


def user_error_in(e: BaseException) -> Optional[UserError]:
    """The UserError `e` is or wraps (as a cause, or inside DCP's CheckpointException), else None."""
    from torch.distributed.checkpoint import CheckpointException

    seen = set()
    todo = [e]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, UserError):
            return e
        if isinstance(e, CheckpointException):  # one (exception, traceback) per failed rank
            todo += [failure[0] if isinstance(failure, tuple) else failure for failure in e.failures.values()]
        todo += [e.__cause__, e.__context__]
    return None


def user_error_message(e: UserError, world: World) -> Optional[str]:
    """The one line to print for `e` on this rank, or None when rank 0 prints it (see dlrm.errors)."""
    if world.is_main:
        return f"error: {e}"
    if e.same_on_all_ranks:
        return None
    return f"error: [rank {world.rank}] {e}"


def exit_on_user_error(e: BaseException, world: World) -> None:
    """If `e` is (or wraps) a UserError: print its one line (see `user_error_message`) and exit 2.

    Returns (so the caller re-raises) for anything else: bugs and environment failures keep their
    traceback. With a process group up, the exit skips interpreter teardown (os._exit): other ranks
    may be inside a collective, and tearing Gloo down then can hang or abort instead of exiting 2.
    """
    user = user_error_in(e)
    if user is None:
        return
    line = user_error_message(user, world)
    if line:
        print(line, file=sys.stderr)
    if dist.is_available() and dist.is_initialized():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(user.exit_code)
    sys.exit(user.exit_code)


def _shared_run_dir(world: World) -> str:
    """One run directory for all ranks of a torchrun job, agreed through torchrun's own store.

    The first rank to ask proposes outputs/<timestamp>; every rank reads back the same value.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise SystemExit(
            "error: several ranks but no torchrun store to agree on a run directory; "
            "pass hydra.run.dir=DIR (the same on every rank)"
        )
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60)
    )
    key = f"dlrm/run_dir/{os.environ.get('TORCHELASTIC_RUN_ID', '')}"
    proposal = time.strftime("outputs/%Y-%m-%d_%H-%M-%S")
    return store.compare_set(key, "", proposal).decode()


def main() -> None:
    """Add the launcher-dependent Hydra overrides, then hand over to Hydra."""
    world = World.from_env()
    args = sys.argv[1:]
    if not any(a.startswith("-") for a in args):  # Hydra's own flags (--cfg, -m, --help): Hydra's business
        try:  # fail fast, before Hydra makes a run directory, with a "did you mean" for a misspelt key
            cfg = compose(args)
            validate(cfg)
            validate_world(cfg, world.world_size, world.local_world_size)
        except UserError as e:
            exit_on_user_error(e, world)
    if world.world_size > 1 and not any(a.startswith("hydra.run.dir=") for a in args):
        sys.argv.append(f"hydra.run.dir={_shared_run_dir(world)}")
    if not world.is_main:  # only rank 0 writes Hydra's files and log
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    hydra_main()


if __name__ == "__main__":
    main()
