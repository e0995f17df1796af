"""Shared fixtures. Helpers shared by several test modules live in tests/helpers/."""

import pytest

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


@pytest.fixture
def make_config():
    """compose(*overrides): the typed Config for these Hydra overrides (not validated)."""
    return lambda *overrides: compose(overrides)


def pytest_terminal_summary(terminalreporter):
    """How long each scenario family's one launch took, and its slowest jobs (tests/helpers/families.py)."""
    from tests.helpers.families import timing_lines

    lines = timing_lines()
    if lines:
        terminalreporter.section("scenario families")
        for line in lines:
            terminalreporter.write_line(line)


# Timing-sensitive checks (per-phase times against the wall clock) run after the families' launches.
AFTER_THE_FAMILIES = ("tests/trainer/test_observability.py",)


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: only the selected tests count
def pytest_collection_modifyitems(config, items):
    """The families the tests read start at once on a background thread (tests/helpers/families.py
    `prefetch`), and their 2-rank launches overlap with the tests that use one core: first the tests
    not marked slow (one process), then the slow ones (several processes each), then those that read
    the families, then the timing-sensitive ones."""
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
    items[:] = light + heavy + readers + late
    if needed and not config.option.collectonly:
        prefetch([f for f in FAMILIES if f in needed])
