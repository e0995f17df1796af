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
