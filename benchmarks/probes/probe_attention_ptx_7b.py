"""Lesson 7b's proof that lesson 7's kernel did not move: the sm_90 PTX of the attention forward's default
launches, compiled from a CPU, one hash a launch, on two trees.

``attention(...)`` with no ``score_mod`` and no ``block_mask`` launches ``_attention_kernel`` with the
modification's constexprs at their defaults (None, False) and its new arguments absent (None: constexprs,
not parameters). This compiles the launches the lesson-7 suite makes (both load paths, causal or not, head
dims 64 and 128, short and long sequences: every row of ``TMA_TABLE`` they reach) for an sm_90 target and
prints ``sha256(ptx)  launch``. Run it on the tree before the change and after, and diff: equal hashes mean
the GPU runs the same code. ``--mods`` also compiles the modification path (softcap, ALiBi, each ready-made
mask) for sm_90, so a modification that only the GPU compiler refuses fails here, on a CPU.

    PYTHONPATH=/path/to/old/tree python benchmarks/probes/probe_attention_ptx_7b.py > old.txt
    PYTHONPATH=. python benchmarks/probes/probe_attention_ptx_7b.py > new.txt && diff old.txt new.txt
    PYTHONPATH=. python benchmarks/probes/probe_attention_ptx_7b.py --mods
"""

from __future__ import annotations

import hashlib
import sys
import warnings

import torch

torch.cuda.is_available = lambda: True  # before fusionlab decides its mode: the kernels are GPU kernels
torch.cuda.get_device_capability = lambda *a: (9, 0)
torch.cuda.get_device_name = lambda *a: "NVIDIA H100 (pretended)"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from fusionlab.kernels import attention as A  # noqa: E402

DT = {torch.bfloat16: "bf16", torch.float16: "fp16"}
#: (N, D, causal, variant): the suite's sizes, each TMA_TABLE class, and the pointer path
LAUNCHES = [(n, d, c, var) for n in (1024, 8192) for d in (64, 128) for c in (False, True) for var in ("tma", "plain")]


def _spec(n, d, causal, variant, dtype=torch.bfloat16, mods=None):
    shape = (2, 8, n, d)
    stride = (8 * n * d, n * d, d, 1)
    extra = () if mods is None else (mods.tiles,)  # the tree before lesson 7b has no such argument
    plan = A._plan(shape, stride, shape, stride, stride, dtype, causal, variant, (), *extra)
    t = DT[dtype]
    sig, consts = {}, {}
    ints = list(plan.ints[:3]) + [0.5] + list(plan.ints[3:])
    meta = dict(plan.meta, SCALE_NEG=False, **({} if mods is None else mods.kwargs))
    opts = {k: meta.pop(k) for k in ("num_warps", "num_stages") if k in meta}
    meta.pop("launch_pdl", None)
    for p in A._attention_kernel.params:
        name = p.name
        if p.is_constexpr:
            sig[name], consts[(p.num,)] = "constexpr", meta.get(name, p.default)
            continue
        if name in ("q_src", "k_src", "v_src"):
            if plan.descs is not None:
                block = plan.descs[("q_src", "k_src", "v_src").index(name)][2]
                sig[name] = f"tensordesc<{t}[{block[0]}, {block[1]}]>"
            else:
                sig[name] = f"*{t}"
        elif name == "o_ptr":
            sig[name] = f"*{t}"
        elif name == "o_desc":
            if plan.store is not None:
                sig[name] = f"tensordesc<{t}[{plan.store[2][0]}, {plan.store[2][1]}]>"
            else:
                sig[name] = f"*{t}"
        elif name == "lse_ptr":
            sig[name] = "*fp32"
        elif name in meta:  # a modification's argument
            v = meta[name]
            if v is None:
                sig[name], consts[(p.num,)] = "constexpr", None
            elif isinstance(v, torch.Tensor):
                sig[name] = "*i32" if v.dtype == torch.int32 else "*fp32"
            else:
                sig[name] = "fp32" if isinstance(v, float) else "i32"
        elif name.startswith(("mod_", "mask_", "bm_")):
            sig[name], consts[(p.num,)] = "constexpr", None
        else:
            v = ints.pop(0)
            sig[name] = "fp32" if isinstance(v, float) else "i32"
    for name in ("SCORE_MOD", "MASK_MOD"):
        if name in meta:
            p = next(p for p in A._attention_kernel.params if p.name == name)
            consts[(p.num,)] = meta[name]
    src = ASTSource(fn=A._attention_kernel, signature=sig, constexprs=consts)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]
    # what the GPU executes: the PTX less its source locations and debug sections
    code = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    body = "\n".join(ln for ln in code.splitlines() if not ln.lstrip().startswith((".file", ".loc", "//", "$L__tmp")))
    return hashlib.sha256(body.encode()).hexdigest()[:16], plan.meta


def main(argv):
    if "--mods" in argv:
        n, d = 1024, 64
        q = torch.empty(2, 8, n, d, dtype=torch.bfloat16)
        cases = [(A.softcap(30.0), None), (A.alibi(8), None), (None, A.causal_mask()), (None, A.sliding_window(256)),
                 (None, A.prefix_lm(100)), (None, A.document_mask(torch.arange(n) // 128))]  # fmt: skip
        for sm, mask in cases:
            bm = None if mask is None else A.block_mask(mask, None, None, n, n, device="cpu")
            mods = A._mods(q, q, False, sm, bm)
            h, _ = _spec(n, d, False, "tma", mods=mods)
            print(h, mods.names, flush=True)
        return
    for n, d, causal, variant in LAUNCHES:
        h, meta = _spec(n, d, causal, variant)
        print(h, f"N={n} D={d} causal={causal} {variant}", sorted(meta.items()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
