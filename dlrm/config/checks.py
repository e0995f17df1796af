"""ConfigError, and the helpers with which each section's `check` raises it."""

from __future__ import annotations

import math
from typing import NoReturn

from dlrm.common.errors import UserError


class ConfigError(UserError, ValueError):
    """An invalid configuration; the message names the key, the value and the fix."""

    same_on_all_ranks = True  # every rank composes and validates the same config


def _fail(key: str, value, fix: str) -> NoReturn:
    raise ConfigError(f"config key '{key}' = {value!r} is invalid: {fix}")


def _require_positive(key: str, value) -> None:
    if value is None or not value > 0 or math.isinf(value):  # `not >` also catches nan
        _fail(key, value, "it must be a positive, finite number")


def _require_count(key: str, value: int, zero: str) -> None:
    if value < 0:
        _fail(key, value, f"use 0 ({zero}) or a positive count")
