"""Clean stops: SIGTERM (a cluster's preemption, sent to torchrun) and Ctrl-C (SIGINT to the whole
foreground process group) end a 2-rank job at the next log step with one line naming the step, the
last checkpoint and how to continue, exit 128 + signal, no traceback; with checkpoint.on_signal=true
a checkpoint of that step is saved first, and `trainer.resume=auto` continues from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from dlrm.distributed.topology import collective_failure
from dlrm.distributed.world import World
from tests.helpers import REPO_ROOT as REPO
from tests.helpers.cli import train_in_process
from tests.helpers.families import PAIR, runs
from tests.helpers.harness import default_group

RUN = [
    "model=tiny",
    "data.global_batch_size=64",
    "data.eval_batches=1",
    "trainer.max_steps=100000",
    "trainer.log_every_steps=5",
    "trainer.progress=none",
    "trainer.tensorboard=false",
]


def _start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "dlrm.torchrun", "--standalone", "--nproc_per_node=2", "-m", "dlrm.train"]
    log = open(f"{run_dir}.log", "w")
    return subprocess.Popen(
        [*args, *RUN, f"hydra.run.dir={run_dir}", *overrides],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: what a terminal's Ctrl-C reaches
    )


def _logged(run_dir: Path, job: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert job.poll() is None and time.monotonic() < deadline, Path(f"{run_dir}.log").read_text()[-20000:]
        time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_and_ctrl_c_stop_two_ranks_cleanly_and_the_run_continues(tmp_path, capfd):
    term, intr = tmp_path / "term", tmp_path / "intr"
    jobs = {term: _start(term, "checkpoint.on_signal=true"), intr: _start(intr)}
    try:
        for run_dir, job in jobs.items():
            _logged(run_dir, job)
        jobs[term].send_signal(signal.SIGTERM)  # to torchrun, as a cluster does
        os.killpg(jobs[intr].pid, signal.SIGINT)  # to every process of the job, as Ctrl-C does
        codes = {run_dir: job.wait(timeout=120) for run_dir, job in jobs.items()}
    finally:
        for job in jobs.values():
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    outputs = {run_dir: Path(f"{run_dir}.log").read_text() for run_dir in jobs}
    for run_dir, name in ((term, "SIGTERM"), (intr, "SIGINT")):
        out = outputs[run_dir]
        assert codes[run_dir] == 128 + signal.Signals[name], out[-3000:]
        assert "Traceback" not in out and "Connection closed" not in out and "SignalException" not in out, out
        lines = [line for line in out.splitlines() if line.startswith(("stopped:", "error:"))]
        assert len(lines) == 1 and lines[0].startswith(f"stopped: by {name} at step "), out[-3000:]
        step = int(lines[0].split(" at step ")[1].split()[0])
        assert step % 5 == 0, lines[0]  # at a log step
        logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert max(logged) == step
        assert f"hydra.run.dir={run_dir} trainer.resume=auto" in lines[0]
    # Two jobs of one config side by side on one machine do not disturb each other: the same losses.
    records = [[json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()] for d in jobs]
    losses = [{r["step"]: r["loss"] for r in job if "loss" in r} for job in records]
    common = sorted(set(losses[0]) & set(losses[1]))
    assert common and all(abs(losses[0][s] - losses[1][s]) <= 1e-5 * abs(losses[0][s]) for s in common), losses
    saved = term / "checkpoints" / f"step_{int(outputs[term].split(' at step ')[1].split()[0]):08d}"
    assert f"last checkpoint: {saved};" in outputs[term]
    assert "last checkpoint: none (checkpoint.on_signal=true saves one at a stop)" in outputs[intr]

    step = int(saved.name.removeprefix("step_"))
    # The continuation, in one process (the test's).
    code, out, err = train_in_process(
        capfd, *RUN, f"hydra.run.dir={term}", "trainer.resume=auto", f"trainer.max_steps={step + 5}", cwd=REPO
    )
    assert code == 0, err[-3000:]
    assert f"resumed from {saved} at step {step}" in out + err


def _running(pid: int) -> bool:
    """Whether process `pid` still runs (an exited one may stay a zombie until someone reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc (Linux)")
def test_ranks_end_with_a_killed_launcher(tmp_path):
    """torchrun starts each rank in a session of its own: a SIGKILLed torchrun (the OOM killer, a
    scheduler's kill -9) must not leave its ranks training on: the kernel kills them with it."""
    run_dir = tmp_path / "run"
    job = _start(run_dir)
    try:
        _logged(run_dir, job)
        ranks = [int(p) for t in Path(f"/proc/{job.pid}/task").iterdir() for p in (t / "children").read_text().split()]
        assert len(ranks) == 2, ranks
        job.kill()  # torchrun alone
        job.wait()
        deadline = time.monotonic() + 120
        while any(_running(r) for r in ranks):
            assert time.monotonic() < deadline, Path(f"{run_dir}.log").read_text()[-3000:]
            time.sleep(0.1)
    finally:
        for pid in ranks if "ranks" in locals() else []:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def collective_failures_of_a_stalled_rank(timeout_s: float) -> str | None:
    """On each rank (of 2): rank 1 stalls past `timeout_s` before an all-reduce of a group with that
    timeout. Returns this rank's exception as dlrm.train reports it (`collective_failure`), or None if
    unrecognised. Both ranks meet again on the default group afterwards (the family's next job)."""
    default_group()
    group = torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    rank = World.from_env().rank
    if rank == 1:
        time.sleep(3 * timeout_s)
    try:
        torch.distributed.all_reduce(torch.ones(4), group=group)
        line = "no failure"
    except RuntimeError as e:
        failure = collective_failure(e, timeout_s)
        line = None if failure is None else f"{failure.prefix}: {failure}"
    torch.distributed.barrier(group=default_group())
    return line


@pytest.mark.slow
@runs(lines=PAIR.job(collective_failures_of_a_stalled_rank, 1.0))
def test_a_collective_timeout_is_one_line_naming_the_setting(lines):
    """Gloo's timeout and the lost peer it leaves behind, as dlrm.train prints them (exit 3, one line)."""
    first, second = lines
    assert first is not None and first.startswith("failed: a collective waited 1 s (trainer.collective_timeout_s)")
    assert second is not None and second.startswith("failed: "), second


@pytest.mark.slow
def test_two_sigterms_during_a_checkpoint_save_are_one_line(tmp_path):
    """Two SIGTERMs a few ms apart to every process of the job (torchrun and both ranks) while a
    checkpoint is being written: one `stopped:` line, exit 143, no traceback (nothing is raised inside
    DCP's collectives). A rank that sees two stops at once; two that land while it waits in a
    collective count once (Python runs the handler once), and it stops at the next log step."""
    run_dir = tmp_path / "run"
    job = _start(run_dir, "checkpoint.every_steps=1")
    root = run_dir / "checkpoints"
    try:
        deadline = time.monotonic() + 240
        while not (root.is_dir() and any(root.glob("step_*")) and any(root.glob(".step_*.partial"))):
            assert job.poll() is None and time.monotonic() < deadline, Path(f"{run_dir}.log").read_text()[-3000:]
            time.sleep(0.001)
        os.killpg(job.pid, signal.SIGTERM)
        time.sleep(0.005)
        os.killpg(job.pid, signal.SIGTERM)
        code = job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    out = Path(f"{run_dir}.log").read_text()
    assert code == 128 + signal.SIGTERM, out[-3000:]
    assert "Traceback" not in out and "TypeError" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith(("stopped:", "error:", "failed:"))]
    assert len(lines) == 1 and lines[0].startswith("stopped: by "), out[-3000:]
    assert "SIGTERM" in lines[0] and "trainer.resume=auto" in lines[0], lines[0]
