"""Probe: why residual + dropout + norm misses 90% of copy on an H200 (2026-11-26 "H200: the fused
residual + dropout + norm's schedule"), and which launch or tile fixes it.

    PYTHONPATH=. python3 benchmarks/probes/probe_dropout_norm_h200.py [--budget 170] [--quick | --sweep]

One process, one GPU, JSON to ``$OUT/probe_dropout_norm_h200.json`` (or the working directory). bf16,
p = 0.1, LayerNorm (with bias) and RMSNorm, rows x hidden in {32768, 4096} x {4096, 8192} (the issue's
bar shapes, the suite's 32768 x 4096 first). For each shape:

- ``ship``: :func:`fusionlab.kernels.dropout_norm.dropout_norm` as shipped; forward timed as lesson
  4b's suite times it (``bench.time_ms``, the host included) and on the GPU's clock
  (``bench.queued_ms``), backward (an autograd ``grad`` of y and h) on the GPU's clock, as the suite.
- launch configurations of the shipped kernels, by replacing the module's
  ``dropout_norm_config`` for the call (the kernels are unchanged; ``num_warps`` is not one of the
  entry's ``bwd_config`` keys, so the override goes there): warps, programs an SM, row stages, rows a
  program (``BLOCK_M``), the partial-sum kernel placed early (``sum_partials(pdl=True)``), and
  ``no-dropout`` (p = 0: no Philox at all) to price the random numbers.
- ``tile2d``: **this script's own variant of the kernels** (one tile only, int32 offsets: every bar
  shape), the same arithmetic on 2-D ``[BLOCK_M, N]`` tiles instead of the shipped ``[BLOCK_M, N/4, 4]``.
  The shipped 3-D tile's last axis is four elements long, so Triton's loads and stores of a 16-bit row
  are 8-byte vectors (``ld.global.v2.b32``; ``cp.async`` of 8 bytes through L1 for the staged rows);
  a 2-D row tile gets 16-byte ones. The Philox words are made on ``[BLOCK_M, N/4]`` counters and
  interleaved with ``tl.join`` + ``tl.reshape``; the probe checks that its h, y, dx, dresidual, dw and
  db have the shipped kernels' bits (the same mask) before it times them.
- references: the package's own residual + RMSNorm and LayerNorm (no dropout) by their own ledgers
  (the schedules that reach ~90% on an H200), and ``torch.compile`` of the eager chain at the shapes
  the budget leaves room for (the suite's shape first).

Shares are of the copy bandwidth measured at the start, by the fused ledger
(:func:`~fusionlab.kernels.dropout_norm.dropout_norm_ledger`; the references by theirs). ``--budget``
(seconds, default 170) stops the optional candidates once spent, so the whole run stays under four
minutes; ``--quick``: the suite's shape only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch
import triton
import triton.language as tl

import fusionlab  # noqa: F401  (mode first: the kernels below are decorated after it)
from fusionlab import bench, runtime
from fusionlab.kernels import dropout_norm as dn
from fusionlab.kernels import layernorm as ln
from fusionlab.kernels import rmsnorm as rn

DT = torch.bfloat16
P = 0.1
EPS = 1e-5
SHAPES = ((32768, 4096), (32768, 8192), (4096, 4096), (4096, 8192))
NORMS = ("layernorm", "rmsnorm")
DEVICE = "cuda"
SWEEP_SHAPE = (32768, 4096)  # --sweep


# -- the variant: 2-D row tiles, the Philox words interleaved into them --------------------------------------
@triton.jit
def _keep_rows(seed, rows, n_q, offset, threshold, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
               U32: tl.constexpr = False):  # fmt: skip
    """The shipped mask on a [BLOCK_M, 4 BLOCK_Q] row tile: counter ``offset + row n_q + col // 4``,
    word ``col % 4`` of its Philox call (join(join(r0, r2), join(r1, r3)) lays them out r0 r1 r2 r3).
    ``U32``: the same test as one unsigned compare, ``r >= 2 threshold`` (``r >> 1 >= t`` exactly when
    ``r >= 2 t``, and ``2 t < 2**32``): an instruction an element fewer."""
    ctr = offset + rows[:, None] * n_q + tl.arange(0, BLOCK_Q)[None, :]
    r0, r1, r2, r3 = tl.randint4x(seed, ctr)
    r = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), [BLOCK_M, 4 * BLOCK_Q])
    if U32:
        return r >= threshold.to(tl.uint32) * 2
    return (r >> 1).to(tl.int32) >= threshold


@triton.jit(do_not_specialize=["seed", "offset"])
def _fwd_2d(
    x_ptr, r_ptr, w_ptr, b_ptr, h_ptr, y_ptr, mean_ptr, rstd_ptr,
    n_rows, n_cols, seed, offset, threshold, scale, eps,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, RMS: tl.constexpr, HAS_BIAS: tl.constexpr,
    DROPOUT: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    cols = tl.arange(0, 4 * BLOCK_Q)
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    at = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32)
    if DROPOUT:
        x = tl.where(_keep_rows(seed, rows, (n_cols + 3) // 4, offset, threshold, BLOCK_M, BLOCK_Q), x * scale, 0.0)
    h = (r + x).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + at, h, mask=mask)
    hf = h.to(tl.float32)
    if RMS:
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        d = hf
    else:
        mean = tl.sum(hf, axis=1) / n_cols
        d = tl.where(mask, hf - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(d * d, axis=1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = d * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit(do_not_specialize=["seed", "offset"])
def _bwd_2d(
    dy_ptr, gh_ptr, h_ptr, w_ptr, mean_ptr, rstd_ptr, dr_ptr, dx_ptr, part_ptr,
    n_rows, n_cols, rows_per_program, seed, offset, threshold, scale,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, RMS: tl.constexpr, DROPOUT: tl.constexpr,
    NUM_STAGES: tl.constexpr, U32: tl.constexpr = False, DB: tl.constexpr = True, EVEN: tl.constexpr = False,
):  # fmt: skip
    # U32, DB, EVEN (probe_dropout_norm_ab.py's trims, all False/True/False as the shipped kernel): the keep
    # test as one unsigned compare; db summed (False: no bias, RMSNorm); EVEN: N == 4 BLOCK_Q, the column
    # test against the constant so that it folds away
    pid = tl.program_id(0)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    n_q = (n_cols + 3) // 4
    cols = tl.arange(0, 4 * BLOCK_Q)
    col_ok = cols < (4 * BLOCK_Q if EVEN else n_cols)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    dw = tl.zeros([BLOCK_M, 4 * BLOCK_Q], dtype=tl.float32)
    db = tl.zeros([BLOCK_M, 4 * BLOCK_Q], dtype=tl.float32)
    for m0 in tl.range(row_start, row_end, BLOCK_M, num_stages=NUM_STAGES):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        at = rows[:, None] * n_cols + cols[None, :]
        dy = tl.load(dy_ptr + at, mask=mask, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + at, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)[:, None]
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)[:, None]
        nh = tl.where(mask, (h - mean) * rstd, 0.0)
        g = dy * w
        c1 = (tl.sum(g * nh, axis=1) / n_cols)[:, None]
        if RMS:
            dh = rstd * (g - nh * c1)
        else:
            c2 = (tl.sum(g, axis=1) / n_cols)[:, None]
            dh = rstd * (g - c2 - nh * c1)
        dh += tl.load(gh_ptr + at, mask=mask, other=0.0).to(tl.float32)
        tl.store(dr_ptr + at, dh.to(dr_ptr.dtype.element_ty), mask=mask)
        if DROPOUT:
            dh = tl.where(_keep_rows(seed, rows, n_q, offset, threshold, BLOCK_M, BLOCK_Q, U32), dh * scale, 0.0)
        tl.store(dx_ptr + at, dh.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * nh
        if DB:
            db += dy
    n_programs = tl.num_programs(0)
    tl.store(part_ptr + pid * n_cols + cols, tl.sum(dw, axis=0), mask=col_ok)
    tl.store(part_ptr + (n_programs + pid) * n_cols + cols, tl.sum(db, axis=0), mask=col_ok)


def _kw(num_warps):
    return {"num_warps": num_warps} if runtime.is_gpu() else {}


class Tile2D(torch.autograd.Function):
    """The variant as an autograd op with the shipped op's inputs, outputs and saved tensors."""

    @staticmethod
    def forward(ctx, x, r, w, b, args):
        norm, seed, fwd, bwd = args
        rows, n = x.shape
        h, y = torch.empty_like(x), torch.empty_like(x)
        mean = torch.empty(rows, device=x.device, dtype=torch.float32)
        rstd = torch.empty_like(mean)
        thr, scale = dn._threshold(P), 1.0 / (1.0 - P)
        bq = max(16, triton.next_power_of_2(n)) // 4
        _fwd_2d[(triton.cdiv(rows, fwd["BLOCK_M"]),)](
            x, r, w, b if b is not None else w, h, y, mean, rstd, rows, n, seed, 0, thr, scale, EPS,
            BLOCK_M=fwd["BLOCK_M"], BLOCK_Q=bq, RMS=norm == "rmsnorm", HAS_BIAS=b is not None, DROPOUT=True,
            **_kw(fwd["num_warps"]),
        )  # fmt: skip
        ctx.save_for_backward(h, w, mean, rstd)
        ctx.args = (norm, seed, bwd, b is not None, bq)
        return y, h

    @staticmethod
    def backward(ctx, dy, gh):
        h, w, mean, rstd = ctx.saved_tensors
        norm, seed, bwd, has_bias, bq = ctx.args
        rows, n = h.shape
        programs = min(bwd["programs"], triton.cdiv(rows, bwd["BLOCK_M"]))
        per = triton.cdiv(triton.cdiv(rows, programs), bwd["BLOCK_M"]) * bwd["BLOCK_M"]
        programs = triton.cdiv(rows, per)
        dr, dx = torch.empty_like(h), torch.empty_like(h)
        part = torch.empty((2, programs, n), device=h.device, dtype=torch.float32)
        _bwd_2d[(programs,)](
            dy.contiguous(), gh.contiguous(), h, w, mean, rstd, dr, dx, part, rows, n, per, seed, 0,
            dn._threshold(P), 1.0 / (1.0 - P), BLOCK_M=bwd["BLOCK_M"], BLOCK_Q=bq, RMS=norm == "rmsnorm",
            DROPOUT=True, NUM_STAGES=bwd["row_stages"] if runtime.is_gpu() else 1, **_kw(bwd["num_warps"]),
            **{k: bwd[k] for k in ("U32", "DB", "EVEN") if k in bwd},
        )  # fmt: skip
        if not bwd.get("sum", True):  # ``--sweep``: the backward kernel alone, its partial sums left unsummed
            return dx, dr, part[0, 0].to(w.dtype), (part[1, 0].to(w.dtype) if has_bias else None), None
        sums = dn.sum_partials(part if has_bias else part[:1], w.dtype, checked=True)
        return dx, dr, sums[0], (sums[1] if has_bias else None), None


def tile2d(x, r, w, b, norm, seed, fwd, bwd):
    return Tile2D.apply(x, r, w, b, (norm, seed, fwd, bwd))


# -- the shipped kernels under another launch configuration ------------------------------------------------------
@contextlib.contextmanager
def shipped_config(fwd: dict | None = None, bwd: dict | None = None, pdl_sum: bool = False):
    """Calls of ``dn.dropout_norm`` inside take ``fwd``/``bwd`` over the module's own configuration (any
    key, ``num_warps`` included); ``pdl_sum``: the partial sums' kernel launched with PDL."""
    real_cfg, real_sum = dn.dropout_norm_config, dn.sum_partials

    def cfg(n_rows, n_cols, dtype, *, backward=False, gpu=None):
        c = real_cfg(n_rows, n_cols, dtype, backward=backward, gpu=gpu)
        c.update((bwd if backward else fwd) or {})
        return c

    dn.dropout_norm_config = cfg
    dn._PLANS.clear()  # plans kept by call signature hold the configuration they were made with
    if pdl_sum:
        dn.sum_partials = lambda part, dtype, **k: real_sum(part, dtype, pdl=True, checked=True)
    try:
        yield
    finally:
        dn.dropout_norm_config, dn.sum_partials = real_cfg, real_sum
        dn._PLANS.clear()


# -- measuring -------------------------------------------------------------------------------------------------------
def inputs(rows, n, norm, device):
    g = torch.Generator(device=device).manual_seed(0)
    dt = DT if runtime.is_gpu() else torch.float32
    x, r, gy, gh = (torch.randn(rows, n, device=device, dtype=dt, generator=g) for _ in range(4))
    w = torch.randn(n, device=device, dtype=dt, generator=g)
    b = torch.randn(n, device=device, dtype=dt, generator=g) if norm == "layernorm" else None
    return x, r, w, b, gy, gh


def training(fn, x, r, w, b, gy, gh):
    """``(call, (y, h), first grads)`` for ``fn(x, r, w, b) -> (y, h)``: ``call()`` runs the backward of
    one forward kept alive (``retain_graph``), as lesson 4b's suite does."""
    ins = [t.detach().requires_grad_() for t in (x, r, w) + ((b,) if b is not None else ())]
    y, h = fn(*ins[:3], ins[3] if b is not None else None)
    first = torch.autograd.grad((y, h), ins, (gy, gh), retain_graph=True)

    def call():
        return torch.autograd.grad((y, h), ins, (gy, gh), retain_graph=True)

    return call, (y.detach(), h.detach()), first


def same_op(ref_out, ref_grads, out, grads) -> dict:
    """Does the variant compute the shipped op? h exactly (it holds the mask's scaled x), dx zero exactly
    where the shipped dx is (the regenerated mask), the rest to a few bf16 roundings: the variant's
    row sums add in another tree order."""

    def close(a, c):
        return bool(torch.allclose(a.float(), c.float(), rtol=2e-2, atol=2e-2 * float(a.float().abs().max())))

    got = {
        "h_exact": bool(torch.equal(ref_out[1], out[1])),
        "y_close": close(ref_out[0], out[0]),
        "dx_mask_exact": bool(torch.equal(ref_grads[0] == 0, grads[0] == 0)),
        "grads_close": all(close(a, c) for a, c in zip(ref_grads, grads, strict=True)),
    }
    got["ok"] = all(got.values())
    return got


def check(device="cpu"):
    """``--check`` (CPU, Triton's interpreter, fp32, small rows): the variant against the shipped op."""
    ok = True
    for norm in NORMS:
        for rows, n in ((8, 64), (5, 100), (3, 4096)):
            x, r, w, b, gy, gh = inputs(rows, n, norm, device)
            v = {"BLOCK_M": 1, "num_warps": 4, "programs": 2, "row_stages": 1}

            def ship(x, r, w, b, norm=norm):
                return dn.dropout_norm(x, r, w, b, P, norm=norm, seed=77)

            _, ref_out, ref_grads = training(ship, x, r, w, b, gy, gh)
            _, out, grads = training(lambda x, r, w, b, norm=norm: tile2d(x, r, w, b, norm, 77, v, v),
                                     x, r, w, b, gy, gh)  # fmt: skip
            res = same_op(ref_out, ref_grads, out, grads)
            print(norm, rows, n, res)
            ok &= res["ok"]
    print("check:", "the variant computes the shipped op" if ok else "DIFFERENT")
    return ok


def summary(out):
    """The table: per norm, shape and direction, the shipped op, its best launch, the 2-D tile's best, the
    package's own norm and torch.compile (% of copy; ratio: compiled's time over the best fused one's)."""
    print(f"\n{'case':34s} {'ship':>7s} {'best launch (ship)':>44s} {'tile2d best':>12s} {'own norm':>9s} "
          f"{'compiled':>9s} {'x compiled':>10s}")  # fmt: skip
    keys = dict.fromkeys((r["norm"], r["rows"], r["n"], r["dir"]) for r in out["rows"])
    for norm, rows, n, d in keys:
        rs = [r for r in out["rows"] if (r["norm"], r["rows"], r["n"], r["dir"]) == (norm, rows, n, d)]

        def pick(pred):
            got = [r for r in rs if pred(r)]
            return max(got, key=lambda r: r["frac_copy"]) if got else None

        ship = pick(lambda r: r["case"] == "ship" and r["clock"] == ("time_ms" if d == "fwd" else "queued"))
        best = pick(lambda r: r["case"].startswith("ship") and "no-dropout" not in r["case"])
        t2 = pick(lambda r: r["case"].startswith("tile2d"))
        own = pick(lambda r: r["case"].startswith("own"))
        comp = pick(lambda r: r["case"] == "compiled")
        fused = min((r["ms"] for r in (best, t2) if r), default=None)

        def pct(r):
            return f"{r['frac_copy']:.1%}" if r else "-"

        ratio = f"{comp['ms'] / fused:.2f}" if comp and fused else "-"
        best_s = f"{pct(best)} {best['case'][5:] or 'as shipped'}" if best else "-"
        print(f"{norm} {rows}x{n} {d:3s}{'':{34 - len(norm) - len(str(rows)) - len(str(n)) - 6}s} {pct(ship):>7s} "
              f"{best_s[:44]:>44s} {pct(t2):>12s} {pct(own):>9s} {pct(comp):>9s} {ratio:>10s}")  # fmt: skip


def sweep(budget: float):
    """``--sweep`` (the 2026-11-26 second round): the 2-D tile's backward at 32768 x 4096, the one bar shape
    it left under 90% of copy at the shipped launch (80.7% LayerNorm, 83.4% RMSNorm; 85.7% and 86.6% at 4
    warps, 4 programs an SM): warps, programs an SM, row stages and rows a step, each with and without the
    partial-sum kernel (``sum``: False leaves dw, db unsummed, which prices that kernel and its bytes)."""
    t0 = time.monotonic()
    copy = bench.measure_copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    name = torch.cuda.get_device_name()
    print(f"{name}, {sms} SMs, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s")
    out = {"device": name, "sms": sms, "torch": torch.__version__, "triton": triton.__version__,
           "copy_GBps": copy, "rows": [], "skipped": []}  # fmt: skip
    rows, n = SWEEP_SHAPE
    cands = [
        (bm, nw, per_sm, stages)
        for bm, nw in ((1, 4), (1, 8), (2, 8), (2, 16))
        for per_sm in (1, 2, 3, 4, 6)
        for stages in (2, 3, 4)
        if per_sm * nw <= 32
    ]
    for norm in NORMS:
        x, r, w, b, gy, gh = inputs(rows, n, norm, DEVICE)
        t = (x, r, w, b, gy, gh)
        bb = dn.dropout_norm_ledger(rows, n, DT, norm=norm, backward=True).fused_bytes
        for bm, nw, per_sm, stages in cands:
            for with_sum in (True, False):
                if time.monotonic() - t0 > budget:
                    out["skipped"].append(f"{norm} {bm} {nw} {per_sm} {stages} {with_sum}")
                    continue
                vb = {"BLOCK_M": bm, "num_warps": nw, "programs": per_sm * sms, "row_stages": stages, "sum": with_sum}
                fn = lambda x, r, w, b, norm=norm, vb=vb: tile2d(
                    x, r, w, b, norm, 1234, {"BLOCK_M": 1, "num_warps": 8}, vb
                )  # noqa: E731
                call, _, _ = training(fn, *t)
                ms = bench.queued_ms(call)
                frac = bb / (ms * 1e-3) / 1e9 / copy
                out["rows"].append(dict(norm=norm, rows=rows, n=n, dir="bwd", ms=ms, frac_copy=frac, config=vb))
                sums = "with" if with_sum else "without"
                print(f"  {norm:9s} BLOCK_M {bm} warps {nw:2d} programs {per_sm} a SM stages {stages} "
                      f"{sums} the partial sums: {ms * 1e3:7.1f} us {frac:6.1%}")  # fmt: skip
                del call
        t = x = r = w = b = gy = gh = None
        torch.cuda.empty_cache()
    for norm in NORMS:
        got = [row for row in out["rows"] if row["norm"] == norm and row["config"]["sum"]]
        best = max(got, key=lambda row: row["frac_copy"]) if got else None
        if best:
            print(f"best {norm}: {best['frac_copy']:.1%} at {best['config']}")
    out["seconds"] = time.monotonic() - t0
    dest = os.path.join(os.environ.get("OUT", "."), "probe_dropout_norm_h200_sweep.json")
    with open(dest, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"skipped (budget): {len(out['skipped'])}; {out['seconds']:.0f} s; wrote {dest}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=170.0, help="seconds before optional cases are skipped")
    ap.add_argument("--quick", action="store_true", help="the suite's shape only")
    ap.add_argument("--check", action="store_true", help="CPU: the variant against the shipped op, no timing")
    ap.add_argument("--sweep", action="store_true", help="the 2-D tile's backward at hidden 4096, launches swept")
    a = ap.parse_args()
    if a.check:
        raise SystemExit(0 if check() else 1)
    if a.sweep:
        return sweep(a.budget)
    t0 = time.monotonic()
    copy = bench.measure_copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    name = torch.cuda.get_device_name()
    print(f"{name}, {sms} SMs, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s")
    out = {"device": name, "sms": sms, "torch": torch.__version__, "triton": triton.__version__,
           "copy_GBps": copy, "configs": {}, "checks": {}, "rows": [], "skipped": []}  # fmt: skip
    shapes = SHAPES[:1] if a.quick else SHAPES

    def left():
        return a.budget - (time.monotonic() - t0)

    def record(norm, shape, case, d, ms, nbytes, clock, **extra):
        frac = nbytes / (ms * 1e-3) / 1e9 / copy
        out["rows"].append(dict(norm=norm, rows=shape[0], n=shape[1], case=case, dir=d, ms=ms, clock=clock,
                                frac_copy=frac, **extra))  # fmt: skip
        print(f"  {norm:9s} {shape[0]:5d} x {shape[1]:4d} {d} {case:48s} {clock:7s} {ms * 1e3:8.1f} us {frac:6.1%}")

    def setup(shape, norm):
        rows, n = shape
        x, r, w, b, gy, gh = inputs(rows, n, norm, DEVICE)
        fb = dn.dropout_norm_ledger(rows, n, DT, norm=norm).fused_bytes
        bb = dn.dropout_norm_ledger(rows, n, DT, norm=norm, backward=True).fused_bytes
        return (x, r, w, b, gy, gh), fb, bb

    def ship_fn(norm, p=P):
        return lambda x, r, w, b: dn.dropout_norm(x, r, w, b, p, norm=norm, seed=1234)

    def time_pair(norm, shape, case, fn, t, fb, bb, fwd_clock="queued", **extra):
        """fn's forward (no grad) and its backward, recorded under ``case``."""
        x, r, w, b, gy, gh = t
        with torch.no_grad():
            timer = bench.time_ms if fwd_clock == "time_ms" else bench.queued_ms
            record(norm, shape, case, "fwd", timer(lambda: fn(x, r, w, b)), fb, fwd_clock, **extra)
        call, _, _ = training(fn, *t)
        record(norm, shape, case, "bwd", bench.queued_ms(call), bb, "queued", **extra)

    # 1. every shape: the shipped op (the suite's clocks, and the forward on the GPU's clock too), the
    #    2-D tile variant at the shipped launch (checked against the shipped op first), the package's
    #    own norms without dropout
    for shape in shapes:
        rows, n = shape
        for norm in NORMS:
            t, fb, bb = setup(shape, norm)
            x, r, w, b, gy, _ = t
            base_f = dn.dropout_norm_config(rows, n, DT)
            base_b = dn.dropout_norm_config(rows, n, DT, backward=True)
            out["configs"][f"{norm} {rows}x{n}"] = {"fwd": base_f, "bwd": base_b}
            ship = ship_fn(norm)
            with torch.no_grad():
                record(norm, shape, "ship", "fwd", bench.time_ms(lambda: ship(x, r, w, b)), fb, "time_ms")
            time_pair(norm, shape, "ship", ship, t, fb, bb)
            v_f = {"BLOCK_M": 1, "num_warps": base_f["num_warps"]}
            v_b = dict(v_f, num_warps=base_b["num_warps"], programs=base_b["programs"],
                       row_stages=base_b.get("row_stages", 1))  # fmt: skip
            _, ref_out, ref_grads = training(ship, *t)
            fn2 = lambda x, r, w, b, norm=norm, vf=v_f, vb=v_b: tile2d(x, r, w, b, norm, 1234, vf, vb)  # noqa: E731
            _, got_out, got_grads = training(fn2, *t)
            same = same_op(ref_out, ref_grads, got_out, got_grads)
            out["checks"][f"{norm} {rows}x{n}"] = same
            if not same["ok"]:
                print(f"  tile2d {norm} {shape}: NOT the shipped op: {same}")
            del ref_out, ref_grads, got_out, got_grads
            time_pair(norm, shape, "tile2d (shipped launch)", fn2, t, fb, bb, config={"fwd": v_f, "bwd": v_b},
                      same=same["ok"])  # fmt: skip
            if norm == "rmsnorm":
                own = lambda x, r, w, b: rn.rmsnorm(x, w, EPS, r)  # noqa: E731
                led_f = rn.rmsnorm_ledger(rows, n, DT).fused_bytes
                led_b = rn.rmsnorm_ledger(rows, n, DT, backward=True, grad_h=True).fused_bytes
                time_pair(norm, shape, "own rmsnorm+residual (no dropout)", own, t, led_f, led_b)
            else:
                led_f = ln.layernorm_ledger(rows, n, DT).fused_bytes
                led_b = ln.layernorm_ledger(rows, n, DT, backward=True).fused_bytes
                with torch.no_grad():
                    ms = bench.queued_ms(lambda: ln.layernorm(x, w, b, EPS))
                record(norm, shape, "own layernorm (no dropout, no residual)", "fwd", ms, led_f, "queued")
                xi, wi, bi = (u.detach().requires_grad_() for u in (x, w, b))
                y = ln.layernorm(xi, wi, bi, EPS)
                ms = bench.queued_ms(lambda: torch.autograd.grad(y, (xi, wi, bi), gy, retain_graph=True))
                record(norm, shape, "own layernorm (no dropout, no residual)", "bwd", ms, led_b, "queued")
                del y
            t = x = r = w = b = gy = None  # freed before the next shape
            torch.cuda.empty_cache()

    def compiled(shape, norm):
        torch._dynamo.reset()  # a fresh compile a shape (past the recompile limit Dynamo runs eager)
        t, fb, bb = setup(shape, norm)
        x, r, w, b, gy, gh = t
        comp = torch.compile(lambda x, r, w, b: dn.dropout_norm_eager(x, r, w, b, P, norm=norm), dynamic=False)
        with torch.no_grad():
            comp(x, r, w, b)
            record(norm, shape, "compiled", "fwd", bench.time_ms(lambda: comp(x, r, w, b)), fb, "time_ms")
        call, _, _ = training(comp, *t)
        record(norm, shape, "compiled", "bwd", bench.queued_ms(call), bb, "queued")
        del call, t
        torch.cuda.empty_cache()

    # 2. torch.compile at the suite's shape
    for norm in NORMS:
        compiled(shapes[0], norm)

    # 3. launch configurations at the 32768-row shapes, while the budget lasts
    fwd_cands = [{"num_warps": 4}, {"num_warps": 16}]
    for shape, norm in [(s, nm) for s in shapes if s[0] == max(r for r, _ in shapes) for nm in NORMS]:
        t, fb, bb = setup(shape, norm)
        x, r, w, b = t[:4]
        ship = ship_fn(norm)
        bwd_cands = [
            {"programs": sms}, {"programs": 4 * sms}, {"row_stages": 2},
            {"num_warps": 4, "programs": 4 * sms}, {"num_warps": 16, "programs": sms},
        ]  # fmt: skip
        for c in fwd_cands:
            if left() < 0:
                out["skipped"].append(f"{norm} {shape} fwd {c}")
                continue
            with shipped_config(fwd=c), torch.no_grad():
                ms = bench.queued_ms(lambda: ship(x, r, w, b))
            record(norm, shape, f"ship {c}", "fwd", ms, fb, "queued", config=c)
        for c in [*bwd_cands, "pdl_sum", "no-dropout (p = 0)"]:
            if left() < 0:
                out["skipped"].append(f"{norm} {shape} bwd {c}")
                continue
            if c == "pdl_sum":
                ctx, fn = shipped_config(pdl_sum=True), ship
            elif isinstance(c, str):
                ctx, fn = contextlib.nullcontext(), ship_fn(norm, 0.0)
            else:
                ctx, fn = shipped_config(bwd=c), ship
            with ctx:
                call, _, _ = training(fn, *t)
                record(norm, shape, f"ship {c}", "bwd", bench.queued_ms(call), bb, "queued",
                       config=c if isinstance(c, dict) else None)  # fmt: skip
                del call
        base_b = dn.dropout_norm_config(*shape, DT, backward=True)
        v_f = {"BLOCK_M": 1, "num_warps": dn.dropout_norm_config(*shape, DT)["num_warps"]}
        v_b = dict(BLOCK_M=1, num_warps=base_b["num_warps"], programs=base_b["programs"],
                   row_stages=base_b.get("row_stages", 1))  # fmt: skip
        variants = [({"BLOCK_M": 1, "num_warps": 4}, dict(v_b, num_warps=4, programs=4 * sms)),
                    ({"BLOCK_M": 1, "num_warps": 16}, dict(v_b, num_warps=16, programs=sms))]  # fmt: skip
        for vf, vb in variants:
            if left() < 0:
                out["skipped"].append(f"{norm} {shape} tile2d {vf} {vb}")
                continue
            fn2 = lambda x, r, w, b, norm=norm, vf=vf, vb=vb: tile2d(x, r, w, b, norm, 1234, vf, vb)  # noqa: E731
            label = f"tile2d warps {vf['num_warps']}/{vb['num_warps']} programs {vb['programs']}"
            time_pair(norm, shape, label, fn2, t, fb, bb, config={"fwd": vf, "bwd": vb})
        t = x = r = w = b = None  # freed before the next shape
        torch.cuda.empty_cache()

    # 4. torch.compile at the other shapes, while the budget lasts (two compiles each)
    for shape in shapes[1:]:
        for norm in NORMS:
            if left() < 20:
                out["skipped"].append(f"compiled {norm} {shape}")
                continue
            compiled(shape, norm)

    summary(out)
    out["seconds"] = time.monotonic() - t0
    dest = os.path.join(os.environ.get("OUT", "."), "probe_dropout_norm_h200.json")
    with open(dest, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"skipped (budget): {out['skipped'] or 'none'}")
    print(f"{out['seconds']:.0f} s; wrote {dest}")


if __name__ == "__main__":
    main()
