"""For the emulated-cluster tests (dlrm.cluster): whether this machine allows it, what a run left
behind, and the reference's eval log loss."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F

from dlrm.config.compose import compose
from dlrm.data.source import make_source
from dlrm.models.dlrm import build_model
from tests.helpers.families import Overrides


def cannot_build_namespaces() -> str | None:
    """Why dlrm.cluster cannot run here (not root, no iproute2, `ip netns add` refused), or None."""
    if os.geteuid() != 0:
        return "dlrm.cluster needs root (network namespaces, veth, tc); run the tests as root"
    ip = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")
    if ip is None or not (shutil.which("tc") or shutil.which("tc", path="/usr/sbin:/sbin")):
        return "iproute2 (ip, tc) is not installed"
    probe = f"dlrm-probe-{os.getpid()}"
    added = subprocess.run([ip, "netns", "add", probe], capture_output=True, text=True)
    if added.returncode:
        return f"`ip netns add` fails here: {added.stderr.strip()}"
    subprocess.run([ip, "netns", "del", probe], capture_output=True)
    return None


def namespaces(prefix: str) -> list[str]:
    """The network namespaces whose names start with prefix."""
    ip = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin") or "ip"
    out = subprocess.run([ip, "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def links() -> set[str]:
    """The names of the host namespace's network interfaces."""
    ip = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin") or "ip"
    out = subprocess.run([ip, "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def processes_mentioning(*texts: str) -> list[str]:
    """'pid: command line' of every other process whose command line holds one of texts."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        if any(t in cmdline for t in texts):
            found.append(f"{entry.name}: {cmdline[:300]}")
    return found


def eval_logloss(overrides: Overrides, weights: dict[str, torch.Tensor]) -> float:
    """The log loss of the unsharded model with these weights over the config's eval batches, as the
    trainer computes it after training."""
    cfg = compose(list(overrides))
    model = build_model(cfg.model, torch.device("cpu"))
    model.load_state_dict(weights)
    model.eval()
    batches = make_source(cfg).batches("eval", rank=0, world_size=1)
    logits, labels = [], []
    with torch.no_grad():
        for _ in range(cfg.data.eval_batches):
            _, (_, batch_logits, batch_labels) = model(next(batches))
            logits.append(batch_logits)
            labels.append(batch_labels)
    return F.binary_cross_entropy_with_logits(torch.cat(logits).float(), torch.cat(labels).float()).item()
