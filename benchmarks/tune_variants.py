"""One-off: erf forms (A&S 7.1.26 vs 7.1.28) and eviction hints for bias + GELU, beside compile (GPU)."""

import torch
import torch.nn.functional as F
import triton

from fusionlab import bench
from fusionlab.kernels import bias_gelu as _bg  # noqa: F401
import importlib

bg = importlib.import_module("fusionlab.kernels.bias_gelu")
from fusionlab.suites import lesson2  # noqa: E402

ceil = bench.ceilings()
for dtype in (torch.float32, torch.bfloat16):
    m, n = lesson2.SHAPES[dtype]
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    y = torch.empty_like(x)
    nbytes = lesson2.bias_gelu_ledger(m, n, dtype).fused_bytes
    comp = torch.compile(lambda x, b: F.gelu(x + b))
    comp(x, b)
    cases = [bench.Case("compiled erf", lambda: comp(x, b), nbytes)]
    for approx, name in ((0, "erf"), (1, "tanh"), (2, "as7126"), (3, "as7128")):
        for bm, bn, w in ((1, 1024, 2), (1, 1024, 4), (2, 1024, 2), (2, 1024, 4), (4, 1024, 4), (4, 1024, 8),
                          (1, 2048, 4)):
            for evict in (False,):
                def f(approx=approx, bm=bm, bn=bn, w=w, evict=evict):
                    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
                    bg._bias_gelu_kernel[grid](x, b, y, m, n, n, n, BLOCK_M=bm, BLOCK_N=bn, APPROX=approx,
                                               num_warps=w)
                f()
                cases.append(bench.Case(f"{str(dtype)[6:]} {name} {bm}x{bn} w{w} evict={int(evict)}", f, nbytes))
    res = bench.run(cases, ceil=ceil)
    print(bench.table(sorted(res, key=lambda r: r.ms)[:24], baseline="compiled erf"))
    for name in ("erf", "tanh", "as7126", "as7128"):
        best = min((r for r in res if f" {name} " in r.name), key=lambda r: r.ms)
        print(f"BEST {str(dtype)[6:]} {name}: {best.name} {best.ms:.4f} ms {100 * best.frac_copy:.1f}% "
              f"compiled/best {res[0].ms / best.ms:.3f}")
    del x, y, comp
    torch._dynamo.reset()
    torch.cuda.empty_cache()
