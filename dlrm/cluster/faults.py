"""The faults the emulated cluster injects, timed from the start of training, and the line each ends with.

- `--link-down NODE:AT_S:FOR_S` (`LinkDown`): the node's uplink goes down, then up again. The job rides
  through an outage shorter than trainer.collective_timeout_s and fails with one `failed:` line per
  node (exit 3) after a longer one.
- `--kill-agent NODE@AT_S` (`AgentKill`): the node's torchrun agent and workers are SIGKILLed and the
  agent is started again (a replacement node). The other agents restart the job (one restart per
  kill unless --max-restarts says otherwise); with trainer.resume=auto it resumes from its last
  checkpoint. A kill beyond --max-restarts ends the job (exit 3); the same command with
  trainer.resume=auto continues it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlrm.cluster.fabric import Fabric
from dlrm.common.errors import UsageError

FAILED_GRACE_S = 10.0  # after one agent fails, how long the others get to end on their own
SIGKILL_STATUS = 137  # the job's status when every agent was killed: 128 + SIGKILL


def _fate(what: str, trained_s: float | None, at_s: float, status: int, result: str, then: str = "") -> str:
    """`what: result, ending at T s of training[; then]`, or `what: not applied, ...` when the job ended first."""
    if trained_s is None or trained_s < at_s:
        when = "training never started" if trained_s is None else f"the job ended first, at {trained_s:.1f} s"
        return f"{what}: not applied, {when} (exit status {status})"
    return f"{what}: {result}, ending at {trained_s:.1f} s of training{then}"


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

    def __str__(self) -> str:
        return f"--link-down {self.node}:{self.at_s:g}:{self.for_s:g}"

    def outcome(self, trained_s: float | None, status: int) -> str:
        """One line: what the fault did, given how long after the start of training the job ended (None:
        training never started) and its exit status."""
        what = f"fault: node {self.node}'s link down at {self.at_s:g} s of training for {self.for_s:g} s"
        result = "the job rode through it" if status == 0 else f"the job failed (exit status {status})"
        return _fate(what, trained_s, self.at_s, status, result)


@dataclass(frozen=True)
class AgentKill:
    """Node `node`'s torchrun agent and workers are SIGKILLed `at_s` seconds after training starts."""

    node: int
    at_s: float

    @classmethod
    def parse(cls, text: str) -> AgentKill:
        found = re.fullmatch(r"(\d+)@([0-9.]+)", text)
        try:
            if found is None:
                raise ValueError(text)
            node, at_s = int(found[1]), float(found[2])
        except ValueError:
            raise UsageError(
                f"--kill-agent {text}: give NODE@AT_S, a node index and seconds (e.g. 1@5: node 1's torchrun "
                "agent and its workers killed 5 s after training starts)"
            ) from None
        return cls(node, at_s)

    def __str__(self) -> str:
        return f"--kill-agent {self.node}@{self.at_s:g}"

    def outcome(self, trained_s: float | None, status: int, restarted: bool = False) -> str:
        """One line, as LinkDown.outcome (restarted: the node's agent was started again); a failure
        says how to continue."""
        what = f"fault: node {self.node}'s agent killed at {self.at_s:g} s of training"
        if status == 0:
            done = "the job restarted with the node's new agent and" if restarted else "the other nodes"
            return _fate(what, trained_s, self.at_s, status, f"{done} finished (exit status 0)")
        then = "; the same command with trainer.resume=auto continues it from its last checkpoint"
        return _fate(what, trained_s, self.at_s, status, f"the job failed (exit status {status})", then)


Fault = LinkDown | AgentKill


class FaultSchedule:
    """The faults of one run, timed from the start of training: when the run's metrics.jsonl gets a
    record (the trainer writes its start event first), so a slow start-up does not shift them.

    restart(node) starts a killed node's agent again, for the first max_restarts kills (the other
    nodes' agents restart the job once per kill); later kills leave the node down.
    """

    def __init__(
        self,
        faults: list[Fault],
        fabric: Fabric,
        run_dir: str,
        restart: Callable[[int], None] | None = None,
        max_restarts: int = 0,
    ) -> None:
        self.faults, self.fabric, self.restart, self.max_restarts = faults, fabric, restart, max_restarts
        self.metrics = Path(run_dir, "metrics.jsonl")
        self.size_before = self._size()  # a continued run's file has records already
        self.started: float | None = None  # time.monotonic() at the start of training
        self.killed: dict[int, float] = {}  # node -> time.monotonic() when it was killed and left down
        self.restarted: list[AgentKill] = []  # the kills after which the node's agent was started again
        self.kills = 0
        events: list[tuple[float, Fault, str]] = []  # (seconds of training, fault, what to do)
        for f in faults:
            if isinstance(f, LinkDown):
                events += [(f.at_s, f, "down"), (f.at_s + f.for_s, f, "up")]
            else:
                events.append((f.at_s, f, "kill"))
        self.events = sorted(events, key=_when)

    def _size(self) -> int:
        try:
            return self.metrics.stat().st_size
        except OSError:
            return 0

    def tick(self) -> list[str]:
        """Apply the faults whose time has come; a line for each kill, saying what followed."""
        if not self.faults:
            return []
        now = time.monotonic()
        if self.started is None:
            if self._size() <= self.size_before:
                return []
            self.started = now
        said = []
        while self.events and self.started + self.events[0][0] <= now:
            _, fault, action = self.events.pop(0)
            if isinstance(fault, AgentKill):
                said.append(self._kill(fault))
            else:
                self.fabric.set_link(fault.node, action == "up")
        return said

    def _kill(self, fault: AgentKill) -> str:
        killed = self.fabric.kill_node(fault.node)
        if not killed:  # its agent had ended (the job too, or about to): nothing to restart
            return f"node {fault.node}'s agent had already ended: nothing killed"
        self.kills += 1
        kills = self.kills
        what = f"node {fault.node}'s agent and workers killed ({killed} processes)"
        if self.restart is None or kills > self.max_restarts:
            self.killed.setdefault(fault.node, time.monotonic())
            return f"{what}; not started again: no restart left for kill {kills} (--max-restarts={self.max_restarts})"
        self.restart(fault.node)
        self.restarted.append(fault)
        self.killed.pop(fault.node, None)
        return (
            f"{what}; its agent started again (restart {kills} of --max-restarts={self.max_restarts}): the job "
            "restarts once the dead agent's rendezvous heartbeats expire"
        )

    def report(self, status: int) -> list[str]:
        """One line per fault: what it did to the job that ended with `status`."""
        trained_s = None if self.started is None else time.monotonic() - self.started
        return [
            f.outcome(trained_s, status, any(f is r for r in self.restarted))
            if isinstance(f, AgentKill)
            else f.outcome(trained_s, status)
            for f in self.faults
        ]


def _when(event: tuple[float, Fault, str]) -> float:
    return event[0]
