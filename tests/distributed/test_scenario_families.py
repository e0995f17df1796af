"""The distributed tests' declarations (tests/helpers/families.py), without a launch: `runs` hands a
test its jobs' values, equal jobs run once, a parametrized test gets the job of its parameters, and
a test skipped by a mark declares nothing; the launcher's fork server preloads modules that exist."""

import inspect

import pytest
import torch

from tests.helpers.families import Family, Overrides, families_of, reads_a_family, runs


def rank_function(x):
    return x


def _family_with_results() -> Family:
    """A family whose 'launch' returns each job's first argument on its 2 ranks."""
    family = Family("test", nproc=2)
    family.run = lambda: setattr(family, "results", {k: [j.args[0]] * 2 for k, j in family.jobs.items()})
    return family


def test_runs_passes_each_jobs_values_and_keeps_the_other_arguments():
    family = _family_with_results()

    @runs(first=family.job(rank_function, 1), second=lambda n: family.job(rank_function, n * 10))
    def test(n, first, second):
        return n, first, second

    assert list(inspect.signature(test).parameters) == ["n"]  # what pytest provides
    assert test(n=2) == (2, [1, 1], [20, 20])
    assert list(family.jobs) == ["test[2]/first", "test[2]/second"]  # named by test, parameters, argument


def test_equal_jobs_run_once_and_others_apart():
    family = Family("test", nproc=2)
    a = family.declare(family.job(rank_function, Overrides("model=tiny")), "a")
    b = family.declare(family.job(rank_function, Overrides("model=tiny")), "b")
    c = family.declare(family.job(rank_function, Overrides("model=small")), "a")
    d = family.declare(family.job(rank_function, [torch.zeros(3)]), "d")  # tensors: compared, never merged
    e = family.declare(family.job(rank_function, [torch.zeros(3)]), "e")
    assert (a.key, b.key, c.key, d.key, e.key) == ("a", "a", "a#2", "d", "e")
    assert family.declare(family.job(rank_function, Overrides("model=tiny"), expect_error=True), "f").key == "f"


class _Item:
    """What families_of reads of a collected pytest item."""

    def __init__(self, function, params=None, marks=()) -> None:
        self.function, self.fixturenames, self.marks = function, (), marks
        if params is not None:
            self.callspec = type("CallSpec", (), {"params": params})()

    def iter_markers(self, name):
        return (m for m in self.marks if m.name == name)


def test_collection_declares_the_selected_tests_jobs_unless_skipped():
    family = Family("test", nproc=2)

    @runs(results=lambda sharding: family.job(rank_function, sharding))
    def test(sharding, results):
        pass

    skipped = pytest.mark.skipif(True, reason="no data").mark
    assert families_of(_Item(test, {"sharding": "row_wise"}, (skipped,))) == [] and not family.jobs
    assert families_of(_Item(test, {"sharding": "row_wise"})) == [family]
    assert [j.args for j in family.jobs.values()] == [("row_wise",)]


PLAIN_FAMILY = Family("plain", nproc=2)
PLAIN_SCENARIO = PLAIN_FAMILY.declare(PLAIN_FAMILY.job(rank_function, 1), "plain/job")


def test_a_reader_is_known_without_declaring_its_jobs():
    """What conftest groups by under xdist: `runs` and named scenarios read a family, a plain test not."""
    family = Family("test", nproc=2)

    @runs(results=family.job(rank_function, 1))
    def with_runs(results):
        pass

    def naming_a_scenario():
        return PLAIN_SCENARIO.results()

    def plain():
        return 1

    assert reads_a_family(_Item(with_runs)) and not family.jobs
    assert reads_a_family(_Item(naming_a_scenario))
    assert not reads_a_family(_Item(plain))


def test_the_fork_servers_preload_imports():
    """The fork server skips a preload module that fails to import: the ranks would then pay the imports
    again, silently. Every name in PRELOAD must import."""
    import importlib

    from tests.helpers.harness import PRELOAD

    for name in PRELOAD:
        importlib.import_module(name)
