"""Lesson 8 on a GPU: the FlashAttention backward against SDPA's flash and cuDNN backends, in one call.

    PYTHONPATH=. python3 benchmarks/bench_attention_backward.py --out $OUT [--sweep] [--workers 12]
        [--ds 64,128] [--ns 1024,4096,16384] [--memory] [--deadline SECONDS]

First the correctness gate: small cases (causal and not, GQA, N not a multiple of any block, N_q != N_k,
both schedules) against float64 autograd; a failing case is printed and the run goes on (so the
numbers are still seen) with ``"correct": false`` in the JSON. Then, for each shape (head dims 64 and
128, N = 1k, 4k, 16k with B x H = (16384 / N) x 16: 16k x 16 token-heads, causal and not, bf16 and
fp16): SDPA's flash and cuDNN backends (forward, backward alone, forward + backward), eager (nanoGPT's
manual attention, N <= 4k) and the package's backward in both schedules, each gradient checked against
the flash backend's (norm-relative error). ``--sweep``: first, per (head dim, causal), every tile of
``SWEEP_DKDV`` (the dK/dV pass, dQ at its default) and ``SWEEP_DQ`` (the dQ pass, dK/dV at its
default) at bf16, and the rest of the run uses the fastest pair. ``--workers``: compile every launch in
that many processes first (Triton's on-disk cache is shared). ``--memory``: N = 131072, B = 1, H = 16,
D = 128, causal: forward + backward's extra memory. TFLOP/s: the backward counts 2.5x the forward's
FLOPs (:func:`fusionlab.kernels.attention_backward.attention_backward_flops`). Timings: do_bench
medians, L2 flushed. JSON: ``$OUT/attention_backward.json``; a table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import time
import traceback

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _t(bm1, bn1, w1, s1, bm2, bn2, w2, s2):
    return {"BLOCK_M1": bm1, "BLOCK_N1": bn1, "num_warps1": w1, "num_stages1": s1,
            "BLOCK_M2": bm2, "BLOCK_N2": bn2, "num_warps2": w2, "num_stages2": s2}  # fmt: skip


#: the dK/dV pass's tiles: (BLOCK_M1 queries streamed, BLOCK_N1 keys held, warps, stages)
SWEEP_DKDV = [(32, 128, 4, 3), (32, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3),
              (16, 128, 4, 4), (32, 128, 4, 2), (64, 128, 4, 2), (32, 64, 4, 2), (64, 64, 4, 2),
              (16, 64, 4, 3)]  # fmt: skip
#: the dQ pass's tiles: (BLOCK_M2 queries held, BLOCK_N2 keys streamed, warps, stages)
SWEEP_DQ = [(128, 32, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3), (128, 32, 8, 3),
            (128, 128, 8, 2), (64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 4, 2)]  # fmt: skip


#: --tma-sweep: tiles tried with TMA loads (each half against the chosen other half)
TMA_DKDV = [(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 3), (32, 128, 4, 3), (64, 64, 4, 2)]
TMA_DQ = [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2)]

#: the package's schedules, by name: (deterministic, config overrides on top of the chosen tiles, timed
#: forward + backward too). "det": the default; "atomic": dQ by pointer atomics; "+reduce": dQ by the copy
#: engine's reduce-add; "tma": Q/dO and K/V loads through tensor descriptors
VARIANTS = {
    "det": (True, {}, True),
    "atomic": (False, {}, False),
    "atomic+reduce": (False, {"TMA_REDUCE": True}, False),
    "tma": (True, {"TMA": True}, True),
    "tma+atomic+reduce": (False, {"TMA": True, "TMA_REDUCE": True}, True),
}


def qkv_do(n, d, dtype, seed=0, B=None, H=16):
    B = max(1, 16384 // n) if B is None else B
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, H, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(4)]


def rel_err(y, ref) -> float:
    y, ref = y.double(), ref.double()
    if not torch.isfinite(y).all():
        return float("inf")
    # floored at 1% of an O(1) gradient's norm: where the true gradient is 0 (one key: dS = 0) the error
    # is rounding, not a relative error
    return ((y - ref).norm() / ref.norm().clamp_min(1e-2 * ref.numel() ** 0.5)).item()


def _compile_worker(tasks):
    """Run each (d, causal, dname, n, det, cfg) once: fills Triton's cache for the timing process."""
    import fusionlab  # noqa: F401  (decides the mode before the kernels are defined)
    from fusionlab.kernels.attention import attention
    from fusionlab.kernels.attention_backward import attention_backward

    out = []
    for d, causal, dname, n, det, cfg in tasks:
        t0 = time.time()
        try:
            q, k, v, do = qkv_do(n, d, DTYPES[dname], B=1, H=2)
            o, lse = attention(q, k, v, causal)
            attention_backward(q, k, v, o, lse, do, causal, deterministic=det, config=cfg)
            torch.cuda.synchronize()
            out.append((d, causal, dname, n, det, json.dumps(cfg), time.time() - t0, None))
        except Exception as e:  # noqa: BLE001  (a tile that does not compile is a result)
            out.append((d, causal, dname, n, det, json.dumps(cfg), time.time() - t0, f"{type(e).__name__}: {e}"[:300]))
    return out


def precompile(tasks, workers):
    t0 = time.time()
    chunks = [tasks[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        done = [r for part in pool.map(_compile_worker, chunks) for r in part]
    fails = [r for r in done if r[-1]]
    print(f"compiled {len(done)} launches in {time.time() - t0:.0f} s, {len(fails)} failed", flush=True)
    for r in fails:
        print("  compile failure:", r, flush=True)
    return {(r[0], r[1], r[5]) for r in fails}


def correctness(log):
    """Small cases against float64 autograd of the forward's reference."""
    from fusionlab.kernels.attention import attention, attention_reference
    from fusionlab.kernels.attention_backward import attention_backward

    ok = True
    cases = [(1, 4, 4, 1, 1, 64), (1, 4, 4, 17, 17, 64), (2, 4, 4, 1000, 1000, 64), (1, 4, 4, 1025, 1025, 128),
             (1, 8, 2, 1000, 1000, 128), (1, 4, 4, 300, 1000, 64), (1, 4, 4, 1000, 300, 128),
             (1, 4, 4, 333, 333, 32)]  # fmt: skip
    for B, H, H_kv, N_q, N_k, D in cases:
        for causal in (False, True):
            for dname, dtype in DTYPES.items():
                g = torch.Generator(device="cuda").manual_seed(1)
                q = torch.randn(B, H, N_q, D, device="cuda", generator=g).to(dtype)
                k, v = (torch.randn(B, H_kv, N_k, D, device="cuda", generator=g).to(dtype) for _ in range(2))
                do = torch.randn(B, H, N_q, D, device="cuda", generator=g).to(dtype)
                o, lse = attention(q, k, v, causal)
                leaves = [t.double().requires_grad_() for t in (q, k, v)]
                o64, _ = attention_reference(*leaves, causal=causal)
                # attention_reference casts O to the inputs' dtype: float64 here, so autograd stays exact
                want = torch.autograd.grad(o64, leaves, do.double())
                for vname, (det, cfg, _) in VARIANTS.items():
                    row = {"kind": "check", "shape": [B, H, H_kv, N_q, N_k, D], "causal": causal, "dtype": dname,
                           "variant": vname}  # fmt: skip
                    try:
                        got = attention_backward(q, k, v, o, lse, do, causal, deterministic=det, config=cfg)
                        errs = [rel_err(a, b) for a, b in zip(got, want, strict=True)]
                        bad = max(errs) > (2e-2 if dname == "bf16" else 5e-3)
                        if det and not bad:  # the deterministic schedule, bit for bit
                            again = attention_backward(q, k, v, o, lse, do, causal, deterministic=True, config=cfg)
                            bad = not all(torch.equal(a, b) for a, b in zip(got, again, strict=True))
                        row.update(rel_err=errs, ok=not bad)
                    except Exception as e:  # noqa: BLE001  (a variant that fails is a result, and a failed check)
                        row.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
                    ok &= row["ok"]
                    log(row)
    return ok


def sdpa_fn(backend):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend]

    def fn(q, k, v, causal):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def bench(fn, rep=60):
    import triton

    return triton.testing.do_bench(fn, warmup=15, rep=rep, return_mode="median")


def time_backends(d, causal, dname, n, log, eager_max_n):
    """SDPA flash, cuDNN and eager: forward, backward alone, forward + backward (ms), and their grads."""
    from fusionlab.kernels.attention_backward import attention_backward_flops

    q, k, v, do = qkv_do(n, d, DTYPES[dname])
    B, H = q.shape[:2]
    fl = attention_backward_flops(B, H, n, n, d, causal)
    out = {}
    names = ["flash", "cudnn"] + (["math"] if n <= eager_max_n else [])
    for name in names:
        fn = sdpa_fn(name)
        try:
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            o = fn(*leaves, causal)
            grads = torch.autograd.grad(o, leaves, do, retain_graph=True)
            fwd_ms = bench(lambda fn=fn, leaves=leaves: fn(*leaves, causal))
            bwd_ms = bench(lambda o=o, leaves=leaves: torch.autograd.grad(o, leaves, do, retain_graph=True))
            both_ms = bench(lambda fn=fn, leaves=leaves: torch.autograd.grad(fn(*leaves, causal), leaves, do))
            out[name] = {"fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "fwd_bwd_ms": both_ms, "grads": grads}
            del o
            log({"kind": "backend", "d": d, "causal": causal, "dtype": dname, "n": n, "backend": name,
                 "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "fwd_bwd_ms": both_ms,
                 "bwd_tflops": fl / bwd_ms * 1e-9})  # fmt: skip
        except Exception as e:  # noqa: BLE001  (a backend that does not run a shape is a result)
            log({"kind": "backend", "d": d, "causal": causal, "dtype": dname, "n": n, "backend": name,
                 "error": f"{type(e).__name__}: {e}"[:300]})  # fmt: skip
        torch.cuda.empty_cache()
    return out, (q, k, v, do), fl


def time_ours(inputs, causal, cfg, det=True, ref_grads=None, fwd_bwd=False):
    from fusionlab.kernels.attention import attention
    from fusionlab.kernels.attention_backward import attention_backward

    q, k, v, do = inputs
    o, lse = attention(q, k, v, causal)
    grads = attention_backward(q, k, v, o, lse, do, causal, deterministic=det, config=cfg)
    errs = None if ref_grads is None else [rel_err(a, b) for a, b in zip(grads, ref_grads, strict=True)]
    ms = bench(lambda: attention_backward(q, k, v, o, lse, do, causal, deterministic=det, config=cfg))
    both = None
    if fwd_bwd:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]

        def step():
            out, _ = attention(*leaves, causal=causal, deterministic=det, backward_config=cfg)
            return torch.autograd.grad(out, leaves, do)

        both = bench(step)
    return ms, both, errs


def memory_case(log):
    from fusionlab.kernels.attention import attention

    B, H, N, D = 1, 16, 131072, 128
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    o, lse = attention(*leaves, causal=True)
    grads = torch.autograd.grad(o, leaves, do)
    torch.cuda.synchronize()
    sec = time.time() - t0
    peak = torch.cuda.max_memory_allocated() - base
    grads_bytes = sum(g.numel() * g.element_size() for g in grads)
    # what any attention forward + backward hands back: O, lse and the gradients; the rest is the schedule's
    returned = grads_bytes + o.numel() * o.element_size() + lse.numel() * lse.element_size()
    log({"kind": "memory", "shape": [B, H, N, D], "extra_gib": peak / 2**30,
         "extra_beyond_grads_gib": (peak - grads_bytes) / 2**30, "workspace_mib": (peak - returned) / 2**20,
         "first_call_s": sec, "finite": bool(all(torch.isfinite(g).all() for g in grads))})  # fmt: skip


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--ds", default="64,128")
    p.add_argument("--ns", default="1024,4096,16384")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--tma-sweep", action="store_true", help="a few tiles with TMA loads, bf16, N = 4k and 16k")
    p.add_argument("--eager-max-n", type=int, default=4096)
    p.add_argument("--deadline", type=float, default=None, help="seconds from start after which to stop timing")
    a = p.parse_args()
    start = time.time()
    ds = [int(x) for x in a.ds.split(",")]
    ns = [int(x) for x in a.ns.split(",")]
    dnames = a.dtypes.split(",")
    os.makedirs(a.out, exist_ok=True)
    rows: list[dict] = []
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }

    def log(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    def save():
        with open(os.path.join(a.out, "attention_backward.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)

    def late(need=0.0):
        return a.deadline is not None and time.time() - start + need > a.deadline

    import triton

    import fusionlab  # noqa: F401
    from fusionlab.kernels.attention_backward import attention_backward_config

    meta["triton"] = triton.__version__
    print(meta, flush=True)

    # the tiles each (head dim, causal) will use: the default, or the sweep's fastest
    base = {}
    for d in ds:
        for causal in (False, True):
            cfg = attention_backward_config(d, causal)
            base[(d, causal)] = {k: cfg[k] for k in _t(*range(8))}
    k1 = ("BLOCK_M1", "BLOCK_N1", "num_warps1", "num_stages1")
    k2 = ("BLOCK_M2", "BLOCK_N2", "num_warps2", "num_stages2")
    candidates = {}  # (d, causal) -> [(which half it varies, tiles)]
    for d in ds:
        for causal in (False, True):
            b = base[(d, causal)]
            cands = [("base", b)]
            if a.sweep:
                cands += [("dkdv", {**b, **dict(zip(k1, t, strict=True))}) for t in SWEEP_DKDV]
                cands += [("dq", {**b, **dict(zip(k2, t, strict=True))}) for t in SWEEP_DQ]
            candidates[(d, causal)] = cands
    failed = set()
    if a.workers:
        tasks = []
        for (d, causal), cands in candidates.items():
            for _, c in cands:
                tasks.append((d, causal, "bf16", 1024, True, c))
            for dname in dnames:
                for det, extra, _ in VARIANTS.values():
                    tasks.append((d, causal, dname, 1024, det, {**base[(d, causal)], **extra}))
        failed = precompile(tasks, a.workers)

    meta["correct"] = correctness(log)
    save()

    chosen = {}
    for (d, causal), cands in candidates.items():
        if len(cands) == 1:
            chosen[(d, causal)] = cands[0][1]
            continue
        # the sweep, bf16: the two passes are separate kernels, so their times add; each half's best
        # tile (summed over the Ns) against the base's other half
        totals: dict[int, list[float]] = {}
        for n in ns:
            inputs = qkv_do(n, d, torch.bfloat16)
            for i, (_, c) in enumerate(cands):
                if (d, causal, json.dumps(c)) in failed or late(60):
                    continue
                try:
                    ms, _, _ = time_ours(inputs, causal, c)
                    totals.setdefault(i, []).append(ms)
                    log({"kind": "sweep", "d": d, "causal": causal, "n": n, "cfg": c, "bwd_ms": ms})
                except Exception as e:  # noqa: BLE001
                    log({"kind": "sweep", "d": d, "causal": causal, "n": n, "cfg": c, "error": str(e)[:200]})
            del inputs
        full = {i: sum(v) for i, v in totals.items() if len(v) == len(ns)}
        best1 = min((i for i in full if cands[i][0] in ("base", "dkdv")), key=full.get, default=0)
        best2 = min((i for i in full if cands[i][0] in ("base", "dq")), key=full.get, default=0)
        pick = {**{k: cands[best1][1][k] for k in k1}, **{k: cands[best2][1][k] for k in k2}}
        chosen[(d, causal)] = pick
        log({"kind": "chosen", "d": d, "causal": causal, "cfg": pick, "base_ms": full.get(0),
             "best_dkdv_ms": full.get(best1), "best_dq_ms": full.get(best2)})  # fmt: skip
        save()
    if a.sweep and a.workers:  # the chosen pairs at every dtype and schedule, compiled before the timings
        precompile([(d, c, dn, 1024, det, {**cfg, **extra}) for (d, c), cfg in chosen.items() for dn in dnames
                    for det, extra, _ in VARIANTS.values()], a.workers)  # fmt: skip

    # the final table: backends, ours (both schedules) at the chosen tiles, every dtype
    for d in ds:
        for causal in (False, True):
            for dname in dnames:
                for n in ns:
                    if late(30):
                        print("deadline: stopping the timings", flush=True)
                        break
                    try:
                        be, inputs, fl = time_backends(d, causal, dname, n, log, a.eager_max_n)
                        ref = be["flash"]["grads"] if "flash" in be else None
                        cfg = chosen[(d, causal)]
                        row = {"kind": "ours", "d": d, "causal": causal, "dtype": dname, "n": n, "cfg": cfg}
                        try:
                            ms, both, errs = time_ours(inputs, causal, cfg, True, ref, fwd_bwd=True)
                            row.update(bwd_ms=ms, fwd_bwd_ms=both, rel_err_vs_flash=errs, bwd_tflops=fl / ms * 1e-9)
                        except Exception as e:  # noqa: BLE001
                            row["error"] = f"{type(e).__name__}: {e}"[:300]
                            # the chosen pair does not compile at this dtype: the base tiles
                            cfg = base[(d, causal)]
                            ms, both, errs = time_ours(inputs, causal, cfg, True, ref, fwd_bwd=True)
                            row.update(cfg=cfg, bwd_ms=ms, fwd_bwd_ms=both, rel_err_vs_flash=errs,
                                       bwd_tflops=fl / ms * 1e-9)  # fmt: skip
                        for vname, (det, extra, fb) in VARIANTS.items():
                            if vname == "det":
                                continue
                            try:
                                ms_v, both_v, errs_v = time_ours(inputs, causal, {**cfg, **extra}, det, ref, fwd_bwd=fb)
                                row[vname] = {"bwd_ms": ms_v, "fwd_bwd_ms": both_v, "rel_err_vs_flash": errs_v}
                            except Exception as e:  # noqa: BLE001
                                row[vname] = {"error": f"{type(e).__name__}: {e}"[:300]}
                        for name in ("flash", "cudnn", "math"):
                            if name in be:
                                row[f"vs_{name}_bwd"] = be[name]["bwd_ms"] / row["bwd_ms"]
                                if row.get("fwd_bwd_ms"):
                                    row[f"vs_{name}_fwd_bwd"] = be[name]["fwd_bwd_ms"] / row["fwd_bwd_ms"]
                        log(row)
                        del be, inputs, ref
                    except Exception:  # noqa: BLE001
                        log({"kind": "error", "d": d, "causal": causal, "dtype": dname, "n": n,
                             "trace": traceback.format_exc()[-800:]})  # fmt: skip
                    torch.cuda.empty_cache()
                    save()
    if a.memory and not late(20):
        try:
            memory_case(log)
        except Exception:  # noqa: BLE001
            log({"kind": "memory", "trace": traceback.format_exc()[-800:]})
    if a.tma_sweep and not late(60):
        tcands = {}
        for (d, causal), cfg in chosen.items():
            c = [{**cfg, "TMA": True}]
            c += [{**cfg, **dict(zip(k1, t, strict=True)), "TMA": True} for t in TMA_DKDV]
            c += [{**cfg, **dict(zip(k2, t, strict=True)), "TMA": True} for t in TMA_DQ]
            tcands[(d, causal)] = c
        if a.workers:
            precompile([(d, c, "bf16", 1024, True, x) for (d, c), xs in tcands.items() for x in xs], a.workers)
        for (d, causal), xs in tcands.items():
            for n in [n for n in ns if n >= 4096]:
                if late(10):
                    break
                inputs = qkv_do(n, d, torch.bfloat16)
                base_ms = time_ours(inputs, causal, chosen[(d, causal)])[0]
                for x in xs:
                    try:
                        ms = time_ours(inputs, causal, x)[0]
                        log({"kind": "tma_sweep", "d": d, "causal": causal, "n": n, "cfg": x, "bwd_ms": ms,
                             "pointer_ms": base_ms})  # fmt: skip
                    except Exception as e:  # noqa: BLE001
                        log({"kind": "tma_sweep", "d": d, "causal": causal, "n": n, "cfg": x, "error": str(e)[:200]})
                del inputs
        save()

    save()
    print(table(rows), flush=True)


def table(rows) -> str:
    """Per shape: the default's TFLOP/s and its ratios to the backends (backward; forward + backward),
    then each other schedule's speed against the default and against cuDNN, and the worst error."""
    names = [n for n in VARIANTS if n != "det"]
    head = "d   causal dtype     n  TF/s  xflash xcudnn xeager  fb:xflash  " + "  ".join(
        f"{n}:/det,xcudnn,fb:xflash" for n in names
    )
    lines = [head]
    nan = float("nan")
    for r in rows:
        if r.get("kind") != "ours" or "bwd_ms" not in r:
            continue
        line = (
            f"{r['d']:<4}{'yes' if r['causal'] else 'no':<7}{r['dtype']:<6}{r['n']:>6} {r['bwd_tflops']:5.0f}"
            f"  {r.get('vs_flash_bwd', nan):5.2f}  {r.get('vs_cudnn_bwd', nan):5.2f}"
            f"  {r.get('vs_math_bwd', nan):5.2f}   {r.get('vs_flash_fwd_bwd', nan):5.2f}    "
        )
        cudnn_ms = r["bwd_ms"] * r.get("vs_cudnn_bwd", nan)
        flash_fb = (r.get("fwd_bwd_ms") or nan) * r.get("vs_flash_fwd_bwd", nan)
        for n in names:
            v = r.get(n) or {}
            if "bwd_ms" not in v:
                line += f"  {'-':>24}"
                continue
            err = max(v.get("rel_err_vs_flash") or [nan])
            line += (f"  {r['bwd_ms'] / v['bwd_ms']:4.2f},{cudnn_ms / v['bwd_ms']:4.2f},"
                     f"{flash_fb / v['fwd_bwd_ms'] if v.get('fwd_bwd_ms') else nan:4.2f} e{err:.0e}")  # fmt: skip
        lines.append(line + f"  err {max(r.get('rel_err_vs_flash') or [nan]):.0e}")
    for r in rows:
        if r.get("kind") == "tma_sweep" and "bwd_ms" in r:
            c = r["cfg"]
            tiles = (f"{c['BLOCK_M1']}x{c['BLOCK_N1']} w{c['num_warps1']} s{c['num_stages1']} / "
                     f"{c['BLOCK_M2']}x{c['BLOCK_N2']} w{c['num_warps2']} s{c['num_stages2']}")  # fmt: skip
            lines.append(f"tma {r['d']} {'causal' if r['causal'] else 'full'} {r['n']}: {tiles}: "
                         f"{r['pointer_ms'] / r['bwd_ms']:.3f}x the pointer default")  # fmt: skip
    for r in rows:
        if r.get("kind") in ("memory", "chosen"):
            lines.append(json.dumps(r))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
