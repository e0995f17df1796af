"""Shared fixtures. Helpers shared by several test modules live in tests/helpers/."""

import pytest

from dlrm.compose import compose


@pytest.fixture
def make_config():
    """compose(*overrides): the typed Config for these Hydra overrides (not validated)."""
    return lambda *overrides: compose(overrides)
