"""Shared fixtures. Helpers shared by several test modules live in tests/helpers/."""

import pytest

from dlrm.compose import compose


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


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the group into the node ids
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (launch/test.sh runs 2 workers), the tests of every module that registers
    scenario-family jobs share one worker (`--dist loadgroup`): a family launches once per worker
    that reads it."""
    from tests.helpers.families import Family

    for item in items:
        module = getattr(item, "module", None)
        if module is not None and any(isinstance(v, Family) for v in vars(module).values()):
            item.add_marker(pytest.mark.xdist_group("families"))
