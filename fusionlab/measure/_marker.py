"""The marker kernel of :func:`fusionlab.measure.ncu.marker`: its own module, so that importing
``fusionlab.measure.ncu`` needs no Triton (it is optional) and the kernel is defined at module level, as
``@triton.jit`` wants."""

import triton
import triton.language as tl


@triton.jit
def _fusionlab_case_marker(p):
    tl.store(p, 1)
