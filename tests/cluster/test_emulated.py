"""The emulated cluster (python -m dlrm.cluster): 2 nodes x 2 ranks, each node a network namespace behind
a 1 Gbit/s tbf-shaped uplink, trains like one process, also through a 1 s outage of one node's link; when
a node's agent is killed (2 nodes x 1 rank) it is started again, torchrun restarts the job and it resumes
from its last checkpoint, finishing like one process; a kill beyond --max-restarts fails the job in one
line; nothing is left behind after a run, a kill or a Ctrl-C; without root it refuses in one line. Needs
root and iproute2: the run tests skip elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT as ROOT
from tests.helpers.cluster import cannot_build_namespaces, eval_logloss, links, namespaces, processes_mentioning
from tests.helpers.equivalence import reference, tiny

pytestmark = pytest.mark.cluster
CLUSTER = [sys.executable, "-m", "dlrm.cluster"]
# 60 steps of model=tiny: about 5 s of training here with other jobs on the 2 cores. (8 steps took under
# 0.6 s on an idle CI machine and could end before a fault 0.2 s in had been applied.)
RUN = tiny("sharding=table_wise", "trainer.max_steps=60")
QUIET = ("trainer.tensorboard=false", "trainer.breakdown=false")  # no effect on the numbers, less work
OUTAGE = "1:0.2:1"  # node 1's link down 0.2 s into training (faults are polled every 0.1 s), for 1 s
RESUMABLE = ("checkpoint.every_steps=2", "trainer.resume=auto", "trainer.collective_timeout_s=20")
# Node 0's agent killed 1.5 s into KILL_RUN's training, on 2 nodes x 1 rank: about step 33 of 100 idle (45 ms a
# step), step 12 at 0.12 s a step under load: past the first complete checkpoint (written in the background),
# well before the end.
KILL, KILL_RUN = "0@1.5", tiny("sharding=table_wise", "trainer.max_steps=100")
TIMEOUT_S = 180
SETPRIV = shutil.which("setpriv")
needs_root = pytest.mark.skipif(bool(reason := cannot_build_namespaces()), reason=reason or "")


def leftovers(pid: int, run_dir: Path) -> list[str]:
    """What a dlrm.cluster process `pid` left: its namespaces, /etc/netns entries and processes (agents,
    workers and the rendezvous store all name the prefix or the run dir)."""
    prefix = f"dlrm-{pid}-"
    etc = [str(p) for p in Path("/etc/netns").glob(prefix + "*")]
    return namespaces(prefix) + etc + processes_mentioning(prefix, str(run_dir))


def start(args: list[str], run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLUSTER, *args, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """Its output once it has ended; on a timeout, Ctrl-C it (its teardown runs) and fail."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"dlrm.cluster did not end within {timeout} s\n{out[-2000:]}\n{err[-3000:]}")


@pytest.fixture(scope="module")
def emulated_run(tmp_path_factory):
    """One 2x2 emulated run of RUN with node 1's link down for 1 s from 0.2 s into training: (pid, exit
    status, stdout, stderr, run dir, host links before and after)."""
    run_dir = tmp_path_factory.mktemp("cluster") / "run"
    before = links()
    proc = start(["--nodes", "2", "--ranks-per-node", "2", "--link-down", OUTAGE, "--", *RUN, *QUIET], run_dir)
    out, err = finish(proc, TIMEOUT_S)
    return proc.pid, proc.returncode, out, err, run_dir, before, links()


@needs_root
@pytest.mark.slow
def test_two_nodes_over_shaped_links_equal_one_process_through_a_link_outage(emulated_run):
    """Every collective across the downed link waits and then completes: the job rides through, and its
    losses and final weights equal one process's."""
    _, code, out, err, run_dir, *_ = emulated_run
    assert code == 0, f"{out[-2000:]}\n{err[-3000:]}"
    assert "fabric up: 2 nodes" in err and "1 Gbit/s per uplink" in err, err[-3000:]
    assert "fault: node 1's link down at 0.2 s of training for 1 s: the job rode through it" in err, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["topology"] == "emu_2x2"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["time"] for r in records]  # the start event, then one record per step
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) > 0.9, "the outage must stall a step"
    ref_losses, ref_weights = reference(RUN)
    assert ref_losses[-1] < ref_losses[0], "the reference must learn, or the test proves little"
    losses = [r["loss"] for r in records if "loss" in r]  # every step: the mean over the 4 ranks' slices
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    # The final weights, through the eval the run made with them on the same eval batches.
    assert summary["eval_logloss"] == pytest.approx(eval_logloss(RUN, ref_weights), rel=1e-5, abs=1e-6)


@needs_root
@pytest.mark.slow
def test_nothing_left_after_a_run(emulated_run):
    pid, _, _, err, run_dir, before, after = emulated_run
    assert "fabric removed" in err, err[-3000:]
    assert leftovers(pid, run_dir) == []
    assert after == before, "host interfaces changed"


@needs_root
@pytest.mark.slow
def test_nothing_left_after_ctrl_c(tmp_path):
    """SIGINT once every rank has started (the agents and their 4 workers are inside the namespaces)."""
    run_dir = tmp_path / "run"
    proc = start(["--nodes", "2", "--ranks-per-node", "2", "--", "model=tiny", "trainer.max_steps=100000"], run_dir)
    prefix, deadline, inside = f"dlrm-{proc.pid}-", time.monotonic() + 60, 0
    ip = shutil.which("ip") or "/usr/sbin/ip"
    while inside < 6 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        pids = [  # the nodes' (the switch's holds the rendezvous store)
            subprocess.run([ip, "netns", "pids", ns], capture_output=True, text=True).stdout
            for ns in namespaces(prefix)
            if not ns.endswith("-sw")
        ]
        inside = sum(len(p.split()) for p in pids)
    assert inside >= 6, f"the agents and workers did not start: {inside} processes in {namespaces(prefix)}"
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc, 60)
    assert proc.returncode == 128 + signal.SIGINT, f"{out[-2000:]}\n{err[-3000:]}"
    assert "SIGINT: stopping the agents" in err and "fabric removed" in err, err[-3000:]
    assert leftovers(proc.pid, run_dir) == []


def losses_by_step(run_dir: Path) -> list[float]:
    """The loss of every step in metrics.jsonl, a restarted attempt's where both attempts made the step."""
    losses: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            losses[record["step"]] = record["loss"]
    return [losses[s] for s in sorted(losses)]


@needs_root
@pytest.mark.slow
def test_a_killed_agent_is_started_again_and_the_job_resumes_in_place(tmp_path):
    """Node 0's agent and worker (rank 0, the host of the ranks' store) SIGKILLed mid-run: the cluster
    starts the node's agent again, node 1's agent restarts the job (--max-restarts=1, one per kill), the
    rendezvous re-forms at the store in the switch namespace, and the job resumes from its last
    checkpoint: one command, exit 0, the losses and final weights equal one process's, nothing left.
    (Node 1's kill is the same path with the roles swapped.) One rank per node: the agent's restart does
    not depend on how many workers it holds, and the run starts half the processes."""
    run_dir, before = tmp_path / "run", links()
    args = ["--nodes", "2", "--ranks-per-node", "1", "--kill-agent", KILL, "--", *KILL_RUN, *QUIET, *RESUMABLE]
    proc = start(args, run_dir)
    out, err = finish(proc, TIMEOUT_S)
    assert proc.returncode == 0, f"{out[-2000:]}\n{err[-3000:]}"
    assert "node 0's agent and workers killed" in err and "its agent started again (restart 1 of" in err, err[-3000:]
    fault = f"fault: node 0's agent killed at {KILL[2:]} s of training: the job restarted with the node's new agent"
    fault += " and finished"
    assert fault in err and "Traceback" not in err, err[-3000:]
    assert "resumed from" in out + err, f"the job must resume from a checkpoint\n{out[-2000:]}\n{err[-2000:]}"
    assert leftovers(proc.pid, run_dir) == [] and links() == before
    ref_losses, ref_weights = reference(KILL_RUN)
    assert losses_by_step(run_dir) == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 100 and summary["world_size"] == 2
    assert summary["eval_logloss"] == pytest.approx(eval_logloss(KILL_RUN, ref_weights), rel=1e-5, abs=1e-6)


@needs_root
@pytest.mark.slow
@pytest.mark.long  # ~20 s; the one-line failure is test_device's, the schedule test_kills_start_the_node_again's
def test_a_kill_beyond_max_restarts_fails_the_job_in_one_line(tmp_path):
    """--max-restarts 0: node 1 stays down, node 0's ranks lose their connections and the job ends with
    `failed:` lines and one fault line saying how to continue, exit 3, no traceback, nothing left."""
    run_dir = tmp_path / "run"
    args = ["--nodes", "2", "--ranks-per-node", "2", "--kill-agent", "1@1", "--max-restarts", "0", "--"]
    proc = start([*args, *RUN, *QUIET, *RESUMABLE], run_dir)
    out, err = finish(proc, TIMEOUT_S)
    assert proc.returncode == 3, f"{out[-2000:]}\n{err[-3000:]}"
    assert "not started again: no restart left for kill 1 (--max-restarts=0)" in err, err[-3000:]
    fault = "fault: node 1's agent killed at 1 s of training: the job failed (exit status 3), ending at"
    assert fault in err and "continues it from its last checkpoint" in err, err[-3000:]
    assert "failed: lost the connection to another rank" in err and "Traceback" not in err, err[-3000:]
    assert leftovers(proc.pid, run_dir) == []


def test_refuses_without_root():
    """As an unprivileged user (nobody, when the test runs as root): one line, exit 2, nothing created."""
    prefix = []
    if os.geteuid() == 0:
        if SETPRIV is None:
            pytest.skip("setpriv (util-linux) is not installed, so root cannot run the command as another user")
        prefix = [SETPRIV, "--reuid=65534", "--regid=65534", "--clear-groups"]
        probe = subprocess.run(
            [*prefix, sys.executable, "-c", "import dlrm.cluster.emulator"], cwd=ROOT, capture_output=True
        )
        if probe.returncode != 0:  # e.g. a checkout under `mktemp -d`, whose directory is private (0700)
            why = (probe.stderr.decode().strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
            pytest.skip(f"user nobody cannot import this checkout: {why}")
    line = refusal(["--nodes", "2", "--ranks-per-node", "2", "--", "model=tiny"], prefix)
    assert "root" in line and "CAP_NET_ADMIN" in line and "run it as root" in line


@pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None, reason="needs root and setpriv (util-linux)")
def test_refuses_root_without_the_capabilities():
    """Root without CAP_NET_ADMIN and CAP_SYS_ADMIN (a container started without them): one line that says
    which capabilities to add."""
    line = refusal(["--nodes", "2", "--ranks-per-node", "2"], [str(SETPRIV), "--bounding-set=-net_admin,-sys_admin"])
    assert "(uid 0) lacks CAP_NET_ADMIN and CAP_SYS_ADMIN" in line and "--cap-add NET_ADMIN" in line


@pytest.mark.parametrize(
    "args, says",
    [
        (["--nodes", "0"], "--nodes=0"),
        (["--gbit", "0"], "--gbit=0.0"),
        (["--gbit", "1e6"], "from 0.001 to 400 Gbit/s"),  # more than tc's tbf sets
        (["--gbit", "nan"], "--gbit=nan"),
        (["--link-down", "1:soon"], "NODE:AT_S:FOR_S"),
        (["--kill-agent", "1:5"], "NODE@AT_S"),
        (["--max-restarts", "-1"], "--max-restarts=-1"),
        (["--nodes", "254"], "from 1 to 253"),
    ],
)
def test_bad_arguments_are_one_line(args, says):
    assert says in refusal(args)


def refusal(args: list[str], prefix: list[str] | None = None) -> str:
    """The one line `python -m dlrm.cluster ARGS` refuses with (exit 2), before any namespace exists;
    run under `prefix` (a command that takes its rights away) if given."""
    done = subprocess.run([*(prefix or []), *CLUSTER, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert "fabric up" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    return done.stderr


@needs_root
def test_a_shape_the_topology_does_not_have_is_one_line():
    """Checked against the composed topology before any namespace exists."""
    assert "topology 'emu_2x2' has 2 node(s)" in refusal(
        ["--nodes", "4", "--ranks-per-node", "1", "--", "topology=emu_2x2"]
    )


@needs_root
def test_a_kill_of_a_node_that_does_not_exist_is_one_line():
    """Refused before any namespace exists."""
    assert "the nodes are 0..1" in refusal(
        ["--nodes", "2", "--ranks-per-node", "2", "--kill-agent", "2@1", "--", "model=tiny"]
    )


def test_module_option_runs_another_worker_module_and_refuses_in_one_line():
    """`--module M` runs `torchrun -m M ARGS` in every node (its arguments are not trainer overrides, so the
    sizes and the rate must be given); a bad name or a missing size is a UsageError (one line, exit 2)."""
    from dlrm.cluster.emulator import Fabric, Job, agent_command, agent_env, parse_args
    from dlrm.common.errors import UsageError

    sized = ["--nodes", "2", "--ranks-per-node", "2", "--gbit", "1"]
    args, faults = parse_args([*sized, "--module", "dlrm.comms.measure", "--", "--scopes", "world,inter"])
    assert args.module == "dlrm.comms.measure" and args.overrides == ["--scopes", "world,inter"] and faults == []
    assert parse_args(["--", "model=tiny"])[0].module == "dlrm.train"
    job = Job(2, 2, 1.0, args.overrides, "/tmp", args.module, max_restarts=args.max_restarts)
    command = agent_command(job, Fabric("dlrm-0", 2, 1.0), 1)
    assert command[-4:] == ["-m", "dlrm.comms.measure", "--scopes", "world,inter"]
    # Every agent restarts once per kill by default, at the store in the switch namespace, and its ranks
    # host their own store (a node's agent started again could not join otherwise).
    assert "--max-restarts=0" in command and "--rdzv_endpoint=198.18.0.254:29500" in command
    assert parse_args(["--kill-agent", "1@1", "--kill-agent", "1@9", "--", "model=tiny"])[0].max_restarts == 2
    assert agent_env()["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    for argv, says in (
        ([*sized, "--module", "dlrm comms"], "give a Python module name"),
        (["--nodes", "2", "--ranks-per-node", "2", "--module", "dlrm.comms.measure"], "needs --gbit"),
        ([*sized, "--module", "dlrm.comms.measure", "--link-down", "1:1:1"], "not with --module"),
        ([*sized, "--module", "dlrm.comms.measure", "--kill-agent", "1@1"], "not with --module"),
    ):
        with pytest.raises(UsageError, match=says):
            parse_args(argv)


def test_kills_start_the_node_again_until_the_restarts_are_spent(tmp_path):
    """FaultSchedule (no namespaces): each kill within --max-restarts starts the node's agent again; a
    later one leaves the node down (the job then fails, and its line says how to continue); a node with
    nothing left to kill is not started again."""
    from dlrm.cluster.faults import AgentKill, FaultSchedule

    class Nodes:  # the Fabric's kill_node: how many processes each node has
        alive = {0: 3, 1: 3}

        def kill_node(self, i: int) -> int:
            killed, self.alive[i] = self.alive[i], 0
            return killed

    nodes, restarted = Nodes(), []

    def restart(i: int) -> None:
        restarted.append(i)
        nodes.alive[i] = 3

    kills = [AgentKill(1, 0.0), AgentKill(0, 0.0), AgentKill(1, 0.0), AgentKill(1, 0.0)]
    schedule = FaultSchedule(kills, nodes, str(tmp_path), restart, max_restarts=2)  # type: ignore[arg-type]
    assert schedule.tick() == []  # training has not started
    (tmp_path / "metrics.jsonl").write_text('{"event": "start"}\n')
    said = schedule.tick()
    assert restarted == [1, 0] and list(schedule.killed) == [1]
    assert "its agent started again (restart 1 of --max-restarts=2)" in said[0] and "(restart 2 of" in said[1]
    assert said[2].endswith("not started again: no restart left for kill 3 (--max-restarts=2)")
    assert said[3] == "node 1's agent had already ended: nothing killed"
    lines = schedule.report(3)
    assert "the job failed (exit status 3)" in lines[2] and "trainer.resume=auto continues it" in lines[2]
    assert "the job restarted with the node's new agent and finished" in schedule.report(0)[0]
