#!/usr/bin/env bash
# A venv with the GPU image's stack, to test this tree against it on CPU (tests/test_versions.py):
# Python 3.12, torch 2.11.0 (PyPI's build, CUDA 13: it runs on CPU), torchrec 1.6.1, fbgemm-gpu-cpu
# 1.6.0 (the image's fbgemm-gpu 1.6.0 with CPU kernels: the CUDA package links the driver's
# libnvidia-ml.so.1, which a machine without a GPU lacks), torchmetrics 1.0.3 (torchrec's pin) and
# tensordict 0.15.3 (dev/gpu_bundle.py's versions), plus this project's other needs.
#   bash dev/device_venv.sh            -> /work/venv-device, or DLRM_DEVICE_VENV
#   DLRM_DEVICE_VENV  where the venv lives
#   PYTHON            interpreter for a new venv (default python3.12)
# The project is not installed into it (its pyproject.toml pins torch 2.13 and Python 3.11): run it with
# PYTHONPATH=<this repository>, as dev/gpu_install.sh does on the GPU machine. Needs PyPI (or a mirror):
# about 3 GB of torch and nvidia-* wheels, a few minutes. Idempotent: instant once done.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${DLRM_DEVICE_VENV:-/work/venv-device}
PY=${PYTHON:-python3.12}
PINS=(torch==2.11.0 fbgemm-gpu-cpu==1.6.0 torchmetrics==1.0.3 tensordict==0.15.3)
OTHERS=(tqdm pyre-extensions iopath "hydra-core>=1.3,<1.4" "numpy>=2,<3" "matplotlib>=3.8" "tensorboard>=2.14"
  "pyarrow==26.0.1" "pytest>=8")
TORCHREC=torchrec==1.6.1
stamp="$VENV/.dlrm-device-$(sha1sum <dev/device_venv.sh | cut -c1-12)"
[ -f "$stamp" ] && exit 0

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1 ||
    { echo "error: $PY is not a working Python 3.12 to create $VENV with: pass PYTHON=/path/to/python3.12" >&2; exit 2; }
  echo "device_venv: creating $VENV with $("$PY" --version 2>&1)" >&2
  "$PY" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
printf '%s\n' "${PINS[@]}" >"$constraints"  # no later install may move torch or the pinned packages
"${pip[@]}" install -c "$constraints" "${PINS[@]}" "${OTHERS[@]}"
"${pip[@]}" install --no-deps "$TORCHREC"  # its metadata asks for the CUDA fbgemm-gpu
"$VENV/bin/python" - <<'EOF' >&2
import importlib.metadata as m, sys
want = {"torch": "2.11.0", "torchrec": "1.6.1", "fbgemm-gpu-cpu": "1.6.0"}
got = {k: m.version(k).split("+")[0] for k in want}
print(f"device_venv: python {sys.version.split()[0]}, {got}")
sys.exit(None if got == want else f"device_venv: wanted {want}, got {got}")
EOF
rm -f "$VENV"/.dlrm-device-*
touch "$stamp"
