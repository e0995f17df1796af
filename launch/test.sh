#!/usr/bin/env bash
# Set up if needed, then run the test suite: bash launch/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash launch/setup.sh
exec .venv/bin/python -m pytest -q "$@"
