"""The real Criteo sample rows (100 lines, no trailing newline); tests using it skip without it."""

import os
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT as ROOT

SAMPLE = Path(os.environ.get("CRITEO_SAMPLE", ROOT.parent / "shared" / "data" / "criteo_sample.tsv"))
needs_sample = pytest.mark.skipif(not SAMPLE.exists(), reason=f"{SAMPLE} not found (set CRITEO_SAMPLE)")
