#!/usr/bin/env bash
# The CPU smoke run: set up if needed, then train on NPROC (default 2) Gloo ranks under torchrun.
#   bash launch/run_cpu.sh [hydra overrides...]     e.g. trainer.max_steps=50 sharding=row_wise
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash launch/setup.sh
NPROC=${NPROC:-2}
cmd=(.venv/bin/torchrun --standalone --nproc_per_node="$NPROC" -m dlrm.train "$@")
echo "+ ${cmd[*]}" >&2
exec "${cmd[@]}"
