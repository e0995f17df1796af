"""Scenario families: the distributed tests' jobs grouped by launch shape, each family run in ONE launch.

A test module declares its runs beside the tests that read them:

    RESUMED = PAIR.add("ckpt/resumed", train_and_report, overrides)   # a Scenario: fn(*args) on each rank

    def test_resume_is_exact():
        whole, resumed = WHOLE.results(), RESUMED.results()           # one value per rank

The first `results()` of a family runs every scenario declared in it, in declaration order, in one
elastic launch, and later tests read the cached results. So the session pays the ~6 CPU-seconds of
imports per rank once per family instead of once per test, and a baseline that several tests compare
against (the fp32 table-wise run) trains once. The key names the run in failures and timings.

Arguments of type `Overrides` are composed into a Config in the parent when the family runs (not at
import: collection stays fast). `Family.dir(name)` is a directory for one job's files (checkpoints),
under a root that lives for the session. A family that reads another's files names it in `after`.

Running one test runs its module's jobs of that family (every registered job): a few seconds more
than the test alone, never a different result.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
import threading
import time
from pathlib import Path

from dlrm.config.compose import compose
from tests.helpers.harness import Job, JobError, launch_jobs


class Overrides(tuple):
    """Hydra overrides, composed into a Config when the family runs."""

    def __new__(cls, *overrides: str) -> Overrides:
        return super().__new__(cls, overrides)


@functools.cache
def _root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="dlrm-families-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


class Family:
    """Jobs that share one launch of `nnodes` x `nproc` ranks."""

    def __init__(self, name: str, nproc: int, nnodes: int = 1, after: tuple[Family, ...] = ()) -> None:
        self.name, self.nproc, self.nnodes, self.after = name, nproc, nnodes, after
        self.jobs: dict[str, tuple] = {}
        self.results: dict[str, list] | None = None
        self.failure: BaseException | None = None
        self.seconds: dict[str, float] = {}  # per job on rank 0; "(launch)": the whole launch
        self._lock = threading.Lock()  # run() once, also when prefetched on another thread
        self._prepared: list[Job] | None = None

    def add(self, key: str, fn, *args, expect_error: bool = False) -> Scenario:
        """Declare fn(*args) on every rank, named `key`. Modules may declare the same job (a shared
        baseline) under one key; another job under a taken key is an error."""
        job = (fn, args, expect_error)
        if key in self.jobs:
            assert self.jobs[key] == job, f"{self.name}: two different jobs named {key!r}"
            return Scenario(self, key)
        assert self.results is None, f"{self.name}: job {key!r} declared after the family ran"
        self.jobs[key] = job
        return Scenario(self, key)

    def dir(self, name: str) -> Path:
        """A directory path (not created) for one job's files, unique to this family."""
        return _root() / self.name / name

    def prepare(self) -> list[Job]:
        """The jobs to launch, their Overrides composed (Hydra's global state: call it on the main thread)."""
        for family in self.after:
            family.prepare()
        if self._prepared is None:
            self._prepared = [
                Job(fn, tuple(compose(list(a)) if isinstance(a, Overrides) else a for a in args), expect_error)
                for fn, args, expect_error in self.jobs.values()
            ]
        return self._prepared

    def run(self) -> None:
        for family in self.after:
            family.run()
        with self._lock:
            self._run()

    def _run(self) -> None:
        if self.results is not None:
            return
        if self.failure is not None:
            raise RuntimeError(f"the {self.name} family's launch failed (see its first test)") from self.failure
        jobs = self.prepare()
        start = time.perf_counter()
        try:
            per_job = launch_jobs(jobs, self.nproc, self.nnodes) if jobs else []
        except BaseException as e:
            self.failure = e
            raise
        self.seconds = {key: ranks[0][1] for key, ranks in zip(self.jobs, per_job, strict=True)}
        self.seconds["(launch)"] = time.perf_counter() - start
        self.results = {key: [result for result, _ in ranks] for key, ranks in zip(self.jobs, per_job, strict=True)}


class Scenario:
    """One run declared in a family; `results()` launches the family once and reads this run's share."""

    def __init__(self, family: Family, key: str) -> None:
        self.family, self.key = family, key

    def results(self) -> list:
        """fn's value on every rank, in rank order (a JobError where it raised, with expect_error)."""
        self.family.run()
        assert self.family.results is not None
        return self.family.results[self.key]

    def __repr__(self) -> str:
        return f"Scenario({self.family.name}/{self.key})"


def prefetch(families: list[Family]) -> threading.Thread:
    """Run `families` (and what they come after) on a background thread, while the session runs other
    tests: their ranks use the cores that single-process tests leave idle. A test that reads a family
    still running waits for it; a failed launch is raised by the tests that read it."""

    for family in families:
        family.prepare()

    def run_all() -> None:
        for family in families:
            try:
                family.run()
            except BaseException:  # recorded in family.failure: its tests report it
                pass

    thread = threading.Thread(target=run_all, name="families", daemon=True)
    thread.start()
    return thread


def families_read_by(fn) -> list[Family]:
    """The families a test function reads: the module globals its code names that are scenarios (or a
    dict, list or tuple of them) or families."""
    found: list[Family] = []

    def visit(value, depth: int = 0) -> None:
        if isinstance(value, Family | Scenario):
            family = value if isinstance(value, Family) else value.family
            if family not in found:
                found.append(family)
        elif isinstance(value, dict | list | tuple) and depth < 2:
            for v in value.values() if isinstance(value, dict) else value:
                visit(v, depth + 1)

    for name in fn.__code__.co_names:
        visit(fn.__globals__.get(name))
    return found


def error_of(results: list) -> JobError:
    """The one error an expect_error job raised on every rank alike."""
    assert all(isinstance(r, JobError) for r in results), f"the job did not fail: {results}"
    assert len({(r.type, r.message) for r in results}) == 1, results
    return results[0]


# The families. Each distributed test module adds its jobs to these.
PAIR = Family("pair", nproc=2)  # 2 ranks on one node
TWO_NODES = Family("two_nodes", nproc=2, nnodes=2, after=(PAIR,))  # 2 simulated nodes x 2 ranks
SINGLE = Family("single", nproc=1, after=(PAIR, TWO_NODES))  # 1 rank: resumes of the others' checkpoints
LONG_PAIR = Family("long_pair", nproc=2)  # 2 ranks, read only by tests marked long (not in the default run)
FAMILIES = (PAIR, TWO_NODES, SINGLE, LONG_PAIR)
# Session fixtures that read a family's job ({fixture name: family}): the tests that use them are
# ordered as the tests that read the family (tests/conftest.py).
FIXTURE_READS: dict[str, Family] = {}


def timing_lines(slowest: int = 5) -> list[str]:
    """For the session's summary: each family that ran, its launch's seconds and its slowest jobs."""
    lines = []
    for family in FAMILIES:
        if family.results is None:
            continue
        jobs = sorted(((s, k) for k, s in family.seconds.items() if k != "(launch)"), reverse=True)
        top = ", ".join(f"{k} {s:.1f}s" for s, k in jobs[:slowest])
        lines.append(
            f"{family.name}: {len(jobs)} jobs in one launch, {family.seconds['(launch)']:.0f}s; slowest: {top}"
        )
    return lines
