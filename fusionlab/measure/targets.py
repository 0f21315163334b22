"""Small targets for :func:`fusionlab.measure.ncu.profile`: each builds its inputs on the GPU and returns
the thunk to profile. Arguments arrive as strings (they cross a process boundary on ncu's command line).

    >>> ncu.profile("fusionlab.measure.targets:cos_cos_eager", str(2**28))
"""

from __future__ import annotations

import torch

from ..kernels import cos as _cos


def _x(numel: str) -> torch.Tensor:
    return torch.randn(int(numel), device="cuda")


def cos_cos_eager(numel: str):
    """Eager ``x.cos().cos()`` on ``numel`` fp32 elements: two kernels."""
    x = _x(numel)
    return lambda: _cos.cos_cos_eager(x)


def cos_cos_fused(numel: str):
    """The fused Triton ``cos_cos`` on ``numel`` fp32 elements: one kernel."""
    x = _x(numel)
    return lambda: _cos.cos_cos(x)


def nothing():
    """A thunk that launches no kernel: ncu profiles nothing, which :func:`fusionlab.measure.ncu.run_ncu`
    reports as an error (:class:`~fusionlab.measure.ncu.NcuNoKernels`), never as an empty list."""
    return lambda: None
