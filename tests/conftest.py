"""Shared fixtures: compose configs from conf/ the way `python -m dlrm.train` does."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from dlrm.config import Config, register_configs, to_config

CONF = Path(__file__).resolve().parents[1] / "conf"
register_configs()


def compose_config(*overrides: str) -> Config:
    """The typed Config for these Hydra overrides (no validation)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=list(overrides)))


@pytest.fixture
def make_config():
    return compose_config
