"""What the check ran on: the card (nvidia-smi), the software stack against CI's pins, the commit."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu", "hydra-core", "tensordict", "torchmetrics")


def versions() -> dict[str, str | None]:
    """Python's and the installed packages' versions (None: not installed)."""
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def ci_pins(root: Path = ROOT) -> dict[str, str]:
    """The versions CI tests: torch and fbgemm-gpu from pyproject.toml, torchrec from launch/setup.sh."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["cuda"]]
    pins = {m[1]: m[2] for d in wanted if (m := re.fullmatch(r"(torch|fbgemm-gpu)==(\S+)", d))}
    setup = re.search(r"^TORCHREC=(\S+)$", (root / "launch" / "setup.sh").read_text(), re.M)
    if setup:
        pins["torchrec"] = setup[1]
    return pins


def stack(root: Path = ROOT) -> dict:
    """The installed versions, CI's pins, and whether the check runs on them (the local build tag, +cu130,
    ignored; fbgemm's CPU package stands for fbgemm-gpu where that is absent, as on a CPU dry run)."""
    have, pins = versions(), ci_pins(root)
    fbgemm = have["fbgemm-gpu"] or have["fbgemm-gpu-cpu"]
    got = {"torch": have["torch"], "torchrec": have["torchrec"], "fbgemm-gpu": fbgemm}
    same = all((got[k] or "").split("+")[0] == v for k, v in pins.items())
    return {"versions": have, "ci_pins": pins, "is_ci_stack": same}


def gpus() -> list[dict] | None:
    """Each GPU nvidia-smi lists: name, memory in MiB, driver; None without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"]
    try:
        r = subprocess.run(query, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [parse_gpu(line) for line in r.stdout.splitlines() if line.strip()]


def parse_gpu(line: str) -> dict:
    """One line of nvidia-smi's csv (name, memory.total MiB, driver_version)."""
    name, memory, driver = (part.strip() for part in line.rsplit(",", 2))
    return {"name": name, "memory_mib": int(memory) if memory.isdigit() else None, "driver": driver}


def source_commit() -> str | None:
    """The commit checked: git's HEAD, or BUNDLE_COMMIT written by dev/gpu_bundle.py into a bundle's source."""
    marker = ROOT / "BUNDLE_COMMIT"
    if marker.is_file():
        return marker.read_text().strip()
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (r.stdout.strip() or None) if r.returncode == 0 else None
