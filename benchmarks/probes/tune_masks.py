"""bias + GELU at 1 GiB with and without masks (tiles that divide the tensor), beside torch.compile.

Inductor's kernel for this shape has no masks at all (its size is baked in and divides its block);
ours masked every load and store. Run on a GPU: python3 benchmarks/probes/tune_masks.py
"""

import torch
import torch.nn.functional as F
import triton

from fusionlab import bench
from fusionlab.kernels import bias_gelu as bg
from fusionlab.lessons.l2 import suite as lesson2


def sweep(x, b, form, ceil):
    m, n = x.shape
    y = torch.empty_like(x)
    nbytes = bg.bias_gelu_ledger(m, n, x.dtype).fused_bytes
    approx = "tanh" if form == "tanh" else "none"
    comp = torch.compile(lambda x, b: F.gelu(x + b, approximate=approx))
    comp(x, b)
    cases = [bench.Case(f"compiled {approx}", lambda: comp(x, b), nbytes)]
    bm0 = bg.bias_gelu_config(m, n, x.dtype)["BLOCK_M"]
    for even in (False, True):
        for bm, w in ((bm0, 2), (bm0, 4), (2 * bm0, 4)):
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, 1024),)

            def f(grid=grid, bm=bm, w=w, even=even):
                bg._bias_gelu_kernel[grid](
                    x,
                    b,
                    y,
                    m,
                    n,
                    n,
                    n,
                    BLOCK_M=bm,
                    BLOCK_N=1024,
                    APPROX=bg.APPROXIMATIONS[form],
                    EVEN=even,
                    num_warps=w,
                )

            f()
            cases.append(bench.Case(f"{str(x.dtype)[6:]} {form} {bm}x1024 w{w} even={int(even)}", f, nbytes))
    cases.append(bench.Case("package launcher", lambda: bg.bias_gelu(x, b, form), nbytes))
    res = bench.run(cases, ceil=ceil)
    print(bench.table(res, baseline=res[0].name), flush=True)
    torch._dynamo.reset()


def main():
    ceil = bench.ceilings()
    for dtype, forms in ((torch.float32, ("none", "tanh")), (torch.bfloat16, ("erf_fast", "tanh"))):
        m, n = lesson2.SHAPES[dtype]
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype)
        for form in forms:
            sweep(x, b, form, ceil)
        del x, b
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
