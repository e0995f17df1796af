"""oneDNN's fp32 products on the CPU, for the MLP layers on CPUs where MKL's sgemm runs short of them.

torch's fp32 matmuls on x86 go to MKL, which runs its AVX-512 kernels on Intel CPUs only: on an AMD
CPU with AVX-512 (Zen 4, Zen 5) it runs its AVX2 ones. oneDNN picks its kernels from the CPU's
features; on a Zen 5 its fp32 products at the MLPs' shapes take 0.45x MKL's time
(docs/benchmark-results.md). The same sums in another order: fp32 rounding apart, the same results.

torch reaches oneDNN's fp32 product only through `torch.ops.mkldnn._linear_pointwise` (the op Inductor
emits for CPU linears), a private op: it is called here only, and tests/models/test_onednn.py fails if
a torch release changes it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dlrm.common.errors import UserError


def available() -> bool:
    """Whether this torch build has oneDNN and its fp32 linear op."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's vendor id (GenuineIntel, AuthenticAMD, ...); "" where the OS does not say."""
    try:
        with cpuinfo.open() as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def choose_cpu_gemm(choice: str, capability: str, vendor: str, has_onednn: bool) -> tuple[bool, str]:
    """(whether the MLPs' fp32 products go to oneDNN; the reason, for the log).

    Args:
        choice: trainer.cpu_gemm: auto, mkl or onednn.
        capability: torch's CPU capability (`torch.backends.cpu.get_cpu_capability()`: AVX2, AVX512, ...).
        vendor: `cpu_vendor()`.
        has_onednn: `available()`.

    Raises:
        UserError: onednn chosen on a torch without it.
    """
    if choice == "onednn":
        if not has_onednn:
            raise UserError(
                "trainer.cpu_gemm=onednn, but this torch has no oneDNN fp32 linear "
                "(torch.backends.mkldnn.is_available() is False); use trainer.cpu_gemm=auto or mkl"
            )
        return True, "trainer.cpu_gemm=onednn"
    if choice == "mkl":
        return False, "trainer.cpu_gemm=mkl"
    if has_onednn and capability == "AVX512" and vendor not in ("GenuineIntel", ""):
        return True, f"auto: AVX-512 on {vendor}, where MKL runs AVX2; trainer.cpu_gemm=mkl overrides"
    cpu = f"{capability or 'an unknown ISA'} on {vendor or 'an unknown vendor'}"
    return False, f"auto: {cpu}; trainer.cpu_gemm=onednn overrides"


def choose_for_this_cpu(choice: str) -> tuple[bool, str]:
    """`choose_cpu_gemm` for the CPU this process runs on."""
    return choose_cpu_gemm(choice, torch.backends.cpu.get_cpu_capability(), cpu_vendor(), available())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x weight^T + bias [B, out] of fp32 x [B, in], weight [out, in] (any strides) and bias [out] or None.

    No fused activation: oneDNN's fused ReLU maps NaN to 0, which would hide a diverged model from the
    trainer's non-finite checks (torch's ReLU keeps NaN).
    """
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a b [m, n] of fp32 a [m, k] and b [k, n] (any strides)."""
    return linear(a, b.t(), None)
