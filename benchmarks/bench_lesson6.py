"""Lesson 6 on a GPU: the tiled matmul against cuBLAS, the fused linear epilogue against everything
PyTorch offers, the RMSNorm prologue against a norm followed by cuBLAS. One call does it all.

    PYTHONPATH=. python3 benchmarks/bench_lesson6.py --out $OUT [--sweep] [--compile] [--max-autotune]
        [--rmsnorm] [--deadline EPOCH]

Every variant is checked against cuBLAS's answer before it is timed. Timings: fusionlab.bench.time_ms
(do_bench median, L2 flushed); cuBLAS is timed before and after each group (the faster of the two is
the baseline: the ratios are conservative). Inputs are random (zeros run faster). Results go to
``$OUT/lesson6.json`` as they come; the table is printed last. ``--deadline``: stop starting new
groups past this epoch second, and still print what was measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

import fusionlab
from fusionlab import bench, runtime
from fusionlab.kernels.linear import linear
from fusionlab.kernels.matmul import _GELU_LIBDEVICE, gemm, matmul
from fusionlab.kernels.rmsnorm_linear import fold_rmsnorm_weight, rmsnorm_linear

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 16384)]  # (M, K, N)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _cfg(bm, bn, bk, stages, warps, subtile=True, ws=False, per_sm=1):
    return {
        "PROGRAMS_PER_SM": per_sm,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "num_stages": stages,
        "num_warps": warps,
        "EPILOGUE_SUBTILE": subtile,
        "WARP_SPECIALIZE": ws,
    }


SWEEP = {
    "128x256x64 s3 w8": _cfg(128, 256, 64, 3, 8),
    "128x256x64 s4 w8": _cfg(128, 256, 64, 4, 8),
    "128x128x64 s4 w8": _cfg(128, 128, 64, 4, 8),
    "128x128x64 s4 w4": _cfg(128, 128, 64, 4, 4),
    "256x128x64 s3 w8": _cfg(256, 128, 64, 3, 8),
    "128x256x64 s3 w4 ws": _cfg(128, 256, 64, 3, 4, subtile=False, ws=True),
    # two programs per SM: one's epilogue runs while the other's MMAs do (registers and shared memory
    # must fit twice)
    "128x128x64 s3 w4 x2": _cfg(128, 128, 64, 3, 4, per_sm=2),
    "128x128x64 s2 w4 x2": _cfg(128, 128, 64, 2, 4, per_sm=2),
    "64x256x64 s2 w4 x2": _cfg(64, 256, 64, 2, 4, per_sm=2),
    "128x128x64 s3 w8 x2": _cfg(128, 128, 64, 3, 8, per_sm=2),
}


class Run:
    def __init__(self, out: str, deadline: float | None):
        self.out = out
        self.deadline = deadline
        self.rows: list[dict] = []
        self.t0 = time.time()
        self.meta = {
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "triton": runtime.version("triton"),
            "date": datetime.date.today().isoformat(),
            "fusionlab": fusionlab.__version__,
        }

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.time()

    def ok(self, need: float) -> bool:
        if self.left() < need:
            print(f"[skip: {self.left():.0f} s left, need ~{need:.0f}]", flush=True)
            return False
        return True

    def add(self, **row):
        row["t"] = round(time.time() - self.t0, 1)
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        self.save()

    def save(self):
        if self.out:
            with open(os.path.join(self.out, "lesson6.json"), "w") as f:
                json.dump({"meta": self.meta, "rows": self.rows}, f, indent=1)


def rel_err(y, ref) -> float:
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


def tflops(M, K, N, ms):
    return 2 * M * N * K / (ms * 1e-3) / 1e12


def time_pair(fn, base):
    """(ms of fn, ms of base): base timed before and after, the faster kept."""
    b1 = bench.time_ms(base)
    t = bench.time_ms(fn)
    b2 = bench.time_ms(base)
    return t, min(b1, b2), (b1, b2)


def inputs(M, K, N, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(N, K, device="cuda", dtype=dtype, generator=g) / K**0.5
    b = torch.randn(N, device="cuda", dtype=dtype, generator=g)
    return x, w, b


# -- 1. matmul: config sweep against cuBLAS --------------------------------------------------------
def sweep_matmul(run: Run, dtypes, configs: dict, layout: str) -> dict:
    """layout "KN": matmul(a, b) with b (K, N) row-major vs torch.matmul(a, b); "NK": b = w.t()."""
    score: dict = {}
    for dname in dtypes:
        dtype = DTYPES[dname]
        for M, K, N in SHAPES:
            if not run.ok(15):
                return score
            x, w, _ = inputs(M, K, N, dtype)
            b = w.t().contiguous() if layout == "KN" else w.t()
            ref = torch.matmul(x, b)
            cub = bench.time_ms(lambda: torch.matmul(x, b))
            for name, cfg in configs.items():
                try:
                    y = matmul(x, b, variant="tma", config=cfg)
                    err = rel_err(y, ref)
                    if not err < 1e-2:
                        run.add(
                            kind="matmul", dtype=dname, shape=[M, K, N], layout=layout, cfg=name, error=f"rel_err {err}"
                        )
                        continue
                    ms = bench.time_ms(lambda: matmul(x, b, variant="tma", config=cfg))
                except Exception as e:  # a config that does not compile or verify is reported, not fatal
                    run.add(kind="matmul", dtype=dname, shape=[M, K, N], layout=layout, cfg=name, error=repr(e)[:300])
                    continue
                rates = {"tflops": tflops(M, K, N, ms), "cublas_tflops": tflops(M, K, N, cub)}
                run.add(kind="matmul", dtype=dname, shape=[M, K, N], layout=layout, cfg=name, ms=ms, cublas_ms=cub,
                        ratio=cub / ms, err=err, **rates)  # fmt: skip
                score.setdefault((dname, name), []).append(cub / ms)
            cub2 = bench.time_ms(lambda: torch.matmul(x, b))
            run.add(kind="cublas_drift", dtype=dname, shape=[M, K, N], layout=layout, before=cub, after=cub2)
    return score


def best_configs(score: dict, dname: str, k: int = 2) -> list[str]:
    mine = {name: math.exp(sum(map(math.log, r)) / len(r)) for (d, name), r in score.items() if d == dname}
    return sorted(mine, key=mine.get, reverse=True)[:k]


# -- 2. the fused linear epilogue -----------------------------------------------------------------
def bench_linear_variants(run: Run, dname: str, cfgs: dict, autotuned: bool):
    """Our linear (bias + GELU) under each config and GELU form, against the cuBLAS matmul alone."""
    dtype = DTYPES[dname]
    for M, K, N in SHAPES:
        if not run.ok(20):
            return
        x, w, b = inputs(M, K, N, dtype, seed=1)
        ref = F.gelu(F.linear(x.float(), w.float(), b.float()))
        base = lambda: torch.matmul(x, w.t())
        variants = {}
        for i, (name, cfg) in enumerate(cfgs.items()):
            variants[f"{name} bias+gelu"] = lambda cfg=cfg: gemm(
                x, w.t(), bias=b, activation=1, config=cfg, variant="tma"
            )
            variants[f"{name} matmul NK"] = lambda cfg=cfg: gemm(x, w.t(), config=cfg, variant="tma")
            if i == 0:  # the GELU forms' cost, under the first config
                variants[f"{name} bias+gelu(libdevice erf)"] = lambda cfg=cfg: gemm(
                    x, w.t(), bias=b, activation=_GELU_LIBDEVICE, config=cfg, variant="tma"
                )
                variants[f"{name} bias only"] = lambda cfg=cfg: gemm(x, w.t(), bias=b, config=cfg, variant="tma")
        if autotuned:
            variants["autotuned linear bias+gelu"] = lambda: linear(x, w, b, "gelu")
        for name, fn in variants.items():
            try:
                y = fn()
                if "gelu" in name:
                    err = rel_err(y, ref)
                    if not err < 1e-2:
                        run.add(kind="linear", dtype=dname, shape=[M, K, N], variant=name, error=f"rel_err {err}")
                        continue
                ms, cub, (c1, c2) = time_pair(fn, base)
            except Exception as e:
                run.add(kind="linear", dtype=dname, shape=[M, K, N], variant=name, error=repr(e)[:300])
                continue
            run.add(kind="linear", dtype=dname, shape=[M, K, N], variant=name, ms=ms, cublas_mm_ms=cub,
                    over_matmul=ms / cub, cublas_before_after=[c1, c2])  # fmt: skip


def bench_linear_baselines(run: Run, dname: str, compile_default: bool, max_autotune: bool):
    """PyTorch's ways of running gelu(linear(x)): eager, cuBLASLt's GELU epilogue, torch.compile."""
    dtype = DTYPES[dname]
    for M, K, N in SHAPES:
        if not run.ok(20):
            return
        x, w, b = inputs(M, K, N, dtype, seed=1)
        ref = F.gelu(F.linear(x.float(), w.float(), b.float()))
        fns = {
            "ours (autotuned)": lambda: linear(x, w, b, "gelu"),
            "cublas matmul alone": lambda: torch.matmul(x, w.t()),
            "F.linear (addmm, bias)": lambda: F.linear(x, w, b),
            "F.linear + F.gelu": lambda: F.gelu(F.linear(x, w, b)),
            "matmul + bias + gelu (3 ops)": lambda: F.gelu(torch.matmul(x, w.t()) + b),
            "_addmm_activation gelu": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
        }
        modes = (["default"] if compile_default else []) + (["max-autotune"] if max_autotune else [])
        for mode in modes:
            need = 40 if mode == "default" else 120
            if not run.ok(need):
                continue
            t0 = time.time()
            try:
                torch._dynamo.reset()
                kw = {} if mode == "default" else {"mode": "max-autotune"}
                cf = torch.compile(lambda x, w, b: F.gelu(F.linear(x, w, b)), dynamic=False, **kw)
                cf(x, w, b)
                cf(x, w, b)
                fns[f"torch.compile {mode}"] = lambda cf=cf: cf(x, w, b)
                run.add(kind="compile_time", dtype=dname, shape=[M, K, N], mode=mode, seconds=time.time() - t0)
            except Exception as e:
                run.add(kind="compile_time", dtype=dname, shape=[M, K, N], mode=mode, error=repr(e)[:300])
        base = fns["cublas matmul alone"]
        base_ms = [bench.time_ms(base)]
        for name, fn in fns.items():
            try:
                y = fn()
                err = rel_err(y, ref) if name not in ("cublas matmul alone", "F.linear (addmm, bias)") else None
                ms = bench.time_ms(fn)
            except Exception as e:
                run.add(kind="linear_baseline", dtype=dname, shape=[M, K, N], variant=name, error=repr(e)[:300])
                continue
            run.add(kind="linear_baseline", dtype=dname, shape=[M, K, N], variant=name, ms=ms, err=err)
        base_ms.append(bench.time_ms(base))
        run.add(kind="linear_baseline_cublas", dtype=dname, shape=[M, K, N], before_after=base_ms)


# -- 3. RMSNorm prologue ---------------------------------------------------------------------------
def rmsnorm_eager(x, gamma, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()).to(x.dtype)


def bench_rmsnorm(run: Run, dname: str, shapes):
    dtype = DTYPES[dname]
    rms_c = torch.compile(rmsnorm_eager, dynamic=False)
    lesson4 = None
    try:  # lesson 4's kernel, where the tree has it
        from fusionlab.kernels.rmsnorm import rmsnorm as lesson4
    except Exception:
        pass
    for M, K, N in shapes:
        if not run.ok(25):
            return
        x, w, _ = inputs(M, K, N, dtype, seed=2)
        gamma = (torch.rand(K, device="cuda") + 0.5).to(dtype)
        fw = fold_rmsnorm_weight(w, gamma)
        ref = F.linear(rmsnorm_eager(x.float(), gamma.float()), w.float())
        fns = {
            "ours (pre-pass + tma row scale)": lambda: rmsnorm_linear(x, gamma, w, folded_weight=fw),
            "compiled rmsnorm + cublas": lambda: torch.matmul(rms_c(x, gamma), w.t()),
            "eager F.rms_norm + cublas": lambda: torch.matmul(F.rms_norm(x, (K,), gamma, 1e-6), w.t()),
            "cublas matmul alone": lambda: torch.matmul(x, w.t()),
            "compiled rmsnorm alone": lambda: rms_c(x, gamma),
        }
        if lesson4 is not None:
            fns["lesson 4 rmsnorm + cublas"] = lambda: torch.matmul(lesson4(x, gamma, 1e-6), w.t())
        for name, fn in fns.items():
            try:
                y = fn()
                y = y[0] if isinstance(y, tuple) else y
                err = rel_err(y, ref) if y.shape == ref.shape else None
                ms = bench.time_ms(fn)
            except Exception as e:
                run.add(kind="rmsnorm", dtype=dname, shape=[M, K, N], variant=name, error=repr(e)[:300])
                continue
            run.add(kind="rmsnorm", dtype=dname, shape=[M, K, N], variant=name, ms=ms, err=err)


# -- 4. the recording: interleaved rounds, medians -------------------------------------------------
def measure(fns: dict, rounds: int = 3) -> dict:
    """Median ms of each fn over ``rounds`` rounds, every fn timed once per round in turn, so that the
    GPU's clock and temperature drift fall on all of them alike."""
    times: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(bench.time_ms(fn))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def checked(run: Run, section: str, dname: str, shape, fns: dict, refs: dict) -> dict:
    """Run each fn once, compare with its reference (rel. error < 1e-2), keep those that pass."""
    ok = {}
    for name, fn in fns.items():
        try:
            y = fn()
            ref = refs.get(name)
            if ref is not None:
                err = rel_err(y, ref)
                if not err < 1e-2:
                    run.add(kind=section, dtype=dname, shape=list(shape), variant=name, error=f"rel_err {err:.2e}")
                    continue
            ok[name] = fn
        except Exception as e:
            run.add(kind=section, dtype=dname, shape=list(shape), variant=name, error=repr(e)[:300])
    return ok


def record(run: Run, section: str, dname: str, shape, fns: dict, base: str, rounds: int = 3):
    med = measure(fns, rounds)
    for name, ms in med.items():
        run.add(kind=section, dtype=dname, shape=list(shape), variant=name, ms=ms, over_base=ms / med[base], base=base)
    return med


def final(run: Run, dtypes, rmsnorm: bool, msweep: bool, max_autotune: bool):
    rms_c = torch.compile(rmsnorm_eager, dynamic=False)
    lesson4 = None
    try:
        from fusionlab.kernels.rmsnorm import rmsnorm as lesson4
    except Exception:
        pass
    for dname in dtypes:
        dtype = DTYPES[dname]
        for M, K, N in SHAPES:
            if not run.ok(30):
                return
            shape = (M, K, N)
            x, w, b = inputs(M, K, N, dtype, seed=3)
            w_kn = w.t().contiguous()
            # matmul, both layouts of B
            mm = {
                "cuBLAS a@b (K,N)": lambda: torch.matmul(x, w_kn),
                "ours a@b (K,N)": lambda: matmul(x, w_kn),
                "cuBLAS x@w.T (N,K)": lambda: torch.matmul(x, w.t()),
                "ours x@w.T (N,K)": lambda: matmul(x, w.t()),
            }
            ref_kn = torch.matmul(x, w_kn)
            mm = checked(run, "mm", dname, shape, mm, {"ours a@b (K,N)": ref_kn, "ours x@w.T (N,K)": ref_kn})
            record(run, "mm", dname, shape, mm, "cuBLAS x@w.T (N,K)")
            # linear + bias + GELU
            ref = F.gelu(F.linear(x.float(), w.float(), b.float()))
            cf = torch.compile(lambda x, w, b: F.gelu(F.linear(x, w, b)), dynamic=False)
            t0 = time.time()
            cf(x, w, b)
            run.add(kind="compile_time", dtype=dname, shape=list(shape), mode="default", seconds=time.time() - t0)
            lin = {
                "cuBLAS matmul alone": lambda: torch.matmul(x, w.t()),
                "ours linear+bias+GELU": lambda: linear(x, w, b, "gelu"),
                "F.linear + F.gelu": lambda: F.gelu(F.linear(x, w, b)),
                "matmul, +bias, gelu (3 kernels)": lambda: F.gelu(torch.matmul(x, w.t()) + b),
                "cuBLASLt _addmm_activation gelu": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
                "torch.compile default": lambda: cf(x, w, b),
            }
            refs = {n: ref for n in lin if "GELU" in n or "gelu" in n or "compile" in n}
            lin = checked(run, "linear", dname, shape, lin, refs)
            record(run, "linear", dname, shape, lin, "cuBLAS matmul alone")
            if rmsnorm:
                gamma = (torch.rand(K, device="cuda") + 0.5).to(dtype)
                fw = fold_rmsnorm_weight(w, gamma)
                rref = F.linear(rmsnorm_eager(x.float(), gamma.float()), w.float())
                rms = {
                    "cuBLAS matmul alone": lambda: torch.matmul(x, w.t()),
                    "ours rmsnorm_linear": lambda: rmsnorm_linear(x, gamma, w, folded_weight=fw),
                    "compiled rmsnorm + cuBLAS": lambda: torch.matmul(rms_c(x, gamma), w.t()),
                }
                if lesson4 is not None:
                    rms["lesson 4 rmsnorm + cuBLAS"] = lambda: torch.matmul(lesson4(x, gamma, 1e-6), w.t())
                rms = checked(run, "rmsnorm", dname, shape, rms, {n: rref for n in rms if n != "cuBLAS matmul alone"})
                record(run, "rmsnorm", dname, shape, rms, "compiled rmsnorm + cuBLAS")
    if max_autotune:
        for dname in dtypes:
            dtype = DTYPES[dname]
            for M, K, N in SHAPES:
                if not run.ok(45):
                    break
                x, w, b = inputs(M, K, N, dtype, seed=3)
                ref = F.gelu(F.linear(x.float(), w.float(), b.float()))
                t0 = time.time()
                try:
                    torch._dynamo.reset()
                    cm = torch.compile(lambda x, w, b: F.gelu(F.linear(x, w, b)), dynamic=False, mode="max-autotune")
                    cm(x, w, b)
                except Exception as e:
                    run.add(kind="compile_time", dtype=dname, shape=[M, K, N], mode="max-autotune", error=repr(e)[:300])
                    continue
                run.add(
                    kind="compile_time", dtype=dname, shape=[M, K, N], mode="max-autotune", seconds=time.time() - t0
                )
                fns = {
                    "cuBLAS matmul alone": lambda: torch.matmul(x, w.t()),
                    "ours linear+bias+GELU": lambda: linear(x, w, b, "gelu"),
                    "torch.compile max-autotune": lambda: cm(x, w, b),
                }
                fns = checked(run, "max-autotune", dname, (M, K, N), fns, {"torch.compile max-autotune": ref})
                record(run, "max-autotune", dname, (M, K, N), fns, "cuBLAS matmul alone")
    if msweep and run.ok(30):
        dname, dtype, K, N = "bf16", torch.bfloat16, 4096, 16384
        for M in (16, 64, 256, 1024, 4096):
            if not run.ok(10):
                break
            x, w, b = inputs(M, K, N, dtype, seed=4)
            ref = F.gelu(F.linear(x.float(), w.float(), b.float()))
            fns = {
                "cuBLAS matmul alone": lambda: torch.matmul(x, w.t()),
                "ours linear+bias+GELU": lambda: linear(x, w, b, "gelu"),
                "F.linear + F.gelu": lambda: F.gelu(F.linear(x, w, b)),
                "cuBLASLt _addmm_activation gelu": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
            }
            fns = checked(run, "msweep", dname, (M, K, N), fns, {"ours linear+bias+GELU": ref})
            record(run, "msweep", dname, (M, K, N), fns, "cuBLAS matmul alone")


# -- table -----------------------------------------------------------------------------------------
def _row_line(r: dict) -> str | None:
    shape = "x".join(map(str, r.get("shape", [])))
    head = f"{r['kind']:<16} {r.get('dtype', ''):<4} {shape:<16}"
    if "error" in r:
        return f"{head} {r.get('cfg') or r.get('variant') or r.get('mode')}: ERROR {r['error'][:90]}"
    if "over_base" in r:
        return f"{head} {r['variant']:<32} {r['ms']:.3f} ms  {r['over_base']:.3f}x {r['base']}"
    if r["kind"] == "matmul":
        rate = f"{r['tflops']:4.0f} TF/s (cuBLAS {r['cublas_tflops']:4.0f})"
        return f"{head} {r['layout']} {r['cfg']:<22} {rate}  ratio {r['ratio']:.3f}"
    if r["kind"] == "linear":
        return f"{head} {r['variant']:<40} {r['ms']:.3f} ms  {r['over_matmul']:.3f}x cuBLAS mm"
    if r["kind"] in ("linear_baseline", "rmsnorm"):
        return f"{head} {r['variant']:<40} {r['ms']:.3f} ms"
    if r["kind"] == "compile_time":
        return f"{head} {r['mode']:<40} {r['seconds']:.0f} s to compile"
    if r["kind"] == "copy":
        return f"copy bandwidth {r['GBps']:.0f} GB/s"
    return None


def table(run: Run) -> str:
    lines = [f"{run.meta['device']} · torch {run.meta['torch']} · triton {run.meta['triton']} · {run.meta['date']}"]
    lines += [line for line in map(_row_line, run.rows) if line]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", ""))
    p.add_argument("--deadline", type=float, default=None)
    p.add_argument("--sweep", action="store_true", help="matmul config sweep + linear variants of the best")
    p.add_argument("--configs", default="", help="comma list of SWEEP names to use instead of the sweep")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--layouts", default="KN")
    p.add_argument("--linear", action="store_true", help="linear variants (bias+GELU forms) for the configs")
    p.add_argument("--baselines", action="store_true", help="PyTorch baselines for linear + GELU")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--max-autotune", action="store_true")
    p.add_argument("--rmsnorm", action="store_true")
    p.add_argument("--autotuned", action="store_true", help="include the autotuned default path")
    p.add_argument("--final", action="store_true", help="the recording: interleaved rounds, medians")
    p.add_argument("--msweep", action="store_true", help="(with --final) M from 16 to 4096")
    args = p.parse_args(argv)
    if not runtime.is_gpu():
        sys.exit("bench_lesson6 needs a GPU")
    run = Run(args.out, args.deadline)
    dtypes = args.dtypes.split(",")
    try:
        run.add(kind="copy", GBps=bench.measure_copy_bandwidth())
        if args.final:
            final(run, dtypes, args.rmsnorm, args.msweep, args.max_autotune)
            run.add(kind="autotune_picks", picks={str(k): str(v) for k, v in _autotune_cache().items()})
            return
        configs = {k: SWEEP[k] for k in args.configs.split(",") if k} or SWEEP
        score = {}
        if args.sweep:
            for layout in args.layouts.split(","):
                score = sweep_matmul(run, dtypes, configs, layout) or score
        for dname in dtypes:
            if args.linear:
                names = list(configs) if args.configs else best_configs(score, dname)
                bench_linear_variants(run, dname, {n: SWEEP[n] for n in names}, args.autotuned)
            if args.rmsnorm:
                bench_rmsnorm(run, dname, SHAPES)
            if args.baselines:
                bench_linear_baselines(run, dname, args.compile, args.max_autotune)
        if args.autotuned:
            run.add(kind="autotune_picks", picks={str(k): str(v) for k, v in _autotune_cache().items()})
    except Exception:
        traceback.print_exc()
    finally:
        run.save()
        print("\n" + table(run), flush=True)


def _autotune_cache() -> dict:
    from fusionlab.kernels.matmul import _matmul_tma_autotuned

    return dict(getattr(_matmul_tma_autotuned, "cache", {}))


if __name__ == "__main__":
    main()
