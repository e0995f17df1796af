#!/usr/bin/env bash
# Set up if needed, then run the test suite: bash launch/test.sh [pytest args...]
#   DLRM_VENV          the venv to set up and test with (default .venv), as for launch/setup.sh
#   DLRM_TEST_WORKERS  pytest-xdist workers (default 2; 0: one process). The scenario families'
#                      tests share one worker (--dist loadgroup, tests/conftest.py); the other
#                      worker runs the rest, mostly single-process tests and subprocesses.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash launch/setup.sh
exec "${DLRM_VENV:-.venv}/bin/python" -m pytest -q -n "${DLRM_TEST_WORKERS:-2}" --dist loadgroup "$@"
