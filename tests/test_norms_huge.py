"""Rows of huge finite values through every norm, forward and backward, against float64.

A row whose fp32 sum of squares overflows (values past ~1e19, one 1e38 among zeros, a row of 3e37)
has a finite answer; the kernels redo such a row's statistics on x / max|x| (kernels/_norms.py, huge
rows). Each case puts three such rows beside ordinary ones, in one block of rows, on the one-tile
path, the head-and-tail path and the two-pass path; ordinary rows keep their own answer.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusionlab import runtime
from fusionlab.kernels.dropout_norm import dropout_keep_reference, dropout_norm
from fusionlab.kernels.layernorm import layernorm
from fusionlab.kernels.rmsnorm import rmsnorm
from fusionlab.kernels.rmsnorm_linear import rmsnorm_rstd

pytestmark = [
    pytest.mark.lesson4,
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # the interpreter's numpy: squares past fp32
]
DEV = runtime.DEVICE
#: (dtype, tolerance of each row's error relative to its largest value); fp16 cannot hold these values
DTYPES = [pytest.param(torch.float32, 2e-5, id="float32")] + [
    pytest.param(
        torch.bfloat16,
        3e-2,
        id="bfloat16",
        marks=pytest.mark.skipif(torch.bfloat16 not in runtime.DTYPES, reason=f"no bf16 in {runtime.MODE} mode"),
    )
]
#: (row width, configuration): the one-tile path, a head and a tail (2500: 2048 + 512 in the
#: interpreter), the two-pass path
PATHS = [(48, None), (2500, None), (100, {"BLOCK_N": 16})]
ids = ["one-tile", "head-tail", "two-pass"]


def _huge(n: int, dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, n, generator=g)
    x[0] *= 1e30  # every square past fp32
    x[1] = 0.0
    x[1, 3] = 1e38  # one 1e38 among zeros: the answer is O(1)
    x[2] = 3e37 * torch.rand(n, generator=g)  # all large and of one sign: the sum overflows too
    return x.to(dtype).to(DEV)


def _randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEV)


def _close(got, want, tol, what):
    """Each row's (a 1-D tensor's) largest error, relative to its largest reference value."""
    got, want = got.double(), want.double()
    assert torch.isfinite(got).all(), f"{what}: {int((~torch.isfinite(got)).sum())} elements not finite"
    err = (got - want).abs().amax(-1) / want.abs().amax(-1).clamp_min(1e-300)
    assert (err <= tol).all(), f"{what}: relative error per row {err.tolist()}"


def _grads(fn, inputs, grads):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    torch.autograd.backward(outs, grads[: len(outs)])
    return [o.detach() for o in outs], [t.grad for t in leaves]


def _check(fn, ref64, inputs, dtype, tol, seed=1):
    n = inputs[0].shape[-1]
    grads = [_randn(6, n, dtype=dtype, seed=seed + i) for i in range(2)]
    outs, dins = _grads(fn, inputs, grads)
    outs64, dins64 = _grads(ref64, [t.double() for t in inputs], [gr.double() for gr in grads])
    for i, (o, o64) in enumerate(zip(outs, outs64, strict=True)):
        _close(o, o64, tol, f"output {i}")
    for i, (d, d64) in enumerate(zip(dins, dins64, strict=True)):
        _close(d, d64, tol, f"gradient of input {i}")


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("n,cfg", PATHS, ids=ids)
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "plain"])
def test_rmsnorm_huge_rows(n, cfg, residual, dtype, tol):
    x, w, r = _huge(n, dtype), _randn(n, dtype=dtype, seed=7), _randn(6, n, dtype=dtype, seed=8)

    def ref64(x, w, r=None):
        h = x if r is None else x + r
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return y if r is None else (y, h)

    def fused(x, w, r=None):
        return rmsnorm(x, w, 1e-6, r, fwd_config=cfg, bwd_config=cfg)

    _check(fused, ref64, [r, w, x] if residual else [x, w], dtype, tol)  # residual: the huge rows in r


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("n,cfg", PATHS, ids=ids)
def test_layernorm_huge_rows(n, cfg, dtype, tol):
    x, w, b = _huge(n, dtype), _randn(n, dtype=dtype, seed=7), _randn(n, dtype=dtype, seed=8)
    fused = lambda x, w, b: layernorm(x, w, b, 1e-5, fwd_config=cfg, bwd_config=cfg)  # noqa: E731
    _check(fused, lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5), [x, w, b], dtype, tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("n,cfg", [(48, None), (100, {"BLOCK_N": 16})], ids=["one-tile", "wide"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_dropout_norm_huge_rows(norm, n, cfg, dtype, tol):
    p, seed = 0.25, 11
    r, x, w = _huge(n, dtype), _randn(6, n, dtype=dtype, seed=9), _randn(n, dtype=dtype, seed=7)
    keep = dropout_keep_reference((6, n), p, seed).to(DEV)

    def ref64(x, r, w):
        h = r + torch.where(keep, x / (1 - p), 0.0)
        if norm == "rmsnorm":
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w, h
        return F.layer_norm(h, (n,), w, None, 1e-5), h

    def fused(x, r, w):
        return dropout_norm(x, r, w, None, p, norm=norm, seed=seed, fwd_config=cfg, bwd_config=cfg)

    _check(fused, ref64, [x, r, w], dtype, tol)


@pytest.mark.parametrize("n", [48, 5000])
def test_rmsnorm_rstd_huge_rows(n):
    x = _huge(n, torch.float32)
    want = torch.rsqrt(x.double().pow(2).mean(-1) + 1e-6)
    got = rmsnorm_rstd(x)
    assert torch.isfinite(got).all() and torch.allclose(got.double(), want, rtol=2e-6, atol=0), (got, want)
