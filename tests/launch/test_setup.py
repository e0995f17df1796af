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


def _script(name: str):
    """A launch/ script imported as a module (they run before setup, outside the package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "launch" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


torch_wheel = _script("torch_wheel")
uv_env = _script("uv_env")

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
        (report("2.13.0+cpu", MIRROR), ["torch==2.13.0+cpu"], "from the configured indexes"),
        (report("2.13.0+cpu", CPU_INDEX + "/torch-2.13.0%2Bcpu-cp311.whl"), ["torch==2.13.0+cpu"], "configured"),
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
  "-c import sys, torch, torchrec, fbgemm_gpu;"*) [ -n "${FAKE_CUDA_TORCH:-}" ] && exit 3; exit 0 ;;
  "-c import torch, sys"*) exit 1 ;;
  *--dry-run*) cat "$FAKE_REPORT" ;;
  "-m pip config list") printf '%s' "${FAKE_PIP_CONFIG:-}" ;;
  *"install uv=="*) exit "${FAKE_UV_INSTALL_RC:-${FAKE_PIP_RC:-0}}" ;;
  "-m pip"*) exit "${FAKE_PIP_RC:-0}" ;;
  "-m uv"*)
    echo "uv sees UV_FIND_LINKS=${UV_FIND_LINKS:-} UV_INDEX=${UV_INDEX:-}" >> "$FAKE_LOG"
    exit "${FAKE_UV_RC:-0}" ;;
  launch/torch_wheel.py*|launch/uv_env.py*) exec "$REAL_PYTHON" "$@" ;;
  "-m pytest"*) echo "pytest sees PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}" >> "$FAKE_LOG" ;;
esac
"""


def run_setup(tmp_path: Path, rep: dict, pip_rc: int = 0, **fake: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """launch/setup.sh with the fake venv python; `fake`: FAKE_UV_RC, FAKE_PIP_CONFIG, FAKE_CUDA_TORCH
    (set: the installed torch is a CUDA build), DLRM_INSTALLER."""
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
        **fake,
    )
    r = subprocess.run(["bash", str(ROOT / "launch" / "setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    return r, (tmp_path / "log").read_text().splitlines()


def installs(log: list[str]) -> list[str]:
    """The package installs, by uv or pip (not uv's own install nor the dry run)."""
    return [
        line
        for line in log
        if line.startswith(("-m pip", "-m uv")) and " install " in line
        if "--dry-run" not in line and "uv==" not in line
    ]


def test_setup_takes_the_cpu_build_from_pytorchs_index_when_pypi_offers_cuda(tmp_path):
    r, log = run_setup(tmp_path, report("2.13.0", PYPI))
    assert r.returncode == 0, r.stderr
    assert installs(log)[0].endswith(f" --extra-index-url {CPU_INDEX} torch==2.13.0+cpu")
    assert "(not a CPU build); taking torch 2.13.0+cpu from PyTorch's CPU wheel index" in r.stderr
    assert list((tmp_path / "venv").glob(".dlrm-setup-cpu-*"))  # done: the next run is instant


def test_setup_keeps_the_configured_cpu_build(tmp_path):
    r, log = run_setup(tmp_path, report("2.13.0+cpu", MIRROR))
    assert r.returncode == 0, r.stderr
    assert installs(log)[0].endswith(" torch==2.13.0+cpu")
    assert "torch 2.13.0+cpu from the configured indexes" in r.stderr


def test_setup_that_cannot_get_torch_says_how_to_fix_it(tmp_path):
    r, log = run_setup(tmp_path, report("2.13.0", PYPI), pip_rc=1, FAKE_UV_RC="1")
    assert r.returncode == 1
    assert "could not install the CPU build of torch 2.13.0" in r.stderr and "PIP_EXTRA_INDEX_URL" in r.stderr
    assert not list((tmp_path / "venv").glob(".dlrm-setup-*"))


def test_setup_installs_through_uv_with_pips_settings(tmp_path):
    config = "global.find-links='/opt/wheels'\n:env:.extra-index-url='file:///a file:///b'\n"
    r, log = run_setup(tmp_path, report("2.13.0+cpu", MIRROR), FAKE_PIP_CONFIG=config)
    assert r.returncode == 0, r.stderr
    assert any(line.startswith("-m pip") and "install uv==" in line for line in log)
    assert [line.split(" install ")[1] for line in installs(log)] == [
        "-q --python " + str(tmp_path / "venv" / "bin" / "python") + " " + args
        for args in ("torch==2.13.0+cpu", "-e .[cpu,test] torch==2.13.0+cpu", "--no-deps torchrec==1.8.0")
    ]
    assert all(line.startswith("-m uv pip install") for line in installs(log))
    assert log.count("uv sees UV_FIND_LINKS=/opt/wheels UV_INDEX=file:///a file:///b") == 3


@pytest.mark.parametrize(
    "fake,why",
    [
        (dict(DLRM_INSTALLER="pip"), ""),
        (dict(FAKE_PIP_CONFIG="global.client-cert='/k.pem'\n"), "client-cert='/k.pem' has no uv equivalent"),
        (dict(FAKE_UV_RC="1"), "uv could not install"),
        (dict(FAKE_UV_INSTALL_RC="1"), "pip could not install uv==0.13.9; installing with pip"),
    ],
)
def test_setup_installs_with_pip_when_asked_when_uv_cannot_take_a_setting_or_fails(tmp_path, fake, why):
    r, log = run_setup(tmp_path, report("2.13.0+cpu", MIRROR), **fake)
    assert r.returncode == 0, r.stderr
    pip_installs = [line for line in installs(log) if line.startswith("-m pip")]
    assert [line.split(" install ")[1] for line in pip_installs] == [
        "torch==2.13.0+cpu",
        "-e .[cpu,test] torch==2.13.0+cpu",
        "--no-deps torchrec==1.8.0",
    ]
    assert why in r.stderr


def test_setup_that_ends_with_a_cuda_torch_on_cpu_fails_and_says_so(tmp_path):
    r, _ = run_setup(tmp_path, report("2.13.0+cpu", MIRROR), FAKE_CUDA_TORCH="1")
    assert r.returncode == 1
    assert "the installed torch is a CUDA build on a CPU machine" in r.stderr and "DLRM_INSTALLER=pip" in r.stderr
    assert not list((tmp_path / "venv").glob(".dlrm-setup-*"))


def test_uv_gets_pips_settings_with_pips_precedence():
    config = (
        "global.index-url='https://global/simple'\n"
        "install.index-url='https://install/simple'\n"
        ":env:.find-links='/w1 /w2'\n"
        "global.find-links='/ignored'\n"
        "global.extra-index-url='file:///a\\nfile:///b'\n"
        "global.constraint='/c.txt'\n"
        "global.cert='/ca.pem'\n"
        "global.trusted-host='h1 h2'\n"
        "global.no-index='false'\n"
        "global.proxy='http://p:3128'\n"
        "global.disable-pip-version-check='1'\n"
        "download.client-cert='/only/for/download.pem'\n"
    )
    assert uv_env.uv_environment(config) == {
        "UV_DEFAULT_INDEX": "https://install/simple",
        "UV_FIND_LINKS": "/w1,/w2",
        "UV_INDEX": "file:///a file:///b",
        "UV_CONSTRAINT": "/c.txt",
        "SSL_CERT_FILE": "/ca.pem",
        "UV_INSECURE_HOST": "h1 h2",
        "HTTP_PROXY": "http://p:3128",
        "HTTPS_PROXY": "http://p:3128",
    }
    assert uv_env.uv_environment(":env:.no-index='1'\n") == {"UV_NO_INDEX": "1"}
    with pytest.raises(ValueError, match="client-cert"):
        uv_env.uv_environment("install.client-cert='/k.pem'\n")


def test_test_script_uses_the_same_venv_as_setup(tmp_path):
    """launch/test.sh runs pytest with DLRM_VENV's python, after setting that venv up, on 3 xdist
    workers unless DLRM_TEST_WORKERS says otherwise, with bytecode caches on whatever the caller set."""
    r, log = run_setup(tmp_path, report("2.13.0+cpu", MIRROR))
    env = dict(
        os.environ,
        DLRM_VENV=str(tmp_path / "venv"),
        DLRM_ACCEL="cpu",
        FAKE_LOG=str(tmp_path / "log"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.pop("DLRM_TEST_WORKERS", None)  # the default, whatever this session was started with
    r = subprocess.run(
        ["bash", str(ROOT / "launch" / "test.sh"), "-k", "nothing"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "log").read_text().splitlines()[-2:] == [
        "-m pytest -q -n 3 --dist loadgroup --no-loadscope-reorder -k nothing",
        "pytest sees PYTHONDONTWRITEBYTECODE=unset",
    ]
    r = subprocess.run(
        ["bash", str(ROOT / "launch" / "test.sh"), "-k", "nothing"],
        env=dict(env, DLRM_TEST_WORKERS="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "log").read_text().splitlines()[
        -2
    ] == "-m pytest -q -n 0 --dist loadgroup --no-loadscope-reorder -k nothing"
