"""Running the job in its run directory as `@hydra.main` would: `.hydra/` records, `HydraConfig`,
`hydra.job.env_set` and `hydra.callbacks`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from omegaconf import DictConfig, OmegaConf, open_dict

from dlrm.config.hydra_internals import job_callbacks

T = TypeVar("T")


def resolved_run_dir(composed: DictConfig) -> Path:
    """The run directory, resolved once (`${now:...}`) and recorded in `composed`: where the run started."""
    from hydra.types import RunMode

    run_dir = Path(str(OmegaConf.select(composed, "hydra.run.dir"))).absolute()
    with open_dict(composed.hydra):
        composed.hydra.mode = RunMode.RUN
        composed.hydra.run.dir = str(run_dir)
    return run_dir


def run_in_hydra_job(composed: DictConfig, job: Callable[[], T]) -> T:
    """Run `job()` by Hydra's `run_job` in the run directory of `composed`, between the callbacks'
    run start and end; call inside a Hydra session.

    Returns:
        What `job` returns; raises what it raises.
    """
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import JobStatus, run_job
    from hydra.types import HydraContext

    callbacks = job_callbacks(composed)
    config_name = composed.hydra.job.config_name  # -cn, as Hydra recorded it
    callbacks.on_run_start(config=composed, config_name=config_name)
    context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
    failures: list[BaseException] = []

    def task(_: DictConfig) -> T:
        try:
            return job()
        except BaseException as e:
            failures.append(e)
            raise

    done = run_job(task, composed, "hydra.run.dir", None, context, configure_logging=False)
    callbacks.on_run_end(config=composed, config_name=config_name, job_return=done)
    if done.status is JobStatus.FAILED:  # raised here: `done.return_value` would print a line of its own
        raise failures[0]
    return done.return_value
