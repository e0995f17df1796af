#!/usr/bin/env bash
# Create or update the virtual environment with the pinned stack (idempotent: instant when done).
#   DLRM_VENV   where the venv lives (default: .venv in the repository)
#   DLRM_ACCEL  cpu | cuda | rocm (default: cuda if nvidia-smi works, else cpu): which torch and fbgemm-gpu build.
#               rocm (AMD Instinct): torch and fbgemm-gpu ROCm builds from PyTorch's wheel index DLRM_ROCM_INDEX
#               (default https://download.pytorch.org/whl/rocm7.1; use the ROCm version FBGEMM's release table
#               lists for fbgemm-gpu 1.8.0). The ROCm torch answers to device 'cuda' and runs RCCL as 'nccl',
#               so the cuda topologies and launchers apply (the launchers take DLRM_ACCEL=rocm as cuda).
#   PYTHON      interpreter for a new venv (default: python3.11)
#   DLRM_INSTALLER  uv (default: uv from pip's indexes installs the packages, with pip's settings) | pip
# On a CPU machine it installs the CPU build of torch: from the configured pip indexes when they offer
# one (a local mirror, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu), else from PyTorch's
# CPU wheel index by itself (PyPI's Linux torch wheel is the CUDA build); it says which (launch/torch_wheel.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${DLRM_VENV:-.venv}
TORCH=2.13.0
TORCHREC=1.8.0
UV=0.13.9
if [ -z "${DLRM_ACCEL:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DLRM_ACCEL=cuda; else DLRM_ACCEL=cpu; fi
fi
case "$DLRM_ACCEL" in
  cpu|cuda|rocm) ;;
  *) echo "error: DLRM_ACCEL=$DLRM_ACCEL is not cpu, cuda or rocm; unset it to detect, or set DLRM_ACCEL=cpu|cuda|rocm" >&2; exit 2 ;;
esac
stamp="$VENV/.dlrm-setup-$DLRM_ACCEL-$(cat pyproject.toml launch/setup.sh launch/torch_wheel.py launch/uv_env.py | sha1sum | cut -c1-12)"
[ -f "$stamp" ] && exit 0

echo "setup: $DLRM_ACCEL environment in $VENV (one-time, about a minute)" >&2
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3.11}" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# Packages install through uv, with pip's settings (launch/uv_env.py): parallel downloads and byte
# compiling, about 60 s instead of 100 s on 2 cores. pip installs instead with DLRM_INSTALLER=pip, when
# pip holds a setting uv cannot take, or where uv fails (and always for the ROCm builds below).
uv=()
if [ "${DLRM_INSTALLER:-uv}" = uv ] && uv_env=$("$VENV/bin/python" -m pip config list | "$VENV/bin/python" launch/uv_env.py); then
  if "${pip[@]}" install "uv==$UV" 2>/dev/null; then
    mapfile -t uv_env < <(printf '%s' "$uv_env")
    uv=(env "${uv_env[@]}" UV_INDEX_STRATEGY=unsafe-best-match UV_COMPILE_BYTECODE=1
        "$VENV/bin/python" -m uv pip install -q --python "$VENV/bin/python")
  else
    echo "setup: pip could not install uv==$UV; installing with pip" >&2
  fi
fi
install() {  # pip install "$@": through uv when set up, with pip where uv fails
  if [ ${#uv[@]} -gt 0 ]; then
    "${uv[@]}" "$@" && return 0
    echo "setup: uv could not install $*; trying pip" >&2
  fi
  "${pip[@]}" install "$@"
}

if [ "$DLRM_ACCEL" = cpu ] && ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '$TORCH+cpu')" 2>/dev/null; then
  # Resolve torch from the configured indexes without installing it; take the CPU build from there if
  # they offer it, else from PyTorch's CPU wheel index. The chosen pip arguments come one per line.
  report=$("${pip[@]}" install --dry-run --ignore-installed --no-deps --report - "torch==$TORCH" 2>/dev/null || true)
  mapfile -t torch_args < <(printf '%s' "$report" | "$VENV/bin/python" launch/torch_wheel.py "$TORCH")
  if ! install "${torch_args[@]}"; then
    echo "setup: could not install the CPU build of torch $TORCH (pip install ${torch_args[*]})." >&2
    echo "setup: make pip reach PyTorch's CPU wheel index (https://download.pytorch.org/whl/cpu) or a mirror of it" >&2
    echo "setup: (PIP_EXTRA_INDEX_URL or PIP_FIND_LINKS), then run launch/setup.sh again." >&2
    exit 1
  fi
fi
extras="$DLRM_ACCEL,test"
if [ "$DLRM_ACCEL" = rocm ]; then  # torch and fbgemm-gpu from the ROCm index first (same names, +rocm builds)
  index=${DLRM_ROCM_INDEX:-https://download.pytorch.org/whl/rocm7.1}
  "${pip[@]}" install --index-url "$index" "torch==$TORCH" "fbgemm-gpu==1.8.0" ||
    { echo "setup: no torch $TORCH / fbgemm-gpu 1.8.0 ROCm build at $index; set DLRM_ROCM_INDEX to PyTorch's ROCm wheel index for them" >&2; exit 1; }
  "$VENV/bin/python" -c "import sys, torch; sys.exit(None if torch.version.hip else 'setup: torch ' + torch.__version__ + ' from $index is not a ROCm build; fix DLRM_ROCM_INDEX')"
  extras="test"
fi
pin=()  # on cpu, the CPU build stays: a plain torch==X lets an installer take another index's CUDA build
[ "$DLRM_ACCEL" = cpu ] && pin=("torch==$TORCH+cpu")
install -e ".[$extras]" "${pin[@]}"
install --no-deps "torchrec==$TORCHREC"
# The versions; on cpu, exit status 3 if a CUDA torch slipped in.
check=0
"$VENV/bin/python" -c "import sys, torch, torchrec, fbgemm_gpu; print(f'setup: torch {torch.__version__}, torchrec {torchrec.__version__}', file=sys.stderr); sys.exit(3 if '$DLRM_ACCEL' == 'cpu' and torch.version.cuda else 0)" || check=$?
if [ "$check" -eq 3 ]; then
  echo "setup: the installed torch is a CUDA build on a CPU machine; rerun with DLRM_INSTALLER=pip, or DLRM_ACCEL=cuda if this machine has a GPU" >&2
  exit 1
fi
[ "$check" -eq 0 ] || exit "$check"
rm -f "$VENV"/.dlrm-setup-*
touch "$stamp"
