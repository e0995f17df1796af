"""launch/test.sh runs 3 pytest-xdist workers with `--dist loadgroup`: the tests of one xdist group
(tests/conftest.py puts every reader of the scenario families in one) must run in one worker, or each
worker would launch the families again. Catches a pytest or xdist release that breaks the grouping."""

import subprocess
import sys

GROUPED = """
import os, pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("n", range(3))
def test_grouped(n):
    with open(os.environ["WORKERS_LOG"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""

FREE = """
import time

def test_free():
    time.sleep(0.2)
"""


def test_a_group_runs_in_one_worker(tmp_path):
    for i in range(3):
        (tmp_path / f"test_grouped_{i}.py").write_text(GROUPED)
        (tmp_path / f"test_free_{i}.py").write_text(FREE)
    log = tmp_path / "workers.log"
    command = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider"]
    env = {"WORKERS_LOG": str(log), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([*command, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    workers = log.read_text().split()
    assert len(workers) == 9 and len(set(workers)) == 1, workers
