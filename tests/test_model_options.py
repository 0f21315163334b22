"""Lesson 9's layer: the schedule options :mod:`fusionlab.model` keeps for the GPU's A/B probes
(``benchmarks/probes/probe_layer_parts.py``) give the default's numbers."""

from __future__ import annotations

import pytest
import torch

from fusionlab import model, runtime
from fusionlab.model import LlamaLayer

DEV = runtime.DEVICE
DTYPE = torch.bfloat16 if runtime.is_gpu() else torch.float32
CFG = dict(hidden=64, n_heads=4, n_kv_heads=2, ffn=96, max_positions=64)


def _grads(lay, x, offset=0):
    xg = x.clone().requires_grad_()
    y = lay(xg, offset)
    (y.float() * torch.linspace(-1, 1, y.shape[-1], device=y.device)).sum().backward()
    out = [y.detach(), xg.grad, *(p.grad for p in lay.parameters())]
    lay.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize(
    "option,value",
    [
        ("KEEP_SWIGLU_OUTPUT", not model.KEEP_SWIGLU_OUTPUT),
        ("ATTENTION_HEAD_MAJOR", True),
        ("ATTENTION_HEAD_MAJOR", False),
        ("FOLD_NORMS", not model.FOLD_NORMS),
    ],
    ids=["h kept or not", "head-major always", "head-major never", "folded norms or not"],
)
def test_an_option_gives_the_defaults_output_and_gradients(monkeypatch, option, value):
    torch.manual_seed(3)
    lay = LlamaLayer(**CFG).to(DEV, DTYPE)
    x = torch.randn(2, 9, 64, device=DEV, dtype=DTYPE)
    want = _grads(lay, x, 3)
    monkeypatch.setattr(model, option, value)
    got = _grads(lay, x, 3)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6 if DTYPE == torch.float32 else 1e-2, rtol=1e-5)
    tol = 1e-5 if DTYPE == torch.float32 else 2e-2
    with torch.no_grad():  # the forward without autograd takes its own path
        torch.testing.assert_close(lay(x, 3), want[0], atol=tol, rtol=tol)
    if option == "FOLD_NORMS" and value:  # a weight written in place is folded again
        with torch.no_grad():
            lay.w_gate_up.mul_(0.5)
        again = _grads(lay, x, 3)[0]
        with torch.no_grad():
            torch.testing.assert_close(lay(x, 3), again, atol=tol, rtol=tol)
