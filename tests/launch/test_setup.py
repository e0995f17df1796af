"""launch/setup.sh on a CPU machine: which index torch comes from, without network.

The decision (launch/torch_wheel.py) is fed pip reports as pip writes them; the whole script runs
against a fake venv whose `python` records the pip commands instead of running them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT as ROOT

spec = importlib.util.spec_from_file_location("torch_wheel", ROOT / "launch" / "torch_wheel.py")
torch_wheel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(torch_wheel)

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
MIRROR = "file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"
PYPI = "https://files.pythonhosted.org/packages/ab/cd/torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"


def report(version: str, url: str) -> dict:
    """The part of pip's --report that matters: one torch to install."""
    return {
        "version": "1",
        "install": [{"metadata": {"name": "torch", "version": version}, "download_info": {"url": url}}],
    }


@pytest.mark.parametrize(
    "rep,args,said",
    [
        (report("2.13.0+cpu", MIRROR), ["torch==2.13.0"], "from the configured indexes"),
        (report("2.13.0+cpu", CPU_INDEX + "/torch-2.13.0%2Bcpu-cp311.whl"), ["torch==2.13.0"], "configured"),
        (report("2.13.0", PYPI), ["--extra-index-url", CPU_INDEX, "torch==2.13.0+cpu"], "not a CPU build"),
        (
            report("2.13.0+cu126", "https://download.pytorch.org/whl/cu126/torch-2.13.0%2Bcu126.whl"),
            ["--extra-index-url", CPU_INDEX, "torch==2.13.0+cpu"],
            "not a CPU build",
        ),
        ({}, ["--extra-index-url", CPU_INDEX, "torch==2.13.0+cpu"], "offer no torch==2.13.0"),
    ],
)
def test_cpu_build_from_the_configured_indexes_else_from_pytorchs_cpu_index(rep, args, said):
    chosen, message = torch_wheel.choose(rep, "2.13.0")
    assert chosen == args
    assert said in message


FAKE_PYTHON = """#!/usr/bin/env bash
# A venv python that runs nothing heavy: it logs its arguments; pip's dry run prints $FAKE_REPORT.
printf '%s\\n' "$*" >> "$FAKE_LOG"
case "$*" in
  "-c import torch, sys"*) exit 1 ;;
  *--dry-run*) cat "$FAKE_REPORT" ;;
  "-m pip"*) exit "${FAKE_PIP_RC:-0}" ;;
  launch/torch_wheel.py*) exec "$REAL_PYTHON" "$@" ;;
esac
"""


def run_setup(tmp_path: Path, rep: dict, pip_rc: int = 0) -> tuple[subprocess.CompletedProcess, list[str]]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    (tmp_path / "report.json").write_text(json.dumps(rep))
    env = dict(
        os.environ,
        DLRM_VENV=str(venv),
        DLRM_ACCEL="cpu",
        FAKE_LOG=str(tmp_path / "log"),
        FAKE_REPORT=str(tmp_path / "report.json"),
        REAL_PYTHON=sys.executable,
        FAKE_PIP_RC=str(pip_rc),
    )
    r = subprocess.run(["bash", str(ROOT / "launch" / "setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    return r, (tmp_path / "log").read_text().splitlines()


def installs(log: list[str]) -> list[str]:
    return [line for line in log if line.startswith("-m pip") and " install " in line and "--dry-run" not in line]


def test_setup_takes_the_cpu_build_from_pytorchs_index_when_pypi_offers_cuda(tmp_path):
    r, log = run_setup(tmp_path, report("2.13.0", PYPI))
    assert r.returncode == 0, r.stderr
    assert installs(log)[0].endswith(f"install --extra-index-url {CPU_INDEX} torch==2.13.0+cpu")
    assert "(not a CPU build); taking torch 2.13.0+cpu from PyTorch's CPU wheel index" in r.stderr
    assert list((tmp_path / "venv").glob(".dlrm-setup-cpu-*"))  # done: the next run is instant


def test_setup_keeps_the_configured_cpu_build(tmp_path):
    r, log = run_setup(tmp_path, report("2.13.0+cpu", MIRROR))
    assert r.returncode == 0, r.stderr
    assert installs(log)[0].endswith("install torch==2.13.0")
    assert "torch 2.13.0+cpu from the configured indexes" in r.stderr


def test_setup_that_cannot_get_torch_says_how_to_fix_it(tmp_path):
    r, log = run_setup(tmp_path, report("2.13.0", PYPI), pip_rc=1)
    assert r.returncode == 1
    assert "could not install the CPU build of torch 2.13.0" in r.stderr and "PIP_EXTRA_INDEX_URL" in r.stderr
    assert not list((tmp_path / "venv").glob(".dlrm-setup-*"))


def test_test_script_uses_the_same_venv_as_setup(tmp_path):
    """launch/test.sh runs pytest with DLRM_VENV's python, after setting that venv up, on 3 xdist
    workers unless DLRM_TEST_WORKERS says otherwise."""
    r, log = run_setup(tmp_path, report("2.13.0+cpu", MIRROR))
    env = dict(os.environ, DLRM_VENV=str(tmp_path / "venv"), DLRM_ACCEL="cpu", FAKE_LOG=str(tmp_path / "log"))
    env.pop("DLRM_TEST_WORKERS", None)  # the default, whatever this session was started with
    r = subprocess.run(
        ["bash", str(ROOT / "launch" / "test.sh"), "-k", "nothing"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "log").read_text().splitlines()[-1] == "-m pytest -q -n 3 --dist loadgroup -k nothing"
    r = subprocess.run(
        ["bash", str(ROOT / "launch" / "test.sh"), "-k", "nothing"],
        env=dict(env, DLRM_TEST_WORKERS="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "log").read_text().splitlines()[-1] == "-m pytest -q -n 0 --dist loadgroup -k nothing"
