"""Lesson 8's FP8 forward on Hopper: what the FP8 tensor cores accumulate in, and an A/B of the kernel's options.

    PYTHONPATH=. python3 benchmarks/probes/probe_fp8_ab.py --out $OUT [--deadline 160] [--workers 14]

Part 1, the arithmetic (a few seconds): one ``tl.dot`` of e4m3 tiles (64 x K by K x 64, K = 32, 64, 128, one
``wgmma`` per 32 of K) with and without an fp32 accumulator C, with and without Triton's
``max_num_imprecise_acc``, against float64. Inputs spread over 16 binades (as P's entries are) or
normal-like (as Q and K are). For each case: the largest error in units of the bound
:func:`fusionlab.kernels.attention_fp8.mma_error_bound` derives from the published description of
Hopper's FP8 accumulation (the products aligned to the group's largest exponent and truncated, the sum
kept to 13 mantissa bits: DeepSeek-V3's report, section 3.5.2; SageAttention2, section 4) — at most 1
if the description holds — and which exact model (bits kept per product, bits kept by the sum, C in the
alignment or not) reproduces the most outputs bit for bit. C alone (A = B = 0): which bits of C survive.

Part 2, the speed (the rest): at head dim 128, N = 4k and 16k x 16 token-heads, causal and not: the
package's bf16 forward, then the FP8 kernel on quantised inputs at each tile of ``TILES`` with ``PIPE``
0 and 2 (the next block's Q K^T issued after this block's softmax, before its P V), and 1 (before the
softmax) at one tile; at
``EXP16_TILES`` with
``EXP16`` (P's exponentials in fp16, two an instruction), at ``PROMOTE_CASES`` with ``PROMOTE`` (P V's
partial sums added to the accumulator in fp32 every BLOCK_N keys), and (non-causal) at ``WIDE_TILES``. Each
output is checked finite and against float64 (norm-relative). Launches are compiled first in
``--workers`` processes. JSON: ``$OUT/probe_fp8_ab.json``; one line per row on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl

#: (BLOCK_M, BLOCK_N, num_warps, num_stages) at head dim 128: the table's, Triton's tutorial's kinds (8 warps
#: on 128 x 128, 4 on smaller), and 64-row tiles whose two score tiles fit the registers PIPE needs
TILES = [(128, 128, 4, 3), (128, 64, 4, 3), (64, 64, 4, 3), (64, 128, 4, 3), (128, 128, 8, 2)]
#: non-causal only: FlashAttention-3's FP8 shape, more keys a step than queries (two warpgroups of 64 rows
#: at 8 warps), PIPE off (two score tiles of 256 keys would not fit the registers)
WIDE_TILES = [(128, 256, 8, 2), (128, 256, 8, 3), (64, 256, 4, 2)]
#: the tiles also timed with EXP16 (P's exponentials two at a time in fp16), PIPE off and on
EXP16_TILES = [(128, 128, 4, 3), (64, 128, 4, 3), (128, 128, 8, 2)]
#: (tile, PIPE) also timed with PROMOTE = BLOCK_N
PROMOTE_CASES = [((128, 128, 4, 3), 0), ((128, 128, 4, 3), 2), ((64, 64, 4, 3), 0)]
NS = (4096, 16384)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, o_ptr, K: tl.constexpr, USE_C: tl.constexpr, PROMOTE: tl.constexpr):
    # one 64 x 64 tile: A (64, K), B (64, K) K-major as FP8 wgmma wants both, C and O (64, 64) fp32
    offs_m = tl.arange(0, 64)
    offs_k = tl.arange(0, K)
    a = tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :])
    b = tl.load(b_ptr + offs_m[:, None] * K + offs_k[None, :])
    c = tl.load(c_ptr + offs_m[:, None] * 64 + offs_m[None, :])
    if not USE_C:
        c = c * 0.0
    if PROMOTE > 0:
        o = tl.dot(a, tl.trans(b), c, max_num_imprecise_acc=PROMOTE)
    else:
        o = tl.dot(a, tl.trans(b), c)
    tl.store(o_ptr + offs_m[:, None] * 64 + offs_m[None, :], o)


def _e4m3(shape, spread, g):
    """Random e4m3 values: ``spread`` binades of exponent (P-like) or normal draws scaled to e4m3's range."""
    if spread:
        x = torch.exp2(torch.rand(shape, generator=g, device="cuda") * spread - spread / 2 + 2)
        x = x * torch.sign(torch.randn(shape, generator=g, device="cuda"))
    else:
        x = torch.randn(shape, generator=g, device="cuda") * 100
    return x.clamp(-448, 448).to(torch.float8_e4m3fn)


def _trunc(x, bits):
    """x toward zero to ``bits`` significant bits (float64)."""
    ax = x.abs()
    e = torch.floor(torch.log2(torch.where(ax > 0, ax, torch.ones_like(ax))))
    u = torch.exp2(e - (bits - 1))
    return torch.where(ax > 0, torch.sign(x) * torch.floor(ax / u) * u, x)


def _model(a, b, c, pbits, sbits, with_c, floor_products):
    """A candidate exact model of one wgmma chain: per group of 32 products, each product aligned to the
    largest exponent among them (and C's, if ``with_c``) keeping ``pbits`` bits down from it (floor: as
    a sign-filled right shift; else toward zero), their sum added to C and kept to ``sbits`` significant
    bits toward zero."""
    acc = c.clone()
    for g0 in range(0, a.shape[1], 32):
        pr = a[:, None, g0 : g0 + 32] * b[None, :, g0 : g0 + 32]
        mx = pr.abs().amax(-1)
        if with_c:
            mx = torch.maximum(mx, acc.abs())
        e = torch.floor(torch.log2(torch.where(mx > 0, mx, torch.ones_like(mx))))[..., None]
        u = torch.exp2(e - (pbits - 1))
        t = torch.floor(pr / u) * u if floor_products else torch.trunc(pr / u) * u
        cc = acc
        if with_c:
            u2 = u[..., 0]
            cc = torch.floor(acc / u2) * u2 if floor_products else torch.trunc(acc / u2) * u2
        acc = _trunc(cc + t.sum(-1), sbits)
    return acc


def arithmetic(log):
    from fusionlab.kernels.attention_fp8 import mma_error_bound

    g = torch.Generator(device="cuda").manual_seed(0)
    for K in (32, 64, 128):
        for spread in (16, 0):
            for use_c in (False, True):
                for promote in (0, 32):
                    if promote and K == 32:
                        continue
                    a8, b8 = _e4m3((64, K), spread, g), _e4m3((64, K), spread, g)
                    a, b = a8.double(), b8.double()
                    exact0 = a @ b.T
                    c = (torch.randn(64, 64, generator=g, device="cuda") * exact0.abs().mean().float()).float()
                    c = c if use_c else torch.zeros_like(c)
                    o = torch.empty(64, 64, device="cuda")
                    _dot_kernel[(1,)](a8, b8, c, o, K=K, USE_C=use_c, PROMOTE=promote, num_warps=4)
                    exact = exact0 + c.double()
                    err = o.double() - exact
                    bound = mma_error_bound(a, b.T, c.double(), promote=promote)
                    row = {"kind": "dot", "K": K, "spread": spread, "use_c": use_c, "promote": promote,
                           "exact_frac": float((err == 0).float().mean()),
                           "max_err_in_bounds": float((err.abs() / bound.clamp_min(1e-300)).max()),
                           "violations": int((err.abs() > bound).sum()),
                           "mean_err_over_bound": float((err / bound.clamp_min(1e-300)).mean()),
                           "rel_err": float(err.norm() / exact.norm())}  # fmt: skip
                    if not promote:
                        fits = {}
                        for pb in (12, 13, 14, 15, 16, 24):
                            for sb in (13, 14, 24):
                                for wc in (False, True):
                                    for fl in (True, False):
                                        m = _model(a, b, c.double(), pb, sb, wc, fl)
                                        fits[f"p{pb}-s{sb}-{'c' if wc else 'nc'}-{'floor' if fl else 'trunc'}"] = float(
                                            (m == o.double()).float().mean()
                                        )
                        best = sorted(fits.items(), key=lambda kv: -kv[1])[:4]
                        row["best_models"] = best
                    log(row)
    # C alone: which of C's bits a wgmma keeps
    c = torch.randn(64, 64, generator=g, device="cuda") * 1000
    z = torch.zeros(64, 32, device="cuda").to(torch.float8_e4m3fn)
    o = torch.empty(64, 64, device="cuda")
    _dot_kernel[(1,)](z, z, c, o, K=32, USE_C=True, PROMOTE=0, num_warps=4)
    kept = {bits: float((o.double() == _trunc(c.double(), bits)).float().mean()) for bits in (12, 13, 14, 15, 24)}
    log({"kind": "c_only", "same_as_c": float((o == c).float().mean()), "equal_to_c_truncated_to_bits": kept})


def _cfg(tile, pipe, promote, exp16=False):
    bm, bn, nw, ns = tile
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "num_stages": ns, "PIPE": pipe, "PROMOTE": promote,
            "EXP16": exp16}  # fmt: skip


def _cases():
    """(causal, tile, PIPE, PROMOTE, EXP16) of every timed variant."""
    out = []
    for causal in (False, True):
        out += [(causal, t, pipe, 0, False) for t in TILES for pipe in (0, 2)] + [(causal, TILES[3], 1, 0, False)]
        out += [(causal, t, pipe, 0, True) for t in EXP16_TILES for pipe in (0, 2)]
        out += [(causal, t, pipe, t[1], False) for t, pipe in PROMOTE_CASES]
        if not causal:
            out += [(causal, t, 0, 0, False) for t in WIDE_TILES]
    # causal: a query tile's diagonal must start a key block (BLOCK_M a multiple of BLOCK_N)
    return [c for c in out if not (c[0] and c[1][0] % c[1][1])]


def _compile_worker(tasks):
    from fusionlab.kernels.attention_fp8 import attention_fp8_quantized, quantize_fp8

    failed = []
    for causal, tile, pipe, promote, exp16 in tasks:
        try:
            q, k, v = (torch.randn(1, 2, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            cfg = _cfg(tile, pipe, promote, exp16)
            attention_fp8_quantized(quantize_fp8(q, k, v, tile[0], tile[1]), causal, config=cfg)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (a variant that does not build is a result)
            failed.append([causal, list(tile), pipe, promote, exp16, f"{type(e).__name__}: {e}"[:200]])
    return failed


def speed(log, a, t0):
    from fusionlab.kernels._attention import scores64
    from fusionlab.kernels.attention import attention, attention_flops
    from fusionlab.kernels.attention_fp8 import attention_fp8_quantized, quantize_fp8

    cases = _cases()
    if a.workers:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(a.workers) as pool:
            failed = [f for part in pool.map(_compile_worker, [cases[i :: a.workers] for i in range(a.workers)])
                      for f in part]  # fmt: skip
        log({"kind": "compiled", "cases": len(cases), "seconds": time.time() - t0, "failed": failed})

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")

    for n in NS:
        B, H, d = max(1, 16384 // n), 16, 128
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        # float64 reference on one head's first 512 queries (the check, not the timing)
        ref = {}
        for causal in (False, True):
            s, _, vd = scores64(q[:1, :1, :512], k[:1, :1], v[:1, :1], causal, None)
            ref[causal] = torch.softmax(s, -1) @ vd
        for causal in (False, True):
            flops = attention_flops(B, H, n, n, d, causal)
            bf = bench(lambda q=q, k=k, v=v, c=causal: attention(q, k, v, c))
            log({"kind": "bf16", "n": n, "causal": causal, "ms": bf, "tflops": flops / bf * 1e-9})
            for c_, tile, pipe, promote, exp16 in cases:
                if c_ != causal or time.time() - t0 > a.deadline:
                    continue
                row = {"kind": "fp8", "n": n, "causal": causal, "tile": list(tile), "pipe": pipe, "promote": promote,
                       "exp16": exp16}  # fmt: skip
                try:
                    cfg = _cfg(tile, pipe, promote, exp16)
                    x = quantize_fp8(q, k, v, tile[0], tile[1])
                    o, _ = attention_fp8_quantized(x, causal, config=cfg)
                    r = ref[causal]
                    err = float((o[:1, :1, :512].double() - r).norm() / r.norm())
                    ms = bench(lambda x=x, cfg=cfg, c=causal: attention_fp8_quantized(x, c, config=cfg))
                    row.update(ms=ms, tflops=flops / ms * 1e-9, vs_bf16=bf / ms, err=err,
                               finite=bool(torch.isfinite(o).all()))  # fmt: skip
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {e}"[:200]
                log(row)
        del q, k, v
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--deadline", type=float, default=160.0, help="seconds after which no new timing starts")
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--only", choices=("arithmetic", "speed"), default=None)
    a = ap.parse_args()
    t0 = time.time()
    rows = [{"kind": "device", "name": torch.cuda.get_device_name(), "torch": torch.__version__,
             "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")}]  # fmt: skip
    path = os.path.join(a.out, "probe_fp8_ab.json")

    def log(row):
        rows.append(row)
        print(json.dumps(row)[:300], flush=True)
        os.makedirs(a.out, exist_ok=True)
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)

    if a.only != "speed":
        try:
            arithmetic(log)
        except Exception as e:  # noqa: BLE001  (the speed half still runs)
            log({"kind": "arithmetic_error", "error": f"{type(e).__name__}: {e}"[:400]})
    if a.only != "arithmetic":
        speed(log, a, t0)
    print("wrote", path, f"in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
