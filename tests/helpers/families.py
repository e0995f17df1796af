"""Scenario families: the distributed tests' rank functions grouped by launch shape, each family run
in ONE launch.

A test declares the runs it reads right above itself; each is injected as an argument holding the
rank function's value on every rank, in rank order:

    def resume_and_report(cfg):                      # the rank function, in the test module
        ...

    @pytest.mark.slow
    @runs(whole=PAIR.job(train_and_report, WHOLE), resumed=PAIR.job(resume_and_report, RESUMED))
    def test_resume_is_exact(whole, resumed):
        assert resumed[0]["losses"] == whole[0]["losses"][4:]

A parametrized test gives a function of its parameters instead of a job:
`@runs(results=lambda sharding: PAIR.job(train_and_report, tiny(f"sharding={sharding}")))`.

At collection (tests/conftest.py), the selected tests' jobs join their families, in test order and,
within a test, in the order written: a job that reads another's checkpoint is declared after it, in
the same test. Equal jobs (same function, equal arguments) run once, so a baseline several tests
compare against trains once. Each family then runs every job in one elastic launch: the session pays
the ~6 CPU-seconds of imports per rank once per family instead of once per job.

A rank function is pickled by its module path: a test module's functions are importable by the
ranks, so a test module stays cheap to import (no work at import but declarations).

Arguments of type `Overrides` are composed into a Config in the parent when the family runs.
`Family.dir(name)` is a directory path for one job's files, the same in the ranks as in the test.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlrm.config.compose import compose
from tests.helpers.harness import Job, JobError, launch_jobs

ROOT_VARIABLE = "DLRM_TEST_FAMILIES_ROOT"  # the session's directory, inherited by the ranks


class Overrides(tuple):
    """Hydra overrides, composed into a Config when the family runs."""

    def __new__(cls, *overrides: str) -> Overrides:
        return super().__new__(cls, overrides)


@functools.cache
def _root() -> Path:
    """The session's directory for the families' files; a rank gets its parent's."""
    if os.environ.get(ROOT_VARIABLE):
        return Path(os.environ[ROOT_VARIABLE])
    root = Path(tempfile.mkdtemp(prefix="dlrm-families-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    os.environ[ROOT_VARIABLE] = str(root)
    return root


@dataclass(frozen=True, eq=False)
class Declared:
    """fn(*args) on every rank of `family` (not yet part of its launch)."""

    family: Family
    fn: Callable
    args: tuple
    expect_error: bool

    def same_job(self, other: Declared) -> bool:
        """The same function with equal arguments (arguments that do not compare are not equal)."""
        if (self.family, self.fn, self.expect_error) != (other.family, other.fn, other.expect_error):
            return False
        try:
            return bool(self.args == other.args)
        except (RuntimeError, ValueError):  # tensors among the arguments
            return False


class Family:
    """Jobs that share one launch of `nnodes` x `nproc` ranks."""

    def __init__(self, name: str, nproc: int, nnodes: int = 1, after: tuple[Family, ...] = ()) -> None:
        self.name, self.nproc, self.nnodes, self.after = name, nproc, nnodes, after
        self.jobs: dict[str, Declared] = {}
        self.results: dict[str, list] | None = None
        self.failure: BaseException | None = None
        self.seconds: dict[str, float] = {}  # per job on rank 0; "(launch)": the whole launch
        self._lock = threading.Lock()  # run() once, also when prefetched on another thread
        self._prepared: list[Job] | None = None

    def job(self, fn: Callable, *args, expect_error: bool = False) -> Declared:
        """fn(*args) on every rank of this family, for `runs`. expect_error: the exception the ranks
        raise alike is the result (a JobError) instead of failing the launch."""
        return Declared(self, fn, args, expect_error)

    def declare(self, job: Declared, name: str) -> Scenario:
        """Add `job` to the launch under `name`, or find the equal job declared before."""
        for key, known in self.jobs.items():
            if known.same_job(job):
                return Scenario(self, key)
        assert self.results is None, f"{self.name}: job {name!r} declared after the family ran"
        key, n = name, 1
        while key in self.jobs:
            n += 1
            key = f"{name}#{n}"
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
                Job(j.fn, tuple(compose(list(a)) if isinstance(a, Overrides) else a for a in j.args), j.expect_error)
                for j in self.jobs.values()
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
    """One job declared in a family; `results()` launches the family once and reads this job's share."""

    def __init__(self, family: Family, key: str) -> None:
        self.family, self.key = family, key

    def results(self) -> list:
        """fn's value on every rank, in rank order (a JobError where it raised, with expect_error)."""
        self.family.run()
        assert self.family.results is not None
        return self.family.results[self.key]

    def __repr__(self) -> str:
        return f"Scenario({self.family.name}/{self.key})"


def runs(**jobs: Declared | Callable[..., Declared]):
    """Decorate a test with the jobs it reads: each keyword is an argument of the test that receives
    the job's value on every rank. A value is a `Family.job(...)`, or a function of some of the
    test's parameters (named alike) that returns one."""

    def decorate(test):
        kept = [p for name, p in inspect.signature(test).parameters.items() if name not in jobs]

        @functools.wraps(test)
        def with_results(**kwargs):
            declared = {name: _declared(test, name, spec, kwargs) for name, spec in jobs.items()}
            return test(**kwargs, **{name: scenario.results() for name, scenario in declared.items()})

        with_results.__signature__ = inspect.Signature(kept)  # type: ignore[attr-defined]  # pytest's fixtures
        with_results.runs = jobs  # type: ignore[attr-defined]
        return with_results

    return decorate


def _declared(test, name: str, spec, params: dict) -> Scenario:
    """The scenario of one `runs` keyword for these parameter values, declared in its family."""
    if not isinstance(spec, Declared):
        wanted = inspect.signature(spec).parameters
        spec = spec(**{p: params[p] for p in wanted})
    label = ",".join(_label(params[p]) for p in sorted(params))
    return spec.family.declare(spec, f"{test.__name__.removeprefix('test_')}{f'[{label}]' if label else ''}/{name}")


def _label(value) -> str:
    return value.name if isinstance(value, Family) else str(value) if isinstance(value, str | int | float) else "?"


def families_of(item) -> list[Family]:
    """Declare the jobs a collected test reads (its `runs`) and return their families; for a test
    without `runs`, the families of the scenarios its code names; and the jobs of the fixtures it uses
    (FIXTURE_READS).
    A test skipped by a mark declares nothing."""
    function = getattr(item, "function", None)
    if function is None or _skipped(item):
        return []
    found: list[Family] = []
    jobs = getattr(function, "runs", None)
    if jobs is not None:
        params = getattr(getattr(item, "callspec", None), "params", {})
        for name, spec in jobs.items():
            found.append(_declared(function.__wrapped__, name, spec, params).family)
    else:
        found += _families_named_by(function)
    for fixture in getattr(item, "fixturenames", ()):
        if fixture in FIXTURE_READS:
            found.append(FIXTURE_READS[fixture].family.declare(FIXTURE_READS[fixture], fixture).family)
    return list(dict.fromkeys(found))


def reads_a_family(item) -> bool:
    """Whether a collected test reads a family (its `runs`, the scenarios its code names, or a fixture
    in FIXTURE_READS), without declaring anything."""
    function = getattr(item, "function", None)
    if function is None:
        return False
    if getattr(function, "runs", None) is not None or _families_named_by(function):
        return True
    return any(fixture in FIXTURE_READS for fixture in getattr(item, "fixturenames", ()))


def _skipped(item) -> bool:
    """Whether the test is marked skip, or skipif with a condition that is True (not a string)."""
    if any(True for _ in item.iter_markers("skip")):
        return True
    return any(c is True for m in item.iter_markers("skipif") for c in (*m.args, m.kwargs.get("condition")))


def _families_named_by(fn) -> list[Family]:
    """The module globals `fn`'s code names that are scenarios or families (or a dict, list or tuple
    of them)."""
    found: list[Family] = []

    def visit(value, depth: int = 0) -> None:
        if isinstance(value, Family | Scenario):
            found.append(value if isinstance(value, Family) else value.family)
        elif isinstance(value, dict | list | tuple) and depth < 2:
            for v in value.values() if isinstance(value, dict) else value:
                visit(v, depth + 1)

    for name in fn.__code__.co_names:
        visit(fn.__globals__.get(name))
    return found


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


def error_of(results: list) -> JobError:
    """The one error an expect_error job raised on every rank alike."""
    assert all(isinstance(r, JobError) for r in results), f"the job did not fail: {results}"
    assert len({(r.type, r.message) for r in results}) == 1, results
    return results[0]


# The families.
PAIR = Family("pair", nproc=2)  # 2 ranks on one node
TWO_NODES = Family("two_nodes", nproc=2, nnodes=2, after=(PAIR,))  # 2 simulated nodes x 2 ranks
SINGLE = Family("single", nproc=1, after=(PAIR, TWO_NODES))  # 1 rank: resumes of the others' checkpoints
LONG_PAIR = Family("long_pair", nproc=2)  # 2 ranks, read only by tests marked long (not in the default run)
FAMILIES = (PAIR, TWO_NODES, SINGLE, LONG_PAIR)
# Session fixtures that read a family's job ({fixture name: job}): the job is declared for the tests
# that use the fixture, and they are ordered as the tests that read the family (tests/conftest.py).
FIXTURE_READS: dict[str, Declared] = {}


def timing_lines(slowest: int = 5) -> list[str]:
    """For the session's summary: each family that ran, its launch's seconds and its slowest jobs."""
    lines = []
    for family in FAMILIES:
        if not family.results:
            continue
        jobs = sorted(((s, k) for k, s in family.seconds.items() if k != "(launch)"), reverse=True)
        top = ", ".join(f"{k} {s:.1f}s" for s, k in jobs[:slowest])
        lines.append(
            f"{family.name}: {len(jobs)} jobs in one launch, {family.seconds['(launch)']:.0f}s; slowest: {top}"
        )
    return lines
