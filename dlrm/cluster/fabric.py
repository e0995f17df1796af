"""The emulated cluster's network: one namespace per node behind a tbf-shaped uplink into a bridge
in its own namespace; `Fabric.close` removes them and every process inside.

The bridge's namespace also holds the job's c10d rendezvous store (`Fabric.start_store`), so that it
outlives any node's agent, node 0's included.
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
from pathlib import Path

from dlrm.common.errors import UsageError

SUBNET = "198.18.0"  # /24 of 198.18.0.0/15 (RFC 2544 benchmarking), node i at .i+1
STORE_ADDRESS = f"{SUBNET}.254"  # the bridge's own address, in the switch namespace: the rendezvous store
MAX_NODES = 253  # .1 .. .253
ETC_NETNS = "/etc/netns"  # per-namespace /etc files of `ip netns exec`
IFNAME = "eth0"  # each node's interface, inside its namespace
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21  # bits of /proc/self/status CapEff


# Uplink rates tc's tbf sets faithfully with our bucket (2 ms of the rate): below 1 Mbit/s its queue
# latency drifts from the 50 ms asked, above 400 Gbit/s the bucket's size in ticks overflows.
MIN_GBIT, MAX_GBIT = 0.001, 400.0


def check_rate(gbit: float, what: str) -> None:
    """UsageError unless `gbit` is an uplink rate tc can set (MIN_GBIT..MAX_GBIT Gbit/s)."""
    if not (math.isfinite(gbit) and MIN_GBIT <= gbit <= MAX_GBIT):
        raise UsageError(f"{what}={gbit}: give an uplink rate from {MIN_GBIT} to {MAX_GBIT:g} Gbit/s (e.g. 1)")


class FabricError(RuntimeError):
    """An `ip` or `tc` command failed: the message names it and its output."""


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
        fix = (  # root without them: a container started without the capabilities
            "give it those capabilities (e.g. docker run --cap-add NET_ADMIN --cap-add SYS_ADMIN)"
            if os.geteuid() == 0
            else "run it as root (e.g. sudo .venv/bin/python -m dlrm.cluster ...)"
        )
        return (
            f"dlrm.cluster creates network namespaces and links, which needs root: this process (uid {os.geteuid()}) "
            f"lacks {' and '.join(lacking)}; {fix}"
        )
    for tool in ("ip", "tc"):
        if tool_path(tool) is None:
            return f"'{tool}' is not installed (PATH, /usr/sbin, /sbin); install iproute2 (apt-get install iproute2)"
    return None


def tool_path(tool: str) -> str | None:
    """The path of `tool` on PATH or in /usr/sbin or /sbin; None when missing."""
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
        """A namespace with lo up, and an /etc/hosts naming every node and the store (`ip netns exec` mounts
        /etc/netns/NAME/hosts over /etc/hosts), so c10d's reverse lookups of their addresses succeed."""
        hosts = Path(ETC_NETNS, name, "hosts")
        self.made_etc_netns = self.made_etc_netns or not os.path.isdir(ETC_NETNS)
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts_of = [(self.address(i), self.node(i)) for i in range(self.nodes)] + [(STORE_ADDRESS, self.switch)]
        names = "".join(f"{a}{address} {host}\n" for address, host in hosts_of for a in ("", "::ffff:"))
        hosts.write_text(f"127.0.0.1 localhost\n::1 localhost\n{names}")  # ::ffff: as dual-stack sockets see them
        self._run(self.ip, "netns", "add", name)
        self._run(self.ip, "-n", name, "link", "set", "lo", "up")

    def _shape(self, namespace: str, dev: str) -> None:
        """Shape dev's egress in `namespace` with a token bucket filter at the uplink's rate."""
        rate = self.uplink_gbit * 1e9
        burst = max(64 * 1024, int(rate / 8 * 0.002))
        self._run(self.ip, "netns", "exec", namespace, self.tc, "qdisc", "add", "dev", dev, "root", "tbf",
                  "rate", f"{int(rate)}bit", "burst", str(burst), "latency", "50ms")  # fmt: skip

    def open(self) -> None:
        self._netns(self.switch)
        self._run(self.ip, "-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._run(self.ip, "-n", self.switch, "addr", "add", f"{STORE_ADDRESS}/24", "dev", "br0")
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

    def start_store(self, port: int) -> subprocess.Popen:
        """The rendezvous store at STORE_ADDRESS:port, in the switch namespace until `close` ends it."""
        serve = [sys.executable, "-m", "dlrm.cluster.fabric", "--serve-store", str(port), self.prefix]  # named
        return subprocess.Popen([self.ip, "netns", "exec", self.switch, *serve], start_new_session=True)

    def set_link(self, i: int, up: bool) -> None:
        self._run(self.ip, "-n", self.node(i), "link", "set", IFNAME, "up" if up else "down")

    def namespaces(self) -> list[str]:
        """The cluster's namespaces that exist (listed, not remembered: an interrupted `ip netns add` counts)."""
        out = subprocess.run([self.ip, "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in out.splitlines() if line.startswith(self.prefix + "-")]

    def pids(self, namespaces: list[str] | None = None) -> list[int]:
        """The processes inside these namespaces (None: all the cluster's)."""
        found: list[int] = []
        for ns in self.namespaces() if namespaces is None else namespaces:
            out = subprocess.run([self.ip, "netns", "pids", ns], capture_output=True, text=True).stdout
            found += [int(p) for p in out.split()]
        return found

    def kill(self, namespaces: list[str] | None = None, within_s: float = 10.0) -> tuple[int, list[int]]:
        """SIGKILL every process inside these namespaces (None: all the cluster's) until none is left, for
        up to within_s (a dying parent may still start one): (how many were killed, those left)."""
        killed: set[int] = set()
        deadline = time.monotonic() + within_s
        while (pids := self.pids(namespaces)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            time.sleep(0.05)
        return len(killed), pids

    def kill_node(self, i: int) -> int:
        """SIGKILL node i's processes (its torchrun agent and workers): how many; a FabricError if some stay."""
        killed, left = self.kill([self.node(i)], 5.0)
        if left:
            raise FabricError(f"could not kill the processes {left} of {self.node(i)}")
        return killed

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
        _, pids = self.kill()
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


def serve_store(port: int) -> None:
    """Host a c10d TCPStore at STORE_ADDRESS:port (run in the switch namespace), until killed."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(STORE_ADDRESS, port, is_master=True, wait_for_workers=False, timeout=timedelta(days=1))
    while store is not None:
        signal.pause()


if __name__ == "__main__" and sys.argv[1:2] == ["--serve-store"]:  # --serve-store PORT FABRIC (a label)
    serve_store(int(sys.argv[2]))
