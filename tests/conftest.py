"""What every test file shares: one (dtype, atol, rtol) table, the canonical awkward shapes, and a
forward/backward comparison for autograd ops.

Dtypes a mode cannot run (bf16 in Triton's interpreter) are not left out of a parametrisation: they
are there and skipped with the reason, so a CPU run shows what it did not test.
"""

from __future__ import annotations

import pytest
import torch

from fusionlab import runtime
from fusionlab.grading import TOLERANCES

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

#: (rows, cols): each shape is there for the code path it reaches
SHAPES = [
    (1, 1),  # a single element: every mask is almost all off
    (1, 4097),  # one row, one past a power of two: the last column block holds one element
    (37, 129),  # neither dimension a multiple of any block
    (130, 7),  # more rows than a row block, narrow rows
    (257, 1000),  # several row blocks and column blocks, neither divides
    (64, 1024),  # tiles divide exactly: the unmasked (EVEN) path
]

gpu_only = pytest.mark.skipif(not runtime.is_gpu(), reason="needs a GPU Triton supports")


def assert_forward_backward(op, reference, inputs, *, atol: float, rtol: float, grad_out=None) -> None:
    """``op(*inputs)`` against ``reference(*inputs)``, forward and, for inputs that require grad, backward.

    ``reference`` runs on float64 copies (the truth), its outputs cast back for comparison; the same
    upstream gradient (random, fixed) flows into both. Tuple outputs are compared element by element.
    """
    ours_in = [t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs]
    ref_in = [
        t.detach().double().requires_grad_(t.requires_grad)
        if isinstance(t, torch.Tensor) and t.is_floating_point()
        else t
        for t in inputs
    ]
    ours, ref = op(*ours_in), reference(*ref_in)
    ours_t = ours if isinstance(ours, tuple) else (ours,)
    ref_t = ref if isinstance(ref, tuple) else (ref,)
    assert len(ours_t) == len(ref_t)
    for i, (o, r) in enumerate(zip(ours_t, ref_t, strict=True)):
        torch.testing.assert_close(o.double(), r.detach(), atol=atol, rtol=rtol, msg=lambda m, i=i: f"output {i}: {m}")
    needs = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not needs:
        return
    g = torch.Generator().manual_seed(0)
    grads = grad_out or [torch.randn(o.shape, generator=g).to(o.device) for o in ours_t]
    torch.autograd.backward([o for o in ours_t], [gr.to(o.dtype) for gr, o in zip(grads, ours_t, strict=True)])
    torch.autograd.backward([r for r in ref_t], [gr.double().to(r.device) for gr, r in zip(grads, ref_t, strict=True)])
    for i in needs:
        torch.testing.assert_close(
            ours_in[i].grad.double(), ref_in[i].grad, atol=atol, rtol=rtol, msg=lambda m, i=i: f"grad of input {i}: {m}"
        )
