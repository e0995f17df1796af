"""The GPU image's stack (torch 2.11.0, torchrec 1.6.1, fbgemm-gpu 1.6.0, Python 3.12), on CPU: a short
2-rank training that saves, resumes into another sharding, and evaluates, and the comms benchmark, run
with that venv's Python on this tree. CI's venv tests torch 2.13 / torchrec 1.8 / fbgemm-gpu-cpu 1.8.

Those two are marked long (`bash launch/test.sh -m long tests/test_versions.py`, about a minute); they
need the venv that `bash dev/device_venv.sh` creates (a few GB from PyPI, once), at DLRM_DEVICE_VENV
(default /work/venv-device), and skip, naming that command, without it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

VENV = Path(os.environ.get("DLRM_DEVICE_VENV", "/work/venv-device"))
PYTHON = VENV / "bin" / "python"
WANT = {"python": "3.12", "torch": "2.11.0", "torchrec": "1.6.1", "fbgemm-gpu-cpu": "1.6.0"}
VERSIONS = """
import importlib.metadata as m, json, sys
got = {k: m.version(k).split("+")[0] for k in ("torch", "torchrec", "fbgemm-gpu-cpu")}
print(json.dumps({"python": "%d.%d" % sys.version_info[:2], **got}))
"""


@pytest.fixture(scope="module")
def device_python() -> Path:
    if not PYTHON.is_file():
        pytest.skip(
            f"no venv of the GPU image's versions at {VENV}: create it with `bash dev/device_venv.sh` "
            "(or set DLRM_DEVICE_VENV to one)"
        )
    got = json.loads(subprocess.run([PYTHON, "-c", VERSIONS], capture_output=True, text=True, check=True).stdout)
    assert got == WANT, f"{VENV} holds {got}, not the GPU image's {WANT}: run `bash dev/device_venv.sh` again"
    return PYTHON


def _torchrun(python: Path, *args: str, timeout: int = 300) -> str:
    """Two Gloo ranks on loopback under `python -m dlrm.torchrun`, this tree first on the path; the console."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [python, "-m", "dlrm.torchrun", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--nproc_per_node=2"]
    done = subprocess.run(
        [*cmd, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done.stdout + done.stderr


@pytest.mark.long
def test_training_saves_resumes_and_reshards(device_python, tmp_path):
    run = f"hydra.run.dir={tmp_path / 'run'}"
    train = ("-m", "dlrm.train", "checkpoint.every_steps=10", run)
    _torchrun(device_python, *train, "sharding=table_wise", "trainer.max_steps=20")
    out = _torchrun(device_python, *train, "sharding=row_wise", "trainer.max_steps=30", "trainer.resume=auto")
    assert f"resumed from {tmp_path / 'run' / 'checkpoints' / 'step_00000020'} at step 20" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["world_size"] == 2
    assert {p["sharding_type"] for p in summary["sharding_plan"]} == {"row_wise"}
    assert 0.65 < summary["eval_auc"] < 1 and 0 < summary["final_loss"] < 0.7
    assert (tmp_path / "run" / "checkpoints" / "step_00000030" / "manifest.json").is_file()
    assert "_fbgemm_torch_compat_table" not in out  # fbgemm 1.6.0's 14 import warnings dropped (dlrm/__init__.py)


@pytest.mark.long
def test_comms_bench_runs_every_collective(device_python, tmp_path):
    out = tmp_path / "bench"
    args = ("--min-bytes", "1K", "--max-bytes", "8K", "--warmup", "1", "--iters", "3", "--out", str(out))
    _torchrun(device_python, "-m", "dlrm.comms.measure", *args)
    bench = json.loads((out / "bench.json").read_text())
    assert (bench["backend"], bench["world_size"]) == ("gloo", 2)
    rows = {(r["collective"], r["bytes"]): r for r in bench["results"]}
    collectives = ("allreduce", "alltoall", "alltoall_uneven", "reduce_scatter", "allgather")
    assert set(rows) == {(c, n) for c in collectives for n in (1024, 2048, 4096, 8192)}
    assert all(r["median_us"] > 0 and r["busbw_GBps"] > 0 for r in rows.values())


def test_fbgemm_1_6_table_gap_warning_is_dropped_and_others_kept(caplog):
    """fbgemm-gpu 1.6.0 warns on import that its torch table lacks 1.6.0 (dlrm/__init__.py drops it)."""
    import dlrm  # noqa: F401  (the filter is set when the package is imported)

    gap = "\n  \x1b[33m\n  _fbgemm_torch_compat_table has no entry for 1.6.0 of FBGEMM;\n  cannot determine ..."
    with caplog.at_level(logging.WARNING, logger=""):
        logging.warning(gap)
        logging.warning("Could not load the library 'fbgemm_gpu_py.so'!")
    assert [r.getMessage() for r in caplog.records] == ["Could not load the library 'fbgemm_gpu_py.so'!"]
