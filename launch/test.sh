#!/usr/bin/env bash
# Set up if needed, then run the test suite: bash launch/test.sh [pytest args...]
#   DLRM_VENV          the venv to set up and test with (default .venv), as for launch/setup.sh
#   DLRM_TEST_WORKERS  pytest-xdist worker processes (default 3, one more than the 2 cores CI has:
#                      the tests leave a core idle while processes start; 0 runs the tests in this process);
#                      a `-n N` among the pytest args wins
# The workers take the xdist groups in the order tests/conftest.py gives them (the families, then the
# tests that start processes, then the one-process ones that fill the gaps at the end), not xdist's
# largest-group-first, which left the multi-process tests of small modules for the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash launch/setup.sh
# The tests' processes keep Python's bytecode caches (pytest's rewritten test modules, dlrm's modules),
# which a machine may turn off (PYTHONDONTWRITEBYTECODE): else every worker, rank and command compiles
# those sources again.
unset PYTHONDONTWRITEBYTECODE
exec "${DLRM_VENV:-.venv}/bin/python" -m pytest -q -n "${DLRM_TEST_WORKERS:-3}" --dist loadgroup --no-loadscope-reorder "$@"
