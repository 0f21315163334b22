"""Tile sweep for the bias + GELU kernel at 1 GiB, beside torch.compile in the same run (GPU only).

python3 benchmarks/probes/tune.py            # prints a table per (dtype, form); full rows in $OUT/tune.json
"""

import json
import os

import torch
import torch.nn.functional as F

from fusionlab import bench
from fusionlab.kernels.bias_gelu import bias_gelu_ledger
from fusionlab.lessons.l2 import suite as lesson2

TILES = ((1, 1024), (2, 1024), (4, 1024), (1, 2048), (2, 2048), (1, 4096))
ceil = bench.ceilings()
print(f"copy {ceil.copy_GBps:.0f} GB/s")
rows = []
for dtype, forms in ((torch.float32, ("none",)), (torch.bfloat16, ("erf_fast", "tanh"))):
    m, n = lesson2.SHAPES[dtype]
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    nbytes = bias_gelu_ledger(m, n, dtype).fused_bytes
    for form in forms:
        approx = "tanh" if form == "tanh" else "none"
        comp = torch.compile(lambda x, b, a=approx: F.gelu(x + b, approximate=a))
        comp(x, b)
        res = bench.run([bench.Case(f"compiled {dtype} {approx}", lambda c=comp, x=x, b=b: c(x, b), nbytes)], ceil=ceil)
        res += bench.run(lesson2.tuning_cases(dtype, form, tiles=TILES, warps=(2, 4, 8)), ceil=ceil)
        best = min(res[1:], key=lambda r: r.ms)
        print(
            f"\n[{dtype} {form}] compiled {res[0].ms:.4f} ms ({100 * res[0].frac_copy:.1f}%), "
            f"best {best.name} {best.ms:.4f} ms ({100 * best.frac_copy:.1f}%), "
            f"compiled/best {res[0].ms / best.ms:.3f}"
        )
        print(bench.table(res, baseline=res[0].name))
        rows += [r.__dict__ for r in res]
        del comp
        torch._dynamo.reset()
    del x, b
    torch.cuda.empty_cache()
out = os.environ.get("OUT")
if out:
    with open(os.path.join(out, "tune.json"), "w") as f:
        json.dump(rows, f, indent=1)
