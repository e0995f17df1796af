"""The launcher's variables are user input: a WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR or MASTER_PORT that cannot describe a job is one `error:` line naming the variable and
its value, exit 2, before torch is imported (`python -m dlrm.train` with them in its environment); a
rank whose peers never come says whom it waits for, then fails in one line at the timeout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dlrm.distributed.world import LauncherError, World
from tests.helpers import REPO_ROOT as REPO
from tests.helpers.cli import assert_one_error

LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
GOOD = {"WORLD_SIZE": "4", "RANK": "1", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}

CASES = [
    ({"WORLD_SIZE": "two"}, ["WORLD_SIZE='two'", "integer"]),
    ({"RANK": "-1"}, ["RANK='-1'", "integer"]),
    ({"RANK": "4"}, ["RANK=4", "WORLD_SIZE=4", "below its size"]),
    ({"LOCAL_RANK": "2"}, ["LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"]),
    ({"LOCAL_WORLD_SIZE": "3"}, ["LOCAL_WORLD_SIZE must divide WORLD_SIZE", "LOCAL_WORLD_SIZE=3"]),
    ({"WORLD_SIZE": "0", "RANK": "0"}, ["at least 1", "WORLD_SIZE=0"]),
    ({"MASTER_PORT": "70000"}, ["MASTER_PORT='70000'", "1..65535"]),
    ({"MASTER_PORT": "http"}, ["MASTER_PORT='http'"]),
    ({"MASTER_ADDR": "host; rm -rf /"}, ["MASTER_ADDR='host; rm -rf /'"]),
]


@pytest.mark.parametrize(("bad", "words"), CASES[:5])
def test_bad_launcher_variables_are_one_line_from_the_command(bad, words, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    env |= {**GOOD, **bad, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "dlrm.train", "model=tiny", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert_one_error(done.returncode, done.stdout, done.stderr, *words, "torchrun")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("bad", "words"), CASES)
def test_bad_launcher_variables_are_refused(bad, words):
    with pytest.raises(LauncherError) as e:
        World.from_env({**GOOD, **bad})
    for word in words:
        assert word in str(e.value)


def test_good_launcher_variables_describe_the_job():
    assert World.from_env({}) == World(0, 1, 0, 1)
    assert World.from_env({**GOOD, "MASTER_ADDR": "node-1.cluster", "MASTER_PORT": "29500"}) == World(1, 4, 1, 2)
    assert World.from_env({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "[::1]"}) == World(1, 2, 0, 2)


# A lone rank: (what it says while it waits, what it fails with, trainer.collective_timeout_s). Rank 0
# says whom it misses after rendezvous.NOTICE_S (5 s) of waiting, so its timeout must pass that; rank 1
# says at once that rank 0's store does not answer.
LONE = {
    "0": ("waiting for rank(s) 1 to join at", "rank(s) 1 of WORLD_SIZE=2 never joined at", 7),
    "1": ("waiting for rank 0's store at", "nobody answered at", 2),
}


def _lone_rank(rank: str, timeout_s: float, tmp_path) -> tuple[subprocess.Popen, str]:
    """`python -m dlrm.train` as rank `rank` of a hand-set WORLD_SIZE=2 whose other rank never starts."""
    from tests.helpers.harness import free_port

    address = f"127.0.0.1:{free_port()}"
    host, port = address.split(":")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    env |= {"WORLD_SIZE": "2", "RANK": rank, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": host}
    env |= {"MASTER_PORT": port, "PYTHONPATH": str(REPO)}
    job = subprocess.Popen(
        [sys.executable, "-m", "dlrm.train", "model=tiny", "topology.nodes=2",
         f"trainer.collective_timeout_s={timeout_s}", f"hydra.run.dir={tmp_path / f'run{rank}'}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return job, address


@pytest.mark.slow
def test_a_rank_whose_peers_never_come_says_so_then_fails_in_one_line(tmp_path):
    """WORLD_SIZE=2 set by hand and one rank started (rank 0 alone, and rank 1 alone, side by side): it
    says whom it waits for and where before the end, then fails in one line at
    trainer.collective_timeout_s, exit 2."""
    jobs = {rank: _lone_rank(rank, timeout_s, tmp_path) for rank, (_, _, timeout_s) in LONE.items()}
    try:
        outputs = {rank: job.communicate(timeout=240) for rank, (job, _) in jobs.items()}
    finally:
        for job, _ in jobs.values():
            if job.poll() is None:
                job.kill()
                job.wait()
    for rank, (waits, fails, _) in LONE.items():
        (job, address), (out, err) = jobs[rank], outputs[rank]
        line = assert_one_error(job.returncode, out, err, fails, address, "trainer.collective_timeout_s")
        notices = [x for x in err.splitlines() if waits in x]
        assert len(notices) == 1 and f"rank {rank} of 2: " in notices[0] and address in notices[0], err
        assert err.index(notices[0]) < err.index(line)
        assert "[E" not in err and "[W" not in err, err  # no C++ retry logs
