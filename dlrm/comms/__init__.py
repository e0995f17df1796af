"""Communication analysis: a collective benchmark (`bench`), an alpha-beta cost model (`model`), a report.

`load_topology` reads a `TopologyConfig` by name (conf/topology/NAME.yaml) or from a YAML path.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from omegaconf import OmegaConf

from dlrm.config import TopologyConfig
from dlrm.config.compose import CONF_DIR

TOPOLOGY_DIR = CONF_DIR / "topology"


def load_topology(name_or_path: str) -> TopologyConfig:
    """A `TopologyConfig` from conf/topology/<name>.yaml or from a YAML file path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = TOPOLOGY_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TOPOLOGY_DIR.glob("*.yaml")))
        raise FileNotFoundError(
            f"topology {name_or_path!r} not found (looked at {path}); pass one of {known} or a YAML file path"
        )
    merged = OmegaConf.merge(OmegaConf.structured(TopologyConfig), OmegaConf.load(path))
    return cast(TopologyConfig, OmegaConf.to_object(merged))
