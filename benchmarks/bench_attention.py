"""Lesson 7 on a GPU: the FlashAttention forward against SDPA's flash and cuDNN backends, in one call.

    PYTHONPATH=. python3 benchmarks/bench_attention.py --out $OUT [--sweep | --final] [--rounds 3]
        [--workers 10] [--tests] [--baselines] [--memory] [--plain] [--deadline EPOCH]

(the three H100 calls of benchmarks/notes_attention.md: ``--sweep --workers 10 --tests --memory``;
``--sweep --plain --rounds 2 --baselines ...``; ``--final --rounds 3 --workers 10 --tests --memory``)

Shapes: head dims 64 and 128, N = 1k, 4k, 16k with B x H = (16384 / N) x 16 (16k x 16 token-heads),
causal and not, bf16 and fp16. For each shape SDPA's flash and cuDNN backends are timed, then the
package's default configuration (``--sweep``: every configuration of ``SWEEP``) after a check against
the flash backend's O (norm-relative error < 1e-2, no NaN) and, where the aten op gives it, its
log-sum-exp. ``--workers``: compile the kernels the sweep will time in that many processes first
(Triton's on-disk cache is shared), so compile time does not eat the call. ``--tests``: run
tests/test_attention.py (pytest -n 6) alongside the compiles. ``--baselines``: eager (nanoGPT's
manual attention) and ``torch.compile`` of it at a few shapes. ``--memory``: N = 131072, B = 1,
H = 16, D = 128: extra memory and time. ``--plain``: the pointer path at the default tiles, to
measure what the descriptors buy. ``--final``: the shipped defaults (and a few alternatives) against
the backends in rounds whose order rotates. Timings: do_bench median, L2 flushed.
JSON goes to ``$OUT/attention.json``; a compact table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
NS = (1024, 4096, 16384)
DS = (64, 128)
DS_RUN = list(DS)  # --ds narrows the run


def _cfg(bm, bn, w, s):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}


#: the sweep's configurations (sweep 1 also had 128x128 w8 s2, 128x64 w8 s3 and two warp-specialised
#: ones, which did not compile: benchmarks/notes_attention.md)
SWEEP = {
    "128x64 w4 s3": _cfg(128, 64, 4, 3),
    "128x64 w4 s2": _cfg(128, 64, 4, 2),
    "128x128 w8 s3": _cfg(128, 128, 8, 3),
    "64x64 w4 s3": _cfg(64, 64, 4, 3),
    "64x128 w4 s3": _cfg(64, 128, 4, 3),
}
#: what ``attention`` is called with, by name: the default, its variants, and the sweep
EXTRA = {
    "default": {},
    # sweep 5: every block against block 0's row max (REF_MAX): no running max, no rescale of acc
    "default+ref": {"config": {"REF_MAX": 1}},
    "default+store+ref": {"config": {"TMA_STORE": True, "REF_MAX": 1}},
    "default+ref2": {"config": {"REF_MAX": 2}},
    "default+store+ref2": {"config": {"TMA_STORE": True, "REF_MAX": 2}},
    "64x64 w4 s3 +store+ref2": {"config": {**_cfg(64, 64, 4, 3), "TMA_STORE": True, "REF_MAX": 2}},
    "64x64 w4 s3 +store+ref": {"config": {**_cfg(64, 64, 4, 3), "TMA_STORE": True, "REF_MAX": 1}},
    # sweep 6: block 0 peeled inside the loop (no buffers of its own): at head dim 128 a 64x64 tile with
    # REF_MAX needs 113 KiB again, two programs per SM; and the larger tiles with less per-score work
    "128x128 w8 s3 +store+ref": {"config": {**_cfg(128, 128, 8, 3), "TMA_STORE": True, "REF_MAX": 1}},
    "128x128 w8 s3 +store+ref2": {"config": {**_cfg(128, 128, 8, 3), "TMA_STORE": True, "REF_MAX": 2}},
    "128x64 w4 s3 +store+ref2": {"config": {**_cfg(128, 64, 4, 3), "TMA_STORE": True, "REF_MAX": 2}},
    # sweep 7 (head dim 128, N = 1k, the last shape under the cuDNN bar): with less work per score, do
    # other tiles win? Wider key blocks, fewer stages, and 8 warps sharing one K/V pipeline
    "64x128 w4 s3 +store+ref": {"config": {**_cfg(64, 128, 4, 3), "TMA_STORE": True, "REF_MAX": 1}},
    "64x128 w4 s2 +store+ref2": {"config": {**_cfg(64, 128, 4, 2), "TMA_STORE": True, "REF_MAX": 2}},
    "64x64 w4 s2 +store+ref": {"config": {**_cfg(64, 64, 4, 2), "TMA_STORE": True, "REF_MAX": 1}},
    "64x32 w4 s3 +store+ref": {"config": {**_cfg(64, 32, 4, 3), "TMA_STORE": True, "REF_MAX": 1}},
    "128x64 w8 s2 +store+ref2": {"config": {**_cfg(128, 64, 8, 2), "TMA_STORE": True, "REF_MAX": 2}},
    "128x64 w8 s3 +store+ref": {"config": {**_cfg(128, 64, 8, 3), "TMA_STORE": True, "REF_MAX": 1}},
    "128x128 w8 s2 +store+ref2": {"config": {**_cfg(128, 128, 8, 2), "TMA_STORE": True, "REF_MAX": 2}},
    # sweep 4 (occupancy): shared memory per program decides how many programs share an SM; at head
    # dim 128, 64x64 tiles with 3 stages and the O staging buffer need 113 KiB, so one program per SM
    # (228 KiB), and nothing overlaps its softmax with tensor-core work. These fit two or three.
    "64x64 w4 s2 +store": {"config": {**_cfg(64, 64, 4, 2), "TMA_STORE": True}},
    "64x64 w4 s3 -store": {"config": {**_cfg(64, 64, 4, 3), "TMA_STORE": False}},
    "64x64 w4 s2 -store": {"config": {**_cfg(64, 64, 4, 2), "TMA_STORE": False}},
    "64x32 w4 s3 +store": {"config": {**_cfg(64, 32, 4, 3), "TMA_STORE": True}},
    "64x32 w4 s3 -store": {"config": {**_cfg(64, 32, 4, 3), "TMA_STORE": False}},
    "128x64 w4 s2 -store": {"config": {**_cfg(128, 64, 4, 2), "TMA_STORE": False}},
    "128x64 w8 s2 +store": {"config": {**_cfg(128, 64, 8, 2), "TMA_STORE": True}},
    "128x64 w8 s2 -store": {"config": {**_cfg(128, 64, 8, 2), "TMA_STORE": False}},
    "default+store": {"config": {"TMA_STORE": True}},
    "plain": {"variant": "plain"},
    "128x64 w4 s2 +store": {"config": {**_cfg(128, 64, 4, 2), "TMA_STORE": True}},
    "128x128 w8 s3 +store": {"config": {**_cfg(128, 128, 8, 3), "TMA_STORE": True}},
}
#: --final: the package's default against the backends, with alternatives where the sweeps were close
FINAL_ALTERNATIVES = {64: ["64x64 w4 s3 +store+ref"], 128: ["64x64 w4 s3 +store+ref", "128x128 w8 s3 +store+ref2"]}


def final_names(d: int) -> list[str]:
    """What --final checks and times at head dim ``d`` (besides the backends)."""
    return ["default", *FINAL_ALTERNATIVES[d]]


def kwargs_of(name: str) -> dict:
    return EXTRA[name] if name in EXTRA else {"config": SWEEP[name]}


def shapes():
    for d in DS_RUN:
        for causal in (False, True):
            for dname in DTYPES:
                for n in NS:
                    yield d, causal, dname, n


def qkv(n, d, dtype, seed=0):
    B, H = max(1, 16384 // n), 16
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, H, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(3)]


def _compile_worker(tasks):
    """Run each (d, causal, dname, n, cfg) once: fills Triton's cache for the timing process."""
    import fusionlab  # noqa: F401  (decides the mode before the kernels are defined)
    from fusionlab.kernels.attention import attention

    out = []
    for d, causal, dname, n, name in tasks:
        t0 = time.time()
        try:
            q, k, v = qkv(n, d, DTYPES[dname])
            attention(q, k, v, causal=causal, **kwargs_of(name))
            torch.cuda.synchronize()
            out.append((d, causal, dname, n, name, time.time() - t0, None))
        except Exception as e:  # noqa: BLE001  (a config that does not compile is a result)
            out.append((d, causal, dname, n, name, time.time() - t0, f"{type(e).__name__}: {str(e)[:300]}"))
    return out


class Run:
    def __init__(self, out: str, deadline: float | None):
        self.out = out
        self.deadline = deadline
        self.rows: list[dict] = []
        self.meta: dict = {}

    def ok(self, need: float = 0) -> bool:
        return self.deadline is None or time.time() + need < self.deadline

    def add(self, **row):
        self.rows.append(row)
        print(json.dumps(row), flush=True)

    def save(self):
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, "attention.json"), "w") as f:
            json.dump({"meta": self.meta, "rows": self.rows}, f, indent=1)


def rel_err(y, ref) -> float:
    y, ref = y.double(), ref.double()
    return ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def fn(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def flash_lse(q, k, v, causal):
    try:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)[1]
    except Exception:  # noqa: BLE001
        return None


def sweep(run: Run, names: list[str], rounds: int):
    from torch.nn.attention import SDPBackend

    from fusionlab import bench
    from fusionlab.kernels.attention import attention_flops

    flash, cudnn = sdpa(SDPBackend.FLASH_ATTENTION), sdpa(SDPBackend.CUDNN_ATTENTION)
    for d, causal, dname, n in shapes():
        if not run.ok(20):
            print("deadline: stopping the sweep", flush=True)
            break
        dtype = DTYPES[dname]
        q, k, v = qkv(n, d, dtype, seed=n + d)
        B, H = q.shape[:2]
        flops = attention_flops(B, H, n, n, d, causal)
        base = {"D": d, "causal": causal, "dtype": dname, "N": n, "B": B, "H": H}
        ref = flash(q, k, v, causal)
        ref_lse = flash_lse(q, k, v, causal)
        for rnd in range(rounds):  # later rounds: the baselines and the defaults again, interleaved
            for bname, fn in (("flash", flash), ("cudnn", cudnn)):
                try:
                    o = fn(q, k, v, causal)
                    ms = bench.time_ms(lambda: fn(q, k, v, causal), warmup_ms=10, rep_ms=40)
                    run.add(**base, impl=bname, ms=ms, tflops=flops / ms / 1e9, err=rel_err(o, ref), round=rnd)
                except Exception as e:  # noqa: BLE001
                    run.add(**base, impl=bname, error=f"{type(e).__name__}: {str(e)[:200]}")
            ours(run, base, q, k, v, causal, flops, ref, ref_lse, names if rnd == 0 else ["default", "default+store"])
    run.save()


def final(run: Run, rounds: int):
    """Each shape: the backends, our default and its alternatives, in ``rounds`` rounds whose order
    rotates, so that no implementation always runs right after another's heat (an H100 timed right
    after cuDNN measured ~8% slower in sweep 2 than the same kernel timed later)."""
    from torch.nn.attention import SDPBackend

    from fusionlab import bench
    from fusionlab.kernels.attention import attention, attention_config, attention_flops

    flash, cudnn = sdpa(SDPBackend.FLASH_ATTENTION), sdpa(SDPBackend.CUDNN_ATTENTION)
    for d, causal, dname, n in shapes():
        if not run.ok(15):
            print("deadline: stopping", flush=True)
            break
        q, k, v = qkv(n, d, DTYPES[dname], seed=n + d + 1)
        B, H = q.shape[:2]
        flops = attention_flops(B, H, n, n, d, causal)
        base = {"D": d, "causal": causal, "dtype": dname, "N": n, "B": B, "H": H}
        ref = flash(q, k, v, causal)
        ref_lse = flash_lse(q, k, v, causal)
        fns = {"flash": lambda: flash(q, k, v, causal), "cudnn": lambda: cudnn(q, k, v, causal)}
        for name in final_names(d):
            kw = kwargs_of(name)
            o, lse = attention(q, k, v, causal=causal, **kw)
            err = rel_err(o, ref)
            lse_err = (lse - ref_lse).abs().max().item() if ref_lse is not None else None
            bad = bool(torch.isnan(o).any() or torch.isnan(lse).any()) or err > 1e-2
            bad = bad or (lse_err is not None and lse_err > 1e-2)
            picked = attention_config(B, H, n, n, d, q.dtype, causal) if name == "default" else None
            run.add(**base, impl="ours", config=name, check=True, err=err, lse_err=lse_err, wrong=bad, picked=picked)
            if not bad:
                fns[name] = lambda kw=kw: attention(q, k, v, causal=causal, **kw)
        names = list(fns)
        for rnd in range(rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for name in order:
                ms = bench.time_ms(fns[name], warmup_ms=10, rep_ms=50)
                impl, cfg = (name, None) if name in ("flash", "cudnn") else ("ours", name)
                run.add(**base, impl=impl, config=cfg, round=rnd, ms=ms, tflops=flops / ms / 1e9)
    run.save()


def occupancy(run: Run, names: list[str]):
    """Each configuration's compiled kernel at N = 4096, bf16: registers, spills, shared memory, and
    how many programs fit on one SM by each limit (the smallest is what runs)."""
    from fusionlab.kernels.attention import _attention_kernel, attention

    props = torch.cuda.get_device_properties(0)
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
    for d in DS_RUN:
        for causal in (False, True):
            q, k, v = qkv(4096, d, torch.bfloat16)
            for name in names:
                try:
                    if hasattr(_attention_kernel, "device_caches"):  # so that the next launch is the newest entry
                        _attention_kernel.device_caches.clear()
                    attention(q, k, v, causal=causal, **kwargs_of(name))
                    torch.cuda.synchronize()
                    kern = _last_compiled(_attention_kernel)
                    warps = kern.metadata.num_warps
                    smem = kern.metadata.shared
                    by_smem = smem_sm // max(smem + 1024, 1)  # 1 KiB reserved per program
                    by_regs = regs_sm // (kern.n_regs * 32 * warps) if kern.n_regs else None
                    run.add(kind="occupancy", D=d, causal=causal, config=name, regs=kern.n_regs,
                            spills=kern.n_spills, smem=smem, warps=warps, by_smem=by_smem, by_regs=by_regs,
                            programs_per_sm=min(x for x in (by_smem, by_regs, 64 // warps) if x))  # fmt: skip
                except Exception as e:  # noqa: BLE001
                    err = f"{type(e).__name__}: {str(e)[:200]}"
                    run.add(kind="occupancy", D=d, causal=causal, config=name, error=err)


def _last_compiled(jit_fn):
    """The kernel the last launch ran (each configuration compiles once; the caches keep insertion order)."""
    caches = getattr(jit_fn, "device_caches", None)
    if caches:
        for entry in caches.values():
            kernels = entry[0] if isinstance(entry, tuple) else entry
            return list(kernels.values())[-1]
    return list(jit_fn.cache[torch.cuda.current_device()].values())[-1]


def ours(run, base, q, k, v, causal, flops, ref, ref_lse, names):
    from fusionlab import bench
    from fusionlab.kernels.attention import attention, attention_config

    B, H, n, d = q.shape
    for name in names:
        if causal and name in SWEEP and SWEEP[name]["BLOCK_N"] > SWEEP[name]["BLOCK_M"]:
            continue
        try:
            kw = kwargs_of(name)
            o, lse = attention(q, k, v, causal=causal, **kw)
            torch.cuda.synchronize()
            err = rel_err(o, ref)
            lse_err = (lse - ref_lse).abs().max().item() if ref_lse is not None else None
            nan = bool(torch.isnan(o).any() or torch.isnan(lse).any())
            row = {**base, "impl": "ours", "config": name, "err": err, "lse_err": lse_err, "nan": nan}
            if name == "default":
                row["picked"] = attention_config(B, H, n, n, d, q.dtype, causal)
            if nan or err > 1e-2 or (lse_err is not None and lse_err > 1e-2):
                run.add(**row, error="WRONG")
                continue
            ms = bench.time_ms(lambda: attention(q, k, v, causal=causal, **kw), warmup_ms=10, rep_ms=40)
            run.add(**row, ms=ms, tflops=flops / ms / 1e9)
        except Exception as e:  # noqa: BLE001
            run.add(**base, impl="ours", config=name, error=f"{type(e).__name__}: {str(e)[:300]}")


def baselines(run: Run, compiled_shapes):
    from fusionlab import bench
    from fusionlab.kernels.attention import attention, attention_eager, attention_flops

    torch._dynamo.config.cache_size_limit = 64
    for d, causal, n in [(128, c, n) for c in (False, True) for n in NS] + [(64, False, 4096)]:
        if not run.ok(30):
            break
        q, k, v = qkv(n, d, torch.bfloat16, seed=1)
        B, H = q.shape[:2]
        flops = attention_flops(B, H, n, n, d, causal)
        base = {"D": d, "causal": causal, "dtype": "bf16", "N": n, "B": B, "H": H}
        ours = bench.time_ms(lambda: attention(q, k, v, causal=causal))
        try:
            torch.cuda.reset_peak_memory_stats()
            m0 = torch.cuda.memory_allocated()
            attention_eager(q, k, v, causal)
            peak = (torch.cuda.max_memory_allocated() - m0) / 2**30
            ms = bench.time_ms(lambda: attention_eager(q, k, v, causal))
            run.add(**base, impl="eager", ms=ms, tflops=flops / ms / 1e9, peak_GiB=peak, ours_ms=ours)
        except Exception as e:  # noqa: BLE001
            run.add(**base, impl="eager", error=f"{type(e).__name__}: {str(e)[:200]}")
        if (d, causal, n) in compiled_shapes and run.ok(60):
            try:
                t0 = time.time()
                fn = torch.compile(attention_eager, dynamic=False)
                fn(q, k, v, causal)
                ct = time.time() - t0
                ms = bench.time_ms(lambda: fn(q, k, v, causal))
                run.add(**base, impl="compiled", ms=ms, tflops=flops / ms / 1e9, compile_s=ct, ours_ms=ours)
            except Exception as e:  # noqa: BLE001
                run.add(**base, impl="compiled", error=f"{type(e).__name__}: {str(e)[:200]}")
        torch.cuda.empty_cache()
    run.save()


def memory(run: Run):
    from fusionlab import bench
    from fusionlab.kernels.attention import attention, attention_flops

    B, H, N, D = 1, 16, 131072, 128
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for causal in (True, False):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        o, lse = attention(q, k, v, causal=causal)
        torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - before) / 2**30
        del o, lse
        ms = bench.time_ms(lambda: attention(q, k, v, causal=causal), warmup_ms=5, rep_ms=20)
        flops = attention_flops(B, H, N, N, D, causal)
        run.add(impl="ours", N=N, D=D, B=B, H=H, causal=causal, dtype="bf16", extra_GiB=extra, ms=ms,
                tflops=flops / ms / 1e9, section="memory")  # fmt: skip
    run.save()


def ceilings(run: Run):
    from fusionlab import bench

    run.meta["copy_GBps"] = bench.measure_copy_bandwidth()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench.time_ms(lambda: a @ b)
    run.meta["matmul_bf16_TFLOPs"] = 2 * 8192**3 / ms / 1e9
    print("ceilings", run.meta, flush=True)


def table(run: Run) -> str:
    """One line per shape (each number the best of its rounds): the flash and cuDNN backends; ours
    with the default tiles, with the descriptor store, and the best configuration of the sweep;
    the pointer path at the default tiles."""
    lines = [
        f"{'D':>3} {'causal':>6} {'dt':>4} {'N':>6} | {'flash':>5} {'cudnn':>5} | {'dflt':>5} {'/fl':>4} {'/cu':>4}"
        f" | {'store':>5} {'/fl':>4} {'/cu':>4} | {'best':>5} {'/fl':>4} {'/cu':>4} {'best config':<14}| plain"
    ]
    by = {}
    for r in run.rows:
        if "section" in r or "N" not in r or r.get("impl") in ("eager", "compiled"):
            continue
        by.setdefault((r["D"], r["causal"], r["dtype"], r["N"]), []).append(r)
    for key, rows in by.items():
        get = {}
        for r in rows:
            if r.get("tflops"):
                k = (r["impl"], r.get("config"))
                get[k] = max(get.get(k, 0), r["tflops"])
        fl, cu = get.get(("flash", None)), get.get(("cudnn", None))
        dflt, store, plain = (get.get(("ours", c)) for c in ("default", "default+store", "plain"))
        mine = [(t, c) for (i, c), t in get.items() if i == "ours" and c != "plain"]
        best, bname = max(mine) if mine else (None, "-")
        f = lambda x: f"{x:5.0f}" if x else "    -"  # noqa: E731
        rt = lambda a, b: f"{a / b:4.2f}" if a and b else "   -"  # noqa: E731
        d, causal, dt, n = key
        lines.append(
            f"{d:>3} {str(causal):>6} {dt:>4} {n:>6} | {f(fl)} {f(cu)} | {f(dflt)} {rt(dflt, fl)} {rt(dflt, cu)}"
            f" | {f(store)} {rt(store, fl)} {rt(store, cu)} | {f(best)} {rt(best, fl)} {rt(best, cu)} {bname:<14}|"
            f" {f(plain)}"
        )
    for r in run.rows:
        if r.get("impl") in ("eager", "compiled") or r.get("section") == "memory":
            lines.append(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--configs", default="", help="comma-separated SWEEP names (default: all with --sweep)")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--tests", action="store_true")
    p.add_argument("--baselines", action="store_true")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--plain", action="store_true")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--final", action="store_true", help="the default against the backends, rotated rounds")
    p.add_argument("--deadline", type=float, default=None)
    p.add_argument("--ds", default="", help="comma-separated head dims (default: 64,128)")
    p.add_argument("--occupancy", action="store_true", help="report each compiled kernel's registers and shared memory")
    a = p.parse_args(argv)
    if a.ds:
        DS_RUN[:] = [int(x) for x in a.ds.split(",")]

    import triton

    import fusionlab

    run = Run(a.out, a.deadline)
    run.meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
        "info": str(fusionlab.info()) if hasattr(fusionlab, "info") else "",
    }
    print(run.meta, flush=True)
    names = [s for s in a.configs.split(",") if s] or (list(SWEEP) if a.sweep else [])
    if a.final:
        names = list(dict.fromkeys(nm for d in DS for nm in final_names(d)))
    else:
        names = ["default", "default+store", *(["plain"] if a.plain else []), *names]

    tests = None
    if a.tests:
        log = open(os.path.join(a.out, "pytest.log"), "w")  # noqa: SIM115
        tests = subprocess.Popen(
            [sys.executable, "-m", "pytest", "tests/test_attention.py", "-q", "-n", "6", "-p", "no:cacheprovider"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    t0 = time.time()
    if a.workers:
        # one kernel per (D, causal, dtype, config): its three N go to one worker, which compiles once
        kernels = [(d, c, dn, nm) for d in DS_RUN for c in (False, True) for dn in DTYPES for nm in names]
        if a.final:
            kernels = [kn for kn in kernels if kn[3] in final_names(kn[0])]
        groups = [[(d, c, dn, n, nm) for n in NS] for d, c, dn, nm in kernels]
        chunks = [[t for g in groups[i :: a.workers] for t in g] for i in range(a.workers)]
        with mp.get_context("spawn").Pool(a.workers) as pool:
            done = [r for part in pool.map(_compile_worker, chunks) for r in part]
        fails = [r for r in done if r[-1]]
        print(f"compiled {len(done)} launches in {time.time() - t0:.0f} s, {len(fails)} failed", flush=True)
        for r in fails:
            print("  compile failure:", r, flush=True)
        run.meta["compile_failures"] = [list(map(str, r)) for r in fails]
    if tests is not None:
        rc = tests.wait()
        print(f"pytest exit {rc} after {time.time() - t0:.0f} s", flush=True)
        print(open(os.path.join(a.out, "pytest.log")).read()[-3000:], flush=True)
    try:
        ceilings(run)
        if a.occupancy:
            occupancy(run, names)
        if a.final:
            final(run, a.rounds)
        else:
            sweep(run, names, a.rounds)
        if a.memory and run.ok(20):
            memory(run)
        if a.baselines and run.ok(30):
            baselines(run, {(128, False, 4096), (128, True, 4096)})
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    finally:
        run.save()
        print(table(run), flush=True)


if __name__ == "__main__":
    main()
