"""An emulated cluster on one machine: N nodes as network namespaces, one torchrun agent per node.

    python -m dlrm.cluster --nodes 2 --ranks-per-node 2 [--gbit G] [--link-down NODE:AT_S:FOR_S]
        [--kill-agent NODE@AT_S] [--max-restarts N] -- [overrides]
    python -m dlrm.cluster --nodes 2 --ranks-per-node 2 --gbit G --module dlrm.comms.measure -- [its arguments]

Node i runs a torchrun agent (`--nnodes=N --nproc_per_node=R`) of the trainer, or of `--module`, with
OVERRIDES in its namespace (topology=emu_NxR unless the overrides name one), its sockets on the node's
shaped uplink, the c10d store in the switch's namespace so it outlives every agent. The uplink is shaped to R x the
topology's per-rank inter_node.bandwidth_GBps; `--gbit G` sets the uplink instead and passes the
matching per-rank bandwidth to the trainer. Everything is removed on exit, Ctrl-C, SIGTERM or failure.
Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from argparse import Namespace
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

from dlrm.cluster.fabric import IFNAME, MAX_NODES, STORE_ADDRESS, Fabric, FabricError, check_rate, missing_right
from dlrm.cluster.faults import FAILED_GRACE_S, SIGKILL_STATUS, AgentKill, Fault, FaultSchedule, LinkDown
from dlrm.common.errors import ArgumentParser, UsageError, UserError
from dlrm.config.topology import UPLINK_GBIT_ENV

__all__ = ["Fabric", "FabricError", "Job", "agent_command", "main", "parse_args", "plan_job"]

RDZV_PORT = 29500  # the rendezvous store's, at STORE_ADDRESS (the switch namespace is new: the port is free)
# Rendezvous heartbeats every second, a node dead after 5 missed (torch's default: 5 s x 3): a killed
# node's agent, started again, joins the restarted job that much sooner.
KEEP_ALIVE = "keep_alive_interval=1,keep_alive_max_attempt=5"
STOP_GRACE_S = 20.0  # after a signal is forwarded, how long the agents get to stop cleanly


def say(message: str) -> None:
    print(f"cluster: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Job:
    """What to start: the sizes, the uplink rate and the trainer's overrides (topology and run dir included)."""

    nodes: int
    ranks_per_node: int
    uplink_gbit: float
    overrides: list[str]
    run_dir: str
    module: str = "dlrm.train"  # what each agent runs (`--module`): its arguments are `overrides`
    collective_timeout_s: float = 1800.0  # the trainer's trainer.collective_timeout_s
    max_restarts: int = 0  # torchrun --max-restarts of every agent


def plan_job(nodes: int | None, ranks: int | None, gbit: float | None, overrides: list[str]) -> Job:
    """Compose the trainer's config as the trainer will and check nodes x ranks against its topology.

    Args:
        nodes, ranks: --nodes and --ranks-per-node (None: the topology's).
        gbit: --gbit, the uplink rate (None: from the topology).
        overrides: the trainer's Hydra overrides.

    Returns:
        The `Job` to start.

    Raises:
        UsageError: the sizes or rate disagree with the topology.
    """
    from dlrm.config import validate, validate_world
    from dlrm.config.compose import CONF_DIR, compose, override_value

    name = override_value(overrides, "topology")
    if name is None:  # the emulated topology of this shape
        n, r = nodes or 2, ranks or 2
        name = f"emu_{n}x{r}"
        if not (CONF_DIR / "topology" / f"{name}.yaml").is_file():
            raise UsageError(
                f"there is no topology {name} (conf/topology/{name}.yaml) for {n} node(s) x {r} rank(s); pass one "
                f"and resize it, e.g. topology=emu_2x2 topology.nodes={n} topology.ranks_per_node={r}"
            )
        overrides = [f"topology={name}", *overrides]
    cfg = compose(overrides)
    validate(cfg)
    tp = cfg.topology
    nodes = nodes or tp.nodes
    ranks = ranks or tp.ranks_per_node or 1
    if tp.nodes != nodes:
        raise UsageError(
            f"--nodes={nodes} but topology '{tp.name}' has {tp.nodes} node(s); "
            f"pass --nodes {tp.nodes} or topology.nodes={nodes}"
        )
    if tp.ranks_per_node is not None and tp.ranks_per_node != ranks:
        raise UsageError(
            f"--ranks-per-node={ranks} but topology '{tp.name}' has {tp.ranks_per_node} ranks per node; "
            f"pass --ranks-per-node {tp.ranks_per_node} or topology.ranks_per_node={ranks}"
        )
    validate_world(cfg, nodes * ranks, ranks)  # the trainer's own check (e.g. the batch splits evenly)
    if gbit is None:
        gbit = tp.inter_node.bandwidth_GBps * 8 * ranks
        check_rate(gbit, f"topology.inter_node.bandwidth_GBps x 8 bit x {ranks} ranks per node")
    else:  # the trainer's topology describes the fabric it runs on
        overrides = [*overrides, *tp.inter_node.rate_overrides("topology.inter_node", gbit / 8 / ranks)]
    run_dir = override_value(overrides, "hydra.run.dir")
    if run_dir is None:
        name = override_value(overrides, "run.name")
        run_dir = f"outputs/{name}" if name else time.strftime("outputs/cluster-%Y-%m-%d_%H-%M-%S")
        overrides = [*overrides, f"hydra.run.dir={run_dir}"]
    return Job(nodes, ranks, gbit, overrides, run_dir, collective_timeout_s=cfg.trainer.collective_timeout_s)


def agent_command(job: Job, fabric: Fabric, i: int) -> list[str]:
    """The command of node i's agent: `ip netns exec NODE torchrun ... -m MODULE OVERRIDES`."""
    torchrun = [os.environ["TORCHRUN"]] if os.environ.get("TORCHRUN") else [sys.executable, "-m", "dlrm.torchrun"]
    return [
        fabric.ip, "netns", "exec", fabric.node(i), *torchrun,
        f"--nnodes={job.nodes}", f"--nproc_per_node={job.ranks_per_node}",  # c10d numbers the nodes itself
        "--rdzv_backend=c10d", f"--rdzv_endpoint={STORE_ADDRESS}:{RDZV_PORT}", f"--rdzv_id={fabric.prefix}",
        f"--rdzv_conf=is_host=false,{KEEP_ALIVE}", f"--local_addr={fabric.address(i)}",  # Fabric.start_store hosts it
        f"--max-restarts={job.max_restarts}", "-m", job.module, *job.overrides,
    ]  # fmt: skip


def agent_env(uplink_gbit: float | None = None) -> dict[str, str]:
    """The agents' environment: this one less another launcher's variables, plus the node's interface,
    the ranks hosting their own store, and the uplink's shaped rate (`uplink_gbit`, None: not shaped).
    """
    drop = ("SLURM_", "TORCHELASTIC_", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(GLOO_SOCKET_IFNAME=IFNAME, NCCL_SOCKET_IFNAME=IFNAME, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    if uplink_gbit is not None:
        env[UPLINK_GBIT_ENV] = repr(uplink_gbit)
    return env


class StopRequest:
    """The first stop signal (Ctrl-C, SIGTERM, SIGHUP), recorded by its handler: the supervisor acts on
    it between polls, so no exception can cut the teardown short."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.signum: int | None = None
        for signum in self.SIGNALS:
            signal.signal(signum, self._record)

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = self.signum or signum


def supervise(agents: list[subprocess.Popen], faults: FaultSchedule, stop: StopRequest, kill_grace_s: float) -> int:
    """Wait for the agents, applying the faults on time.

    When one agent fails the others get FAILED_GRACE_S to end; once a fault has killed an agent and left its
    node down, the others get kill_grace_s from the kill. A node whose agent the faults started again (its
    entry in `agents` replaced) counts like any other.

    Returns:
        The job's exit status: the first failure's, 128 + the signal on a stop request (forwarded to the
        agents), else 0.
    """
    failed: tuple[float, int] | None = None
    while stop.signum is None:
        for line in faults.tick():
            say(line)
        now = time.monotonic()
        codes = [a.poll() for i, a in enumerate(agents) if i not in faults.killed]  # a killed one's is ours
        if failed is None and any(codes):
            failed = (now, next(c for c in codes if c))
        running = codes.count(None)
        late = failed is not None and now - failed[0] > FAILED_GRACE_S
        hung = bool(faults.killed) and now - min(faults.killed.values()) > kill_grace_s
        if not running or late or hung:
            if failed:
                status = failed[1]
            elif running:  # only after a kill: the survivors hang
                status = 1
            else:  # every agent that was not killed finished; none left means all were killed
                status = 0 if codes else SIGKILL_STATUS
            if running and late:
                say(f"an agent failed (exit status {status}); the others had {FAILED_GRACE_S:g} s to end")
            elif running:
                say(
                    f"{running} agent(s) still ran {kill_grace_s:g} s after the kill "
                    f"(trainer.collective_timeout_s + {FAILED_GRACE_S:g} s): stopping them"
                )
            for line in faults.report(status):
                say(line)
            return status
        time.sleep(0.1)
    say(f"{signal.Signals(stop.signum).name}: stopping the agents (up to {STOP_GRACE_S:g} s)")
    stop_agents(agents, stop.signum, STOP_GRACE_S)
    return 128 + stop.signum


def stop_agents(agents: list[subprocess.Popen], signum: int, grace_s: float) -> None:
    """Send signum to every running agent (torchrun forwards it to its ranks); wait up to grace_s."""
    for a in agents:
        if a.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(a.pid, signum)  # each agent leads its own session
    deadline = time.monotonic() + grace_s
    while any(a.poll() is None for a in agents) and time.monotonic() < deadline:
        time.sleep(0.1)


def run_cluster(job: Job, faults: list[Fault], stop: StopRequest) -> int:
    """Bring up the fabric, run one agent per node, tear everything down; the job's exit status."""
    fabric = Fabric(f"dlrm-{os.getpid()}", job.nodes, job.uplink_gbit)
    agents: list[subprocess.Popen] = []  # node i's agent is agents[i]
    store: list[subprocess.Popen] = []  # the rendezvous store's process, outliving the agents
    try:
        fabric.open()
        store.append(fabric.start_store(RDZV_PORT))
        say(
            f"fabric up: {job.nodes} nodes ({fabric.node(0)}..{job.nodes - 1}, {fabric.address(0)}.."
            f"{fabric.address(job.nodes - 1)}), {job.uplink_gbit:g} Gbit/s per uplink (tc tbf, each direction)"
        )
        env = agent_env(job.uplink_gbit)

        def start(i: int) -> subprocess.Popen:
            return subprocess.Popen(agent_command(job, fabric, i), env=env, start_new_session=True)

        def restart(i: int) -> None:  # the killed agent is gone (Fabric.kill_node): reap it, start a new one
            agents[i].wait(timeout=5.0)
            agents[i] = start(i)

        agents.extend(start(i) for i in range(job.nodes))
        say(
            f"agents started: {job.nodes} x torchrun --nproc_per_node={job.ranks_per_node} -m {job.module} "
            f"--max-restarts={job.max_restarts}, rendezvous {STORE_ADDRESS}:{RDZV_PORT}, run dir {job.run_dir}"
        )
        kill_grace_s = job.collective_timeout_s + FAILED_GRACE_S  # a survivor's collective fails by then
        schedule = FaultSchedule(faults, fabric, job.run_dir, restart, job.max_restarts)
        return supervise(agents, schedule, stop, kill_grace_s)
    finally:
        stop_agents(agents, signal.SIGTERM, 5.0)
        sent = ", ".join(f"n{i} {mb:.2f}" for i, mb in enumerate(fabric.sent_mb()))
        fabric.close()  # ends the store too
        for a in agents + store:
            a.wait()  # reaped: gone from the process table
        say(f"fabric removed: {job.nodes + 1} namespaces, their links and processes (uplinks had sent MB: {sent})")


def parse_args(argv: Sequence[str] | None) -> tuple[Namespace, list[Fault]]:
    """The command line, its values checked (a UsageError names the bad one)."""
    parser = ArgumentParser(prog="python -m dlrm.cluster", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--nodes", type=int, help="nodes (namespaces); default: the topology's")
    parser.add_argument("--ranks-per-node", type=int, help="torchrun --nproc_per_node; default: the topology's")
    parser.add_argument("--gbit", type=float, help="uplink rate, Gbit/s; default: topology.inter_node x ranks")
    parser.add_argument(
        "--link-down",
        action="append",
        default=[],
        metavar="NODE:AT_S:FOR_S",
        help="node NODE's link down AT_S s after training starts, for FOR_S s (repeatable)",
    )
    parser.add_argument(
        "--kill-agent",
        action="append",
        default=[],
        metavar="NODE@AT_S",
        help="SIGKILL node NODE's torchrun agent and its workers AT_S s after training starts (repeatable), "
        "then start the node's agent again: torchrun restarts the job, which resumes from its last checkpoint "
        "with trainer.resume=auto and checkpoint.every_steps",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help="torchrun --max-restarts of every agent (default: the number of --kill-agent); a kill beyond N "
        "leaves its node down and fails the job",
    )
    parser.add_argument(
        "--module",
        default="dlrm.train",
        help="the torchrun worker module each agent runs (default dlrm.train); another one (e.g. dlrm.comms.measure) "
        "gets the arguments after -- as they are, and needs --nodes, --ranks-per-node and --gbit",
    )
    parser.add_argument("overrides", nargs="*", help="dlrm.train overrides, or the --module's arguments (after --)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", args.module):
        raise UsageError(f"--module={args.module}: give a Python module name (e.g. dlrm.comms.measure)")
    if args.module != "dlrm.train":
        _check_other_module(args)
    for flag, value, most in (("--nodes", args.nodes, MAX_NODES), ("--ranks-per-node", args.ranks_per_node, 254)):
        if value is not None and not 1 <= value <= most:
            raise UsageError(f"{flag}={value}: give an integer from 1 to {most}")
    if args.max_restarts is None:
        args.max_restarts = len(args.kill_agent)
    elif not 0 <= args.max_restarts <= 100:
        raise UsageError(f"--max-restarts={args.max_restarts}: give an integer from 0 to 100")
    if args.gbit is not None:
        check_rate(args.gbit, "--gbit")
    faults: list[Fault] = [LinkDown.parse(text) for text in args.link_down]
    return args, faults + [AgentKill.parse(text) for text in args.kill_agent]


def _check_other_module(args: Namespace) -> None:
    """Check the options of a `--module` other than the trainer, which reads no trainer config.

    Raises:
        UsageError: a size (`--nodes`, `--ranks-per-node`, `--gbit`) is missing, or a fault is given
            (faults are timed from the trainer's metrics).
    """
    lacking = [
        f
        for f, v in (("--nodes", args.nodes), ("--ranks-per-node", args.ranks_per_node), ("--gbit", args.gbit))
        if v is None
    ]
    if lacking:
        raise UsageError(
            f"--module {args.module} needs {', '.join(lacking)}: no trainer config is read to size the job "
            f"(e.g. --nodes 2 --ranks-per-node 2 --gbit 1 --module {args.module} -- ARGS)"
        )
    for flag, given in (("--link-down", args.link_down), ("--kill-agent", args.kill_agent)):
        if given:
            raise UsageError(f"{flag} times faults from dlrm.train's metrics; not with --module {args.module}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command; its exit status (2 and one `error:` line for bad input or missing rights)."""
    stop = StopRequest()  # from here on a signal stops the job in order
    try:
        args, faults = parse_args(argv)
        reason = missing_right()  # before anything is created
        if reason:
            raise UsageError(reason)
        if args.module == "dlrm.train":
            job = plan_job(args.nodes, args.ranks_per_node, args.gbit, list(args.overrides))
        else:  # its own arguments: nothing to compose; the sizes were checked by parse_args
            job = Job(args.nodes, args.ranks_per_node, args.gbit, list(args.overrides), os.getcwd(), args.module)
        job = dataclasses.replace(job, max_restarts=args.max_restarts)
        for f in faults:
            if f.node >= job.nodes:
                raise UsageError(f"{f}: the nodes are 0..{job.nodes - 1}")
        return 128 + stop.signum if stop.signum else run_cluster(job, faults, stop)
    except UserError as e:
        print(f"{e.prefix}: {e}", file=sys.stderr)
        return e.exit_code
    except FabricError as e:
        print(f"error: the emulated fabric failed: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
