"""dlrm/models/onednn.py: torch's private oneDNN linear still computes x w^T + b at every stride we
pass it (the test that catches a torch release changing it), and auto's choice per CPU."""

import platform

import pytest
import torch

from dlrm.common.errors import UserError
from dlrm.models import onednn


def test_this_torch_has_it_on_x86():
    """The pinned CPU torch is built with oneDNN on x86: auto can choose it there."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"oneDNN's presence is only promised on x86 (this is {platform.machine()})")
    assert onednn.available()


def _exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() @ b.double()).float()


@pytest.mark.parametrize("bias", [False, True])
def test_linear_equals_the_float64_product(bias):
    torch.manual_seed(0)
    x, w, b = torch.randn(300, 37), torch.randn(53, 37), torch.randn(53)
    want = _exact(x, w.t()) + (b if bias else 0)
    got = onednn.linear(x, w, b if bias else None)
    assert got.shape == (300, 53) and got.dtype == torch.float32
    # fp32 sums of 37 products of N(0,1) values: errors ~1e-6 of |sum| ~6
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_linear_keeps_nan_and_inf():
    """A diverged layer's NaN and inf reach the loss, as through torch's products."""
    x, w = torch.ones(3, 4), torch.ones(2, 4)
    x[0, 0], x[1, 0] = float("nan"), float("inf")
    got = onednn.linear(x, w, None)
    assert got[0].isnan().all() and got[1].isposinf().all() and (got[2] == 4).all()


@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True), (True, True)])
def test_mm_takes_transposed_operands(a_t, b_t):
    """The MLP's backward passes x^T, g^T and w^T as strided views."""
    torch.manual_seed(1)
    a = torch.randn(29, 300).t() if a_t else torch.randn(300, 29)
    b = torch.randn(17, 29).t() if b_t else torch.randn(29, 17)
    torch.testing.assert_close(onednn.mm(a, b), _exact(a, b), rtol=1e-5, atol=1e-5)


AMD, INTEL = "AuthenticAMD", "GenuineIntel"


@pytest.mark.parametrize(
    "choice,capability,vendor,has,want",
    [
        ("auto", "AVX512", AMD, True, True),  # Zen 4/5: MKL would run AVX2
        ("auto", "AVX512", INTEL, True, False),  # MKL runs AVX-512 there
        ("auto", "AVX2", AMD, True, False),  # Zen 3: MKL was as fast
        ("auto", "AVX512", "", True, False),  # vendor unknown: torch's default
        ("auto", "AVX512", AMD, False, False),  # no oneDNN in this torch
        ("mkl", "AVX512", AMD, True, False),
        ("onednn", "AVX2", INTEL, True, True),
    ],
)
def test_choose_cpu_gemm(choice, capability, vendor, has, want):
    got, why = onednn.choose_cpu_gemm(choice, capability, vendor, has)
    assert got is want and why


def test_onednn_without_it_is_a_user_error():
    with pytest.raises(UserError, match=r"trainer.cpu_gemm=onednn.*use trainer.cpu_gemm=auto or mkl"):
        onednn.choose_cpu_gemm("onednn", "AVX512", AMD, has_onednn=False)


def test_cpu_vendor_reads_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n")
    assert onednn.cpu_vendor(info) == AMD
    assert onednn.cpu_vendor(tmp_path / "missing") == ""
