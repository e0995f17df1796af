# CUDA image of the DLRM trainer: PyTorch's own image, fbgemm-gpu, this package, then torchrec without deps.
#   docker build -t dlrm .                                     # CUDA 13.0: NVIDIA driver R580 or newer
#   docker build --build-arg CUDA_VERSION=12.8 -t dlrm:cu128 .  # CUDA 12.x drivers (R570+ for 12.8)
#   docker run --gpus all --ipc=host --ulimit memlock=-1 dlrm --standalone --nproc_per_node=8 -m dlrm.train topology=dgx_h100
# The pins must agree with pyproject.toml and launch/setup.sh (tests/launch/test_scripts.py checks them).
# torch 2.13.0 and fbgemm-gpu 1.8.0 from PyPI are both CUDA 13.0 builds (torch requires cuda-toolkit 13.0.3,
# fbgemm_gpu links libcudart.so.13), so the base image is PyTorch's CUDA 13.0 runtime image of the same torch.
# Another CUDA_VERSION (12.6, 12.8, 12.9: what PyTorch and FBGEMM publish builds for) takes PyTorch's image
# for that CUDA and fbgemm-gpu from PyTorch's wheel index for it (PYTORCH_INDEX/cu128 for 12.8). Not built
# here (no Docker engine, no access to download.pytorch.org): that the cu12x image tag and fbgemm-gpu
# build exist for these versions is PyTorch's and FBGEMM's release practice, not checked.
ARG TORCH_VERSION=2.13.0
ARG CUDA_VERSION=13.0
ARG BASE_IMAGE=pytorch/pytorch:${TORCH_VERSION}-cuda${CUDA_VERSION}-cudnn9-runtime
FROM ${BASE_IMAGE}

ARG TORCH_VERSION
ARG CUDA_VERSION
ARG PYTORCH_INDEX=https://download.pytorch.org/whl
ARG FBGEMM_GPU_VERSION=1.8.0
ARG TORCHREC_VERSION=1.8.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

# Refuse a base image whose Python or torch does not match (pyproject.toml requires Python 3.11, torch 2.13.0).
RUN python -c "import sys, torch; \
v = torch.__version__.split('+')[0]; c = torch.version.cuda or 'none'; \
ok = sys.version_info[:2] == (3, 11) and v == '${TORCH_VERSION}' and c.startswith('${CUDA_VERSION}'); \
print(f'base image: python {sys.version.split()[0]}, torch {torch.__version__}, cuda {c}'); \
sys.exit(0 if ok else 'base image must have python 3.11, torch ${TORCH_VERSION}, cuda ${CUDA_VERSION}: pass --build-arg BASE_IMAGE=...')"

# RDMA user space for NCCL's IB/RoCE transport (libibverbs + the verbs providers, e.g. mlx5): without them
# NCCL falls back to TCP sockets between nodes. The host's devices come in with
# `docker run --network=host --device=/dev/infiniband --cap-add=IPC_LOCK` (see docs/gpu.md). numactl: the
# launchers bind each rank to its GPU's NUMA node with torchrun's --numa-binding, which calls it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends rdma-core ibverbs-providers libibverbs1 numactl \
 && rm -rf /var/lib/apt/lists/*

# fbgemm-gpu first, the build of the base image's CUDA, pinned torch kept as is: PyPI's default wheel for
# CUDA 13.0, else the one on PyTorch's index for that CUDA (later installs find it satisfied and keep it).
RUN if [ "${CUDA_VERSION}" = 13.0 ]; then index=""; else index="${PYTORCH_INDEX}/cu$(echo "${CUDA_VERSION}" | tr -d .)"; fi \
 && if [ -z "$index" ]; then pip install "fbgemm-gpu==${FBGEMM_GPU_VERSION}" "torch==${TORCH_VERSION}"; \
    else pip install --no-deps --index-url "$index" "fbgemm-gpu==${FBGEMM_GPU_VERSION}"; fi

WORKDIR /opt/dlrm
# Dependencies change less often than the code: install from the project metadata first, for layer caching.
COPY pyproject.toml README.md ./
RUN mkdir -p dlrm && touch dlrm/__init__.py \
 && pip install -e ".[cuda]" "torch==${TORCH_VERSION}" "fbgemm-gpu==${FBGEMM_GPU_VERSION}"
COPY . .
# Editable install: Hydra finds conf/ next to the dlrm package, and launch/ scripts run from /opt/dlrm.
RUN pip install --no-deps -e . \
 && pip install --no-deps "torchrec==${TORCHREC_VERSION}" \
 && python -c "import importlib.metadata as m, sys; \
want = {'torch': '${TORCH_VERSION}', 'fbgemm-gpu': '${FBGEMM_GPU_VERSION}', 'torchrec': '${TORCHREC_VERSION}'}; \
got = {k: m.version(k).split('+')[0] for k in want}; print('installed:', got); \
sys.exit(0 if got == want else f'version mismatch: wanted {want}, got {got}')" \
 && if python -c "import ctypes; ctypes.CDLL('libnvidia-ml.so.1')" 2>/dev/null; then \
    python -c "import torch, fbgemm_gpu, torchrec; import dlrm.trainer.trainer; \
print('imports ok: torch', torch.__version__, 'fbgemm_gpu', fbgemm_gpu.__version__, 'torchrec', torchrec.__version__)"; \
    else echo "imports not checked: fbgemm_gpu links the driver's libnvidia-ml.so.1, which docker run --gpus brings"; fi

# torchrun is the entry point, as `python -m dlrm.torchrun` (torchrun, with a rank's user error as its one
# line and exit 2 instead of torchrun's failure summary): arguments are torchrun's, then -m dlrm.train and
# Hydra overrides. For the launch scripts instead: docker run --entrypoint launch/run_multinode.sh ... (see docs/gpu.md).
ENTRYPOINT ["python", "-m", "dlrm.torchrun"]
CMD ["--standalone", "--nproc_per_node=8", "-m", "dlrm.train", "topology=dgx_h100"]
