"""Lesson 1's fused cos·cos at 1 GiB fp32: launch configurations, and a diagnostic (GPU only).

Is the fused kernel memory- or compute-bound? Two precise cosines cost a few dozen instructions per
element against a budget of ~30 at copy speed. The diagnostic kernel replaces the second cosine by
a short polynomial (its input is in [-1, 1]; not used by the course): if it runs much faster, the
arithmetic sets the time.
"""

import torch
import triton
import triton.language as tl

from fusionlab import bench
from fusionlab.kernels import cos as cosm


@triton.jit
def _cos_poly_kernel(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    c = tl.cos(tl.load(x_ptr + offs, mask=mask))
    u = c * c  # cos(c) for |c| <= 1: Taylor to u^6 (error < 1e-9)
    y = 1.0 + u * (-0.5 + u * (1 / 24 + u * (-1 / 720 + u * (1 / 40320 + u * (-1 / 3628800 + u / 479001600)))))
    tl.store(y_ptr + offs, y, mask=mask)


ceil = bench.ceilings()
n = 2**28
x = torch.randn(n, device="cuda")
y = torch.empty_like(x)
nbytes = 2 * n * 4
cases = [bench.Case("copy", lambda: y.copy_(x), nbytes), bench.Case("eager cos", lambda: torch.cos(x, out=y), nbytes)]
for block in (512, 1024, 2048, 4096):
    for w in (2, 4, 8):
        variants = ((cosm.COS, "cos"), (cosm.COS_COS_PRECISE, "cos_cos precise"), (cosm.COS_COS, "cos_cos poly"))
        for what, name in variants:

            def f(block=block, w=w, what=what):
                cosm._cos_kernel[(triton.cdiv(n, block),)](x, y, n, BLOCK_SIZE=block, WHAT=what, num_warps=w)

            f()
            cases.append(bench.Case(f"{name} {block} w{w}", f, nbytes))
poly = lambda: _cos_poly_kernel[(triton.cdiv(n, 4096),)](x, y, n, BLOCK_SIZE=4096, num_warps=8)
poly()
cases.append(bench.Case("diagnostic: cos then polynomial 4096 w8", poly, nbytes))
cases.append(bench.Case("package cos_cos (default)", lambda: cosm.cos_cos(x), nbytes))
res = bench.run(cases, ceil=ceil)
print(bench.table(res, baseline="eager cos"))
for prefix in ("cos ", "cos_cos precise", "cos_cos poly"):
    best = min((r for r in res if r.name.startswith(prefix)), key=lambda r: r.ms)
    print(
        f"BEST {best.name}: {best.ms:.4f} ms, {100 * best.frac_copy:.1f}% of copy, {best.ms / res[1].ms:.3f}x eager cos"
    )
