"""Shared fixtures. Helpers shared by several test modules live in tests/helpers/."""

import copy
import functools

import pytest

from dlrm.config import Config
from dlrm.config.compose import compose


@pytest.fixture(scope="module")
def group():
    """A 1-rank Gloo group in this process (the trainer's in-process runs make one alike)."""
    import torch.distributed as dist

    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    if made:
        dist.destroy_process_group()


@functools.cache
def _composed(overrides: tuple[str, ...]) -> Config:
    """compose(overrides), once per distinct overrides in this process (conf/ does not change during a run)."""
    return compose(overrides)


@pytest.fixture
def make_config():
    """compose(*overrides): the typed Config for these Hydra overrides (not validated), a copy of its own
    (a test may change it); a refused composition raises its ConfigError on every call."""
    return lambda *overrides: copy.deepcopy(_composed(tuple(overrides)))


_WORKERS_TIMING_LINES: list[str] = []  # the families' timing lines that xdist workers sent back


def pytest_sessionfinish(session):
    """An xdist worker hands its families' timing lines to the controller (xdist's workeroutput)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from tests.helpers.families import timing_lines

        workeroutput["dlrm_family_timings"] = timing_lines()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller keeps what a finished xdist worker sent (pytest_sessionfinish above)."""
    _WORKERS_TIMING_LINES.extend(getattr(node, "workeroutput", {}).get("dlrm_family_timings", []))


def pytest_terminal_summary(terminalreporter):
    """How long each scenario family's one launch took, and its slowest jobs (tests/helpers/families.py)."""
    from tests.helpers.families import timing_lines

    lines = timing_lines() + _WORKERS_TIMING_LINES
    if lines:
        terminalreporter.section("scenario families")
        for line in lines:
            terminalreporter.write_line(line)


# Timing-sensitive checks (per-phase times against the wall clock) run after the families' launches.
AFTER_THE_FAMILIES = ("tests/trainer/test_observability.py",)

# Session fixtures that train and export a model (tests/helpers/bundles.py): their tests share a worker.
SHARED_MODEL_FIXTURES = ("criteo_job", "parquet_job")


def _worker_group(item) -> str:
    """Under pytest-xdist (`--dist loadgroup`), the tests that must share one process: every reader of
    the scenario families (one launch per family) and the timing-sensitive checks after them; the users
    of a shared trained model; else one group per module (its module-scoped fixtures built once)."""
    from tests.helpers.families import reads_a_family

    if reads_a_family(item) or item.nodeid.startswith(AFTER_THE_FAMILIES):
        return "families"
    if set(SHARED_MODEL_FIXTURES) & set(getattr(item, "fixturenames", ())):
        return "shared_models"
    return item.nodeid.split("::")[0]


class _WorkerGroups:
    """Marks each test's xdist group before xdist's own hook reads the marks (registered in workers)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items):
        for item in items:
            item.add_marker(pytest.mark.xdist_group(_worker_group(item)))


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(_WorkerGroups(), "dlrm-worker-groups")


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: only the selected tests count
def pytest_collection_modifyitems(config, items):
    """Order the session so that both cores stay busy.

    In one process, the families the tests read start at once on a background thread (tests/helpers/
    families.py `prefetch`) and their 2-rank launches overlap with the tests that use one core: first
    the tests not marked slow (one process), then the slow ones (several processes each), then those
    that read the families, then the timing-sensitive ones.

    Under pytest-xdist (`launch/test.sh` starts 3 workers, `--no-loadscope-reorder`), the workers take the
    groups in this order: the families' (its worker launches them on first read), the timing-sensitive
    checks, the modules with slow tests, then the one-process modules, which fill the gaps at the end;
    nothing is prefetched."""
    from tests.helpers.families import FAMILIES, families_of, prefetch

    needed, light, heavy, readers, late = set(), [], [], [], []
    for item in items:
        families = families_of(item)  # declares the jobs of the item's `runs`
        needed.update(families)
        if families:
            readers.append(item)
        elif item.nodeid.startswith(AFTER_THE_FAMILIES):
            late.append(item)
        elif item.get_closest_marker("slow"):
            heavy.append(item)
        else:
            light.append(item)
    if hasattr(config, "workerinput"):  # an xdist worker
        items[:] = readers + late + heavy + light
        return
    items[:] = light + heavy + readers + late
    if needed and not config.option.collectonly:
        prefetch([f for f in FAMILIES if f in needed])
