"""Hydra composition in one place: where the config groups live, and overrides -> a typed `Config`.

`CONF_DIR` is `conf/` of a source checkout (editable install) or `dlrm/conf/` of an installed wheel
(pyproject.toml packages conf/ there), so `dlrm-train`, `python -m dlrm.plan` and the tests find the
same files however dlrm was installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dlrm.config import Config, ConfigError, register_configs, to_config


def _conf_dir() -> Path:
    package = Path(__file__).resolve().parent
    installed = package / "conf"  # a wheel: conf/ packaged inside dlrm/
    return installed if (installed / "config.yaml").is_file() else package.parent / "conf"


CONF_DIR = _conf_dir()


def group_options(group: str) -> list[str]:
    """The option names of one config group (the YAML files of conf/<group>/), sorted."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def compose(overrides: Sequence[str] = ()) -> Config:
    """The typed Config for these Hydra overrides, composed from conf/ as `dlrm.train` does (not
    validated). A misspelt key, a wrong type or an unknown option raises ConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return to_config(hydra_compose(config_name="config", overrides=list(overrides)))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"cannot compose the config from overrides {list(overrides)}: {e}") from e
