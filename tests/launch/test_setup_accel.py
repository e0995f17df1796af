"""launch/setup.sh's accelerator choice: an unknown DLRM_ACCEL is refused before any venv is made."""

import os
import subprocess

from tests.helpers import REPO_ROOT as ROOT


def test_unknown_accel_is_refused_before_creating_the_venv(tmp_path):
    venv = tmp_path / "venv"
    env = {**os.environ, "DLRM_ACCEL": "gpu", "DLRM_VENV": str(venv)}
    r = subprocess.run(["bash", str(ROOT / "launch" / "setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "error: DLRM_ACCEL=gpu is not cpu, cuda or rocm; unset it to detect, or set DLRM_ACCEL=cpu|cuda|rocm"
    )
    assert not venv.exists()
