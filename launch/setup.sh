#!/usr/bin/env bash
# Create or update the virtual environment with the pinned stack (idempotent: instant when done).
#   DLRM_VENV   where the venv lives (default: .venv in the repository)
#   DLRM_ACCEL  cpu | cuda | rocm (default: cuda if nvidia-smi works, else cpu): which torch and fbgemm-gpu build.
#               rocm (AMD Instinct): torch and fbgemm-gpu ROCm builds from PyTorch's wheel index DLRM_ROCM_INDEX
#               (default https://download.pytorch.org/whl/rocm7.1; use the ROCm version FBGEMM's release table
#               lists for fbgemm-gpu 1.8.0). The ROCm torch answers to device 'cuda' and runs RCCL as 'nccl',
#               so the cuda topologies and launchers apply (launch with DLRM_ACCEL=cuda).
#   PYTHON      interpreter for a new venv (default: python3.11)
# On a CPU machine it refuses to download a CUDA build of torch: point pip at CPU wheels
# (PIP_EXTRA_INDEX_URL or PIP_FIND_LINKS) if plain `pip install torch==2.13.0` would not give one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${DLRM_VENV:-.venv}
TORCH=2.13.0
TORCHREC=1.8.0
if [ -z "${DLRM_ACCEL:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DLRM_ACCEL=cuda; else DLRM_ACCEL=cpu; fi
fi
case "$DLRM_ACCEL" in
  cpu|cuda|rocm) ;;
  *) echo "error: DLRM_ACCEL=$DLRM_ACCEL is not cpu, cuda or rocm; unset it to detect, or set DLRM_ACCEL=cpu|cuda|rocm" >&2; exit 2 ;;
esac
stamp="$VENV/.dlrm-setup-$DLRM_ACCEL-$(cat pyproject.toml launch/setup.sh | sha1sum | cut -c1-12)"
[ -f "$stamp" ] && exit 0

echo "setup: $DLRM_ACCEL environment in $VENV (one-time, about a minute)" >&2
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3.11}" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

if [ "$DLRM_ACCEL" = cpu ] && ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '$TORCH+cpu')" 2>/dev/null; then
  # Resolve torch without installing it, and refuse anything but the CPU build.
  wheel=$("${pip[@]}" install --dry-run --ignore-installed --no-deps --report - "torch==$TORCH" 2>/dev/null |
    "$VENV/bin/python" -c "import json, sys; print(json.load(sys.stdin)['install'][0]['download_info']['url'])")
  case "$wheel" in
    *%2Bcpu*|*+cpu*) ;;
    *) echo "setup: pip would install a CUDA build of torch ($wheel) on this CPU machine; refusing." >&2
       echo "setup: make pip see the CPU wheel of torch $TORCH (PyTorch's CPU wheel index via PIP_EXTRA_INDEX_URL)." >&2
       exit 1 ;;
  esac
  "${pip[@]}" install "torch==$TORCH"
fi
extras="$DLRM_ACCEL,test"
if [ "$DLRM_ACCEL" = rocm ]; then  # torch and fbgemm-gpu from the ROCm index first (same names, +rocm builds)
  index=${DLRM_ROCM_INDEX:-https://download.pytorch.org/whl/rocm7.1}
  "${pip[@]}" install --index-url "$index" "torch==$TORCH" "fbgemm-gpu==1.8.0" ||
    { echo "setup: no torch $TORCH / fbgemm-gpu 1.8.0 ROCm build at $index; set DLRM_ROCM_INDEX to PyTorch's ROCm wheel index for them" >&2; exit 1; }
  "$VENV/bin/python" -c "import sys, torch; sys.exit(None if torch.version.hip else 'setup: torch ' + torch.__version__ + ' from $index is not a ROCm build; fix DLRM_ROCM_INDEX')"
  extras=test
fi
"${pip[@]}" install -e ".[$extras]"
"${pip[@]}" install --no-deps "torchrec==$TORCHREC"
"$VENV/bin/python" -c "import torchrec, fbgemm_gpu, torch; print(f'setup: torch {torch.__version__}, torchrec {torchrec.__version__}', flush=True)" >&2
rm -f "$VENV"/.dlrm-setup-*
touch "$stamp"
