"""An emulated cluster on one machine: N nodes as network namespaces, one torchrun agent per node.

    python -m dlrm.cluster --nodes 2 --ranks-per-node 2 [--gbit G] [--link-down NODE:AT_S:FOR_S] -- [overrides]
    python -m dlrm.cluster --nodes 2 --ranks-per-node 2 --gbit G --module dlrm.comms.bench -- [its arguments]

Each node is a namespace `dlrm-<pid>-n<i>` with `lo` and one interface `eth0` at 198.18.0.<i+1>/24 (the
benchmarking range), a veth into a bridge that lives in its own namespace `dlrm-<pid>-sw`: nothing is
added to the host's network. Both directions of every uplink are shaped by `tc tbf` to the inter-node
bandwidth; ranks of one node reach each other through the node's loopback (a packet to a local address
never leaves `lo`). Node i runs `python -m dlrm.torchrun --nnodes=N --nproc_per_node=R -m dlrm.train
OVERRIDES` in its namespace (topology=emu_NxR unless OVERRIDES name one), with a c10d rendezvous at node 0 and
GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME=eth0. Everything is removed on exit, on Ctrl-C / SIGTERM and on
failure. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2.

Bandwidth: topology `inter_node.bandwidth_GBps` is per rank (dlrm.config.LinkConfig), and the R ranks of a
node share its uplink, so the uplink is shaped to R x that rate; `--gbit G` sets the uplink instead and
passes `topology.inter_node.bandwidth_GBps=G/8/R` to the trainer, so planner, cost model and fabric agree.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from argparse import Namespace
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from dlrm.errors import ArgumentParser, UsageError, UserError

SUBNET = "198.18.0"  # /24 of 198.18.0.0/15 (RFC 2544 benchmarking), node i at .i+1
ETC_NETNS = "/etc/netns"  # per-namespace /etc files of `ip netns exec`
IFNAME = "eth0"  # each node's interface, inside its namespace
RDZV_PORT = 29500  # node 0's namespace is new: the port is free
FAILED_GRACE_S = 10.0  # after one agent fails, how long the others get to end on their own
STOP_GRACE_S = 20.0  # after a signal is forwarded, how long the agents get to stop cleanly
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21  # bits of /proc/self/status CapEff


def say(message: str) -> None:
    print(f"cluster: {message}", file=sys.stderr, flush=True)


class FabricError(RuntimeError):
    """An `ip` or `tc` command failed: the message names it and its output."""


@dataclass(frozen=True)
class LinkDown:
    """Node `node`'s uplink is set down `at_s` seconds after training starts, for `for_s` seconds."""

    node: int
    at_s: float
    for_s: float

    @classmethod
    def parse(cls, text: str) -> LinkDown:
        parts = text.split(":")
        try:
            node, at_s, for_s = int(parts[0]), float(parts[1]), float(parts[2])
            if len(parts) != 3 or node < 0 or not (0 <= at_s < math.inf and 0 < for_s < math.inf):
                raise ValueError(text)
        except (ValueError, IndexError):
            raise UsageError(
                f"--link-down {text}: give NODE:AT_S:FOR_S, a node index and two seconds (e.g. 1:5:3: node 1's "
                "link down 5 s after training starts, for 3 s)"
            ) from None
        return cls(node, at_s, for_s)

    def outcome(self, trained_s: float | None, status: int) -> str:
        """One line: what the fault did, given how long after the start of training the job ended (None:
        training never started) and its exit status."""
        what = f"fault: node {self.node}'s link down at {self.at_s:g} s of training for {self.for_s:g} s"
        if trained_s is None or trained_s < self.at_s:
            when = "training never started" if trained_s is None else f"the job ended first, at {trained_s:.1f} s"
            return f"{what}: not applied, {when} (exit status {status})"
        result = "rode through it" if status == 0 else f"failed (exit status {status})"
        return f"{what}: the job {result}, ending at {trained_s:.1f} s of training"


class FaultSchedule:
    """The link faults of one run, timed from the start of training: when the run's metrics.jsonl gets
    a record (the trainer writes its start event first), so a slow start-up does not shift them."""

    def __init__(self, faults: list[LinkDown], fabric: Fabric, run_dir: str) -> None:
        self.faults, self.fabric = faults, fabric
        self.metrics = Path(run_dir, "metrics.jsonl")
        self.size_before = self._size()  # a continued run's file has records already
        self.started: float | None = None  # time.monotonic() at the start of training
        downs, ups = [(f.at_s, f, False) for f in faults], [(f.at_s + f.for_s, f, True) for f in faults]
        self.events = sorted(downs + ups, key=_when)  # (seconds of training, fault, set up)

    def _size(self) -> int:
        try:
            return self.metrics.stat().st_size
        except OSError:
            return 0

    def tick(self) -> None:
        """Set the links whose time has come down or up."""
        if not self.faults:
            return
        now = time.monotonic()
        if self.started is None:
            if self._size() <= self.size_before:
                return
            self.started = now
        while self.events and self.started + self.events[0][0] <= now:
            _, fault, up = self.events.pop(0)
            self.fabric.set_link(fault.node, up)

    def report(self, status: int) -> None:
        trained_s = None if self.started is None else time.monotonic() - self.started
        for fault in self.faults:
            say(fault.outcome(trained_s, status))


def _when(event: tuple[float, LinkDown, bool]) -> float:
    return event[0]


def missing_right() -> str | None:
    """Why this process cannot build namespaces and links, or None when it can (nothing is created)."""
    caps = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
    lacking = [
        name
        for bit, name in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"), (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
        if not caps >> bit & 1
    ]
    if lacking:
        return (
            f"dlrm.cluster creates network namespaces and links, which needs root: this process (uid {os.geteuid()}) "
            f"lacks {' and '.join(lacking)}; run it as root (e.g. sudo .venv/bin/python -m dlrm.cluster ...)"
        )
    for tool in ("ip", "tc"):
        if tool_path(tool) is None:
            return f"'{tool}' is not installed (PATH, /usr/sbin, /sbin); install iproute2 (apt-get install iproute2)"
    return None


def tool_path(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


class Fabric:
    """The namespaces, veths, bridge and qdiscs of one emulated cluster; `close` removes them all."""

    def __init__(self, prefix: str, nodes: int, uplink_gbit: float) -> None:
        self.prefix, self.nodes, self.uplink_gbit = prefix, nodes, uplink_gbit
        self.switch = f"{prefix}-sw"
        self.made_etc_netns = False
        self.ip, self.tc = str(tool_path("ip")), str(tool_path("tc"))

    def node(self, i: int) -> str:
        return f"{self.prefix}-n{i}"

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def _run(self, *args: str) -> None:
        done = subprocess.run(args, capture_output=True, text=True)
        if done.returncode:
            raise FabricError(f"{' '.join(args)} failed (exit status {done.returncode}): {done.stderr.strip()}")

    def _netns(self, name: str) -> None:
        """A namespace with lo up, and an /etc/hosts naming every node (`ip netns exec` mounts
        /etc/netns/NAME/hosts over /etc/hosts), so c10d's reverse lookups of node addresses succeed."""
        hosts = Path(ETC_NETNS, name, "hosts")
        self.made_etc_netns = self.made_etc_netns or not os.path.isdir(ETC_NETNS)
        hosts.parent.mkdir(parents=True, exist_ok=True)
        names = "".join(f"{a}{self.address(i)} {self.node(i)}\n" for i in range(self.nodes) for a in ("", "::ffff:"))
        hosts.write_text(
            f"127.0.0.1 localhost\n::1 localhost\n{names}"
        )  # ::ffff: as the store's dual-stack socket sees them
        self._run(self.ip, "netns", "add", name)
        self._run(self.ip, "-n", name, "link", "set", "lo", "up")

    def _shape(self, namespace: str, dev: str) -> None:
        """tbf on dev's egress: rate = the uplink, a bucket of 2 ms of it (>= 64 KiB), 50 ms of queue."""
        rate = self.uplink_gbit * 1e9
        burst = max(64 * 1024, int(rate / 8 * 0.002))
        self._run(self.ip, "netns", "exec", namespace, self.tc, "qdisc", "add", "dev", dev, "root", "tbf",
                  "rate", f"{int(rate)}bit", "burst", str(burst), "latency", "50ms")  # fmt: skip

    def open(self) -> None:
        self._netns(self.switch)
        self._run(self.ip, "-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._run(self.ip, "-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.nodes):
            ns, port = self.node(i), f"n{i}"
            self._netns(ns)
            self._run(self.ip, "-n", self.switch, "link", "add", port, "type", "veth", "peer", IFNAME, "netns", ns)
            self._run(self.ip, "-n", self.switch, "link", "set", port, "master", "br0", "up")
            self._run(self.ip, "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", IFNAME)
            self._run(self.ip, "-n", ns, "link", "set", IFNAME, "up")
            self._shape(ns, IFNAME)  # what the node sends
            self._shape(self.switch, port)  # what it receives

    def set_link(self, i: int, up: bool) -> None:
        self._run(self.ip, "-n", self.node(i), "link", "set", IFNAME, "up" if up else "down")

    def namespaces(self) -> list[str]:
        """The cluster's namespaces that exist (listed, not remembered: an interrupted `ip netns add` counts)."""
        out = subprocess.run([self.ip, "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in out.splitlines() if line.startswith(self.prefix + "-")]

    def pids(self) -> list[int]:
        """The processes inside the cluster's namespaces."""
        found: list[int] = []
        for ns in self.namespaces():
            out = subprocess.run([self.ip, "netns", "pids", ns], capture_output=True, text=True).stdout
            found += [int(p) for p in out.split()]
        return found

    def sent_mb(self) -> list[float]:
        """MB (1e6 bytes) each node has sent through its uplink (its tbf's counter); 0 where gone."""
        sent = []
        for i in range(self.nodes):
            out = subprocess.run(
                [self.ip, "netns", "exec", self.node(i), self.tc, "-s", "qdisc", "show", "dev", IFNAME],
                capture_output=True,
                text=True,
            ).stdout
            found = re.search(r"Sent (\d+) bytes", out)
            sent.append(int(found[1]) / 1e6 if found else 0.0)
        return sent

    def close(self) -> None:
        """Kill whatever still runs inside, then delete the namespaces (their veths and bridge go with them)."""
        deadline = time.monotonic() + 10.0
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for ns in self.namespaces():
            subprocess.run([self.ip, "netns", "del", ns], capture_output=True)
        for etc in Path(ETC_NETNS).glob(f"{self.prefix}-*"):
            shutil.rmtree(etc, ignore_errors=True)
        if self.made_etc_netns:
            with contextlib.suppress(OSError):
                os.rmdir(ETC_NETNS)  # ours, if nobody has put files there since
        left = self.namespaces()
        if left or pids:
            raise FabricError(f"could not remove namespaces {left} or processes {pids}; remove them by hand")


@dataclass(frozen=True)
class Job:
    """What to start: the sizes, the uplink rate and the trainer's overrides (topology and run dir included)."""

    nodes: int
    ranks_per_node: int
    uplink_gbit: float
    overrides: list[str]
    run_dir: str
    module: str = "dlrm.train"  # what each agent runs (`--module`): its arguments are `overrides`


def plan_job(nodes: int | None, ranks: int | None, gbit: float | None, overrides: list[str]) -> Job:
    """Compose the trainer's config as dlrm.train will, and check nodes x ranks against its topology."""
    from dlrm.compose import CONF_DIR, compose, override_value
    from dlrm.config import validate, validate_world

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
    else:  # the trainer's topology describes the fabric it runs on
        overrides = [*overrides, f"topology.inter_node.bandwidth_GBps={gbit / 8 / ranks!r}"]
    run_dir = override_value(overrides, "hydra.run.dir")
    if run_dir is None:
        name = override_value(overrides, "run.name")
        run_dir = f"outputs/{name}" if name else time.strftime("outputs/cluster-%Y-%m-%d_%H-%M-%S")
        overrides = [*overrides, f"hydra.run.dir={run_dir}"]
    return Job(nodes, ranks, gbit, overrides, run_dir)


def agent_command(job: Job, fabric: Fabric, i: int) -> list[str]:
    """`ip netns exec NODE torchrun ... -m dlrm.train OVERRIDES` for node i."""
    torchrun = [os.environ["TORCHRUN"]] if os.environ.get("TORCHRUN") else [sys.executable, "-m", "dlrm.torchrun"]
    return [
        fabric.ip, "netns", "exec", fabric.node(i), *torchrun,
        f"--nnodes={job.nodes}", f"--nproc_per_node={job.ranks_per_node}",  # c10d numbers the nodes itself
        "--rdzv_backend=c10d", f"--rdzv_endpoint={fabric.address(0)}:{RDZV_PORT}", f"--rdzv_id={fabric.prefix}",
        f"--rdzv_conf=is_host={str(i == 0).lower()}", f"--local_addr={fabric.address(i)}",
        "-m", job.module, *job.overrides,
    ]  # fmt: skip


def agent_env() -> dict[str, str]:
    """This environment for the agents, less another launcher's variables, with the node's interface."""
    drop = ("SLURM_", "TORCHELASTIC_", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(GLOO_SOCKET_IFNAME=IFNAME, NCCL_SOCKET_IFNAME=IFNAME)
    env.setdefault("OMP_NUM_THREADS", "1")
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


def supervise(agents: list[subprocess.Popen], faults: FaultSchedule, stop: StopRequest) -> int:
    """Wait for the agents, applying the link faults on time; the job's exit status: the first failure's,
    128 + the signal on a stop request (forwarded to the agents), else 0.

    When one agent fails the others get FAILED_GRACE_S to end, then the caller's teardown ends them.
    """
    failed: tuple[float, int] | None = None
    while stop.signum is None:
        faults.tick()
        codes = [a.poll() for a in agents]
        if failed is None and any(codes):
            failed = (time.monotonic(), next(c for c in codes if c))
        if all(c is not None for c in codes) or (failed and time.monotonic() - failed[0] > FAILED_GRACE_S):
            status = failed[1] if failed else 0
            if not all(c is not None for c in codes):
                say(f"an agent failed (exit status {status}); the others had {FAILED_GRACE_S:g} s to end")
            faults.report(status)
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


def run_cluster(job: Job, faults: list[LinkDown], stop: StopRequest) -> int:
    """Bring up the fabric, run one agent per node, tear everything down; the job's exit status."""
    fabric = Fabric(f"dlrm-{os.getpid()}", job.nodes, job.uplink_gbit)
    agents: list[subprocess.Popen] = []
    try:
        fabric.open()
        say(
            f"fabric up: {job.nodes} nodes ({fabric.node(0)}..{job.nodes - 1}, {fabric.address(0)}.."
            f"{fabric.address(job.nodes - 1)}), {job.uplink_gbit:g} Gbit/s per uplink (tc tbf, each direction)"
        )
        env = agent_env()
        for i in range(job.nodes):
            agents.append(subprocess.Popen(agent_command(job, fabric, i), env=env, start_new_session=True))
        say(
            f"agents started: {job.nodes} x torchrun --nproc_per_node={job.ranks_per_node} -m {job.module}, rendezvous "
            f"{fabric.address(0)}:{RDZV_PORT}, run dir {job.run_dir}"
        )
        return supervise(agents, FaultSchedule(faults, fabric, job.run_dir), stop)
    finally:
        stop_agents(agents, signal.SIGTERM, 5.0)
        sent = ", ".join(f"n{i} {mb:.2f}" for i, mb in enumerate(fabric.sent_mb()))
        fabric.close()
        for a in agents:
            a.wait()  # reaped: gone from the process table
        say(f"fabric removed: {job.nodes + 1} namespaces, their links and processes (uplinks had sent MB: {sent})")


def parse_args(argv: Sequence[str] | None) -> tuple[Namespace, list[LinkDown]]:
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
        "--module",
        default="dlrm.train",
        help="the torchrun worker module each agent runs (default dlrm.train); another one (e.g. dlrm.comms.bench) "
        "gets the arguments after -- as they are, and needs --nodes, --ranks-per-node and --gbit",
    )
    parser.add_argument("overrides", nargs="*", help="dlrm.train overrides, or the --module's arguments (after --)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", args.module):
        raise UsageError(f"--module={args.module}: give a Python module name (e.g. dlrm.comms.bench)")
    if args.module != "dlrm.train":
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
        if args.link_down:
            raise UsageError(f"--link-down times faults from dlrm.train's metrics; not with --module {args.module}")
    for flag, value in (("--nodes", args.nodes), ("--ranks-per-node", args.ranks_per_node)):
        if value is not None and not 1 <= value <= 254:
            raise UsageError(f"{flag}={value}: give an integer from 1 to 254")
    if args.gbit is not None and not (math.isfinite(args.gbit) and args.gbit > 0):
        raise UsageError(f"--gbit={args.gbit}: give a positive, finite uplink rate in Gbit/s (e.g. --gbit 1)")
    return args, [LinkDown.parse(text) for text in args.link_down]


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
        for f in faults:
            if f.node >= job.nodes:
                raise UsageError(f"--link-down {f.node}:{f.at_s:g}:{f.for_s:g}: the nodes are 0..{job.nodes - 1}")
        return 128 + stop.signum if stop.signum else run_cluster(job, faults, stop)
    except UserError as e:
        print(f"{e.prefix}: {e}", file=sys.stderr)
        return e.exit_code
    except FabricError as e:
        print(f"error: the emulated fabric failed: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
