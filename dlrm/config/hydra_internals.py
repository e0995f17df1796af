"""Hydra's private API, in one place. Each use says why no public API does the job."""

# tests/test_train_cli.py fails when a Hydra release changes any of these.
from __future__ import annotations

import argparse
from pathlib import Path

from omegaconf import DictConfig


def args_parser() -> argparse.ArgumentParser:
    """The parser `@hydra.main` reads its command line with (flags and overrides in any order).

    Private because Hydra exposes it only through `@hydra.main`, which would run the job itself;
    we compose and check the config before any run directory exists."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def prepend_config_dir(directory: Path) -> None:
    """Put `directory` first in the current session's config search path, as `--config-dir` does.

    Private because Hydra has no public call that adds a second directory which may hold the primary
    config (`-cn`); a `hydra.searchpath` entry cannot. Re-initializes the session: call inside
    `hydra_session`, which restores the previous one."""
    import copy

    from hydra._internal.hydra import Hydra
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra

    search_path = copy.deepcopy(GlobalHydra.instance().config_loader().get_search_path())
    search_path.prepend(provider="command-line", path=f"file://{directory}", anchor=SearchPathQuery(provider="schema"))
    GlobalHydra.instance().clear()
    Hydra.create_main_hydra2(task_name="train", config_search_path=search_path)


def job_callbacks(composed: DictConfig):
    """Hydra's `Callbacks` for the configured `hydra.callbacks`, as `@hydra.main` builds them.

    Private because `hydra.core.utils.run_job` (public) needs a `HydraContext` holding them and
    Hydra builds that only inside `@hydra.main`."""
    from hydra._internal.callbacks import Callbacks

    return Callbacks(composed)
