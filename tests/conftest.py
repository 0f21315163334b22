"""What every test file shares: one (dtype, atol, rtol) table, the GPU-only mark and the ncu skip, a norm-relative
comparison for matmul-like outputs, and cross-entropy written out by hand.

Dtypes a mode cannot run (bf16 in Triton's interpreter) are not left out of a parametrisation: they
are there and skipped with the reason, so a CPU run shows what it did not test.
"""

from __future__ import annotations

import pytest
import torch

from fusionlab import runtime
from fusionlab.grading import TOLERANCES
from fusionlab.measure import ncu

#: (dtype, atol, rtol), the grading table's tolerances, for parametrize
DTYPES = [
    pytest.param(
        d,
        *TOLERANCES[d],
        id=str(d).replace("torch.", ""),
        marks=pytest.mark.skipif(d not in runtime.DTYPES, reason=f"{d} is not supported in {runtime.MODE} mode"),
    )
    for d in (torch.float32, torch.float16, torch.bfloat16)
]

gpu_only = pytest.mark.skipif(not runtime.is_gpu(), reason="needs a GPU Triton supports")


def ncu_or_skip(*, triton_gpu: bool = False):
    """Skip the calling test unless this machine has a CUDA GPU (one Triton supports, with ``triton_gpu``:
    the package's own kernels are profiled) and Nsight Compute that may read the counters."""
    if not (runtime.is_gpu() if triton_gpu else torch.cuda.is_available()):
        pytest.skip(
            "needs a GPU Triton supports, and ncu" if triton_gpu else "needs a CUDA GPU and Nsight Compute (ncu)"
        )
    try:
        ncu.find_ncu()
    except ncu.NcuUnavailable as e:
        pytest.skip(str(e).split(".")[0])


def assert_close_rel(y, ref, norm_tol, elem_tol):
    """Norm-relative error <= norm_tol, and no element off by more than elem_tol x max |ref| (for
    matmul-like outputs, whose elements' errors scale with the row, not with each element)."""
    assert y.shape == ref.shape and y.dtype == ref.dtype and y.device == ref.device
    yd, rd = y.double(), ref.double()
    assert not torch.isnan(yd).any(), f"{int(torch.isnan(yd).sum())} elements NaN (never written?)"
    scale = rd.abs().max().clamp_min(1e-30)
    err = ((yd - rd).norm() / rd.norm().clamp_min(1e-30)).item()
    worst = ((yd - rd).abs().max() / scale).item()
    assert err <= norm_tol and worst <= elem_tol, f"relative error {err:.2e} (norm), {worst:.2e} (max element)"


def cross_entropy_by_hand(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Cross-entropy written out in float64 from its formula (logsumexp, the target's logit, the mean
    over the row for label smoothing), independent of ``F.cross_entropy``: what an eager baseline and
    a reference are checked against."""
    x = logits.double()
    keep = target != ignore_index
    safe = torch.where(keep, target, 0)
    lse = x.logsumexp(-1)
    loss = (1 - label_smoothing) * (lse - x.gather(1, safe[:, None])[:, 0]) + label_smoothing * (lse - x.mean(-1))
    loss = torch.where(keep, loss, 0.0)
    if reduction == "none":
        return loss
    return loss.sum() / keep.sum() if reduction == "mean" else loss.sum()


def refusal(fn) -> str:
    """The message of the KernelInputError ``fn()`` raises (a bad call's refusal, to compare with another's)."""
    from fusionlab.kernels import KernelInputError

    with pytest.raises(KernelInputError) as err:
        fn()
    return str(err.value)
