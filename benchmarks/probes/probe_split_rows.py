"""Probe: a row split across programs that swap their (max, sum) through global memory.

    PYTHONPATH=. python3 benchmarks/probes/probe_split_rows.py [--out $OUT] [--quick]

The question (benchmarks/NOTES.md, 2026-11-24 "softmax rows split across programs"): softmax rows wider than one tile
are read twice
(the online path), and cross-entropy rows wider than the head are read twice (sweep 2's re-read from
L2); on an H200 both stop near 75-88% of copy. If a row's S chunks are each held in registers by
their own program, and the S programs exchange their partial (max, sum) through a small buffer,
every row is read once and written once. The cost: the programs of a row wait for each other.

Safety of the wait: a program takes its row from an atomic ticket, not from its program id, so a
program waits only on tickets taken after its own by programs that are already running or will
start when a slot frees: S <= the programs resident on the GPU is enough (no assumption about the
order the hardware starts programs in). GPU only: the interpreter runs programs one at a time.

The probe's softmax kernel keeps two variants the package does not ship: the program id in place of
the ticket (TICKET=False) and x kept in its storage dtype with the exp computed twice (RECOMPUTE). Its
cross-entropy sweep runs the package's split kernel (the first runs, in NOTES.md, used a probe kernel
with the ticket variant, since merged into the package). The exchange is the package's
(``_split_ticket``, ``_split_wait``, ``_split_merge`` in ``fusionlab/kernels/softmax.py``).

Also: the package's softmax at 4096 x 32768 against 4224 rows (16 full waves of 2 programs a SM on
132 SMs) and 16384 rows, to see how much of the 32768-wide miss is the last wave.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels._cross_entropy_kernels import _launch_split, _prologue
from fusionlab.kernels._rows import _split_merge, _split_ticket, _split_wait
from fusionlab.kernels.cross_entropy import cross_entropy_config, cross_entropy_rows
from fusionlab.kernels.softmax import softmax

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _take_ticket(sync_ptr, S: tl.constexpr, TICKET: tl.constexpr):
    if TICKET:
        row, part = _split_ticket(sync_ptr, S)
    else:  # the program id: safe only if the hardware starts programs in order (probe only)
        t = tl.program_id(0)
        row, part = (t // S).to(tl.int64), t % S
    return row, part


@triton.jit
def _probe_softmax_split_kernel(
    x_ptr,
    y_ptr,
    sync_ptr,
    part_ptr,
    n_cols,
    stride,
    S: tl.constexpr,
    SP: tl.constexpr,
    CHUNK: tl.constexpr,
    TICKET: tl.constexpr,
    RECOMPUTE: tl.constexpr,
):
    row, s = _take_ticket(sync_ptr, S, TICKET)
    offs = s * CHUNK + tl.arange(0, CHUNK)
    mask = offs < n_cols
    x_raw = tl.load(x_ptr + row * stride + offs, mask=mask, other=float("-inf"))
    x = x_raw.to(tl.float32)
    m = tl.max(x, axis=0)
    ref = tl.where(m == float("-inf"), 0.0, m)
    e = tl.math.exp2((x - ref) * LOG2E)
    parts = part_ptr + row * (2 * S)  # publish (m, d), wait for the row, merge: the package's helpers
    tl.store(parts + s, m)
    tl.store(parts + S + s, tl.sum(e, axis=0))
    _split_wait(sync_ptr, row, S)
    big, d = _split_merge(parts, S, SP)
    # an all -inf row: big 0, d 0: 0 / 0 = NaN, as torch
    if RECOMPUTE:  # x kept in its storage dtype across the wait: fewer registers, a second exp2
        y = tl.math.exp2((x_raw.to(tl.float32) - big) * LOG2E) / d
    else:
        y = e * (tl.math.exp2((ref - big) * LOG2E) / d)
    tl.store(y_ptr + row * stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def warps_for(chunk, thread_bytes, elt=2):
    return max(1, min(32, chunk * elt // thread_bytes // 32))


def softmax_split(x, chunk, warps, ticket=True, recompute=False):
    rows, n = x.shape
    S = triton.cdiv(n, chunk)
    y = torch.empty_like(x)
    sync = torch.zeros(rows + 1, dtype=torch.int32, device=x.device)
    part = torch.empty(rows * 2 * S, dtype=torch.float32, device=x.device)
    _probe_softmax_split_kernel[(rows * S,)](
        x,
        y,
        sync,
        part,
        n,
        x.stride(0),
        S=S,
        SP=triton.next_power_of_2(S),
        CHUNK=chunk,
        TICKET=ticket,
        RECOMPUTE=recompute,
        num_warps=warps,
    )
    return y


def ce_split(x, t, grad, loss_rows, chunk, warps, ignore_index=-100):
    """The package's split cross-entropy kernel ("mean") with parts of ``chunk`` columns and ``warps``
    warps, after its prologue (the count and the zeroed tickets)."""
    cfg = {"SPLIT": triton.cdiv(x.shape[1], chunk), "SPLIT_BLOCK": chunk, "SPLIT_WARPS": warps}
    sync = _prologue(t, ignore_index, count=True, n_rows_split=x.shape[0])
    _launch_split(x, t, grad, loss_rows, sync, ignore_index, 0.0, cfg, True)


def ce_package(x, t, grad, loss_rows, cfg, ignore_index=-100):
    """The package's kernel for this configuration ("mean", per-row losses), after its prologue."""
    sync = _prologue(t, ignore_index, count=True, n_rows_split=x.shape[0] if cfg.get("SPLIT") else None)
    cross_entropy_rows(x, t, grad, loss_rows, sync, ignore_index, 0.0, cfg, mean=True)


def check_softmax(chunk, warps):
    errs = []
    for rows, n in ((3, 1), (5, 4097), (7, 65537), (2, 131072), (300, 40000)):
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) * 8 + 1000
        x[0, : n // 2] = float("-inf")
        if rows > 2:
            x[1] = float("-inf")
        y = softmax_split(x, chunk, warps).double()
        r = torch.softmax(x.double(), -1)
        ok = torch.isnan(y) == torch.isnan(r)
        err = (y - r).nan_to_num().abs().max().item()
        errs.append(err if bool(ok.all()) else float("inf"))
    return max(errs)


def check_ce(chunk, warps):
    errs = []
    for rows, n in ((5, 3), (33, 50000), (64, 128256), (17, 262144)):
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) * 4
        x[1, n // 2] = 1e4  # a logit far above the rest
        t = torch.randint(0, n, (rows,), device="cuda")
        t[::3] = -100
        g = torch.empty_like(x)
        lr = torch.empty(rows, device="cuda")
        nv = (t != -100).sum()
        ce_split(x, t, g, lr, chunk, warps)
        xr = x.double().requires_grad_()
        ref = torch.nn.functional.cross_entropy(xr, t, reduction="none")
        (gr,) = torch.autograd.grad(ref.sum() / nv, xr)
        el = (lr.double() - ref.detach()).abs().max().item()
        eg = ((g.double() - gr).norm() / gr.norm()).item()
        errs.append(max(el, eg))
    return max(errs)


def compare(copy, out):
    """The package as shipped: softmax's split schedule against its online path (split=False), 256 MiB
    a width, and the narrow rows' rate (4096 wide, one tile) the wide-row bar is read against."""
    rows_out = []
    for dtype in (torch.bfloat16, torch.float32):
        elt = torch.empty((), dtype=dtype).element_size()
        for n in (4096, 65536, 131072, 262144, 524288):
            rows = 2**28 // (n * elt)
            x = torch.randn(rows, n, device="cuda", dtype=dtype)
            nb = 2 * x.numel() * elt
            for label, fn in (("default", lambda: softmax(x)), ("online", lambda: softmax(x, split=False))):
                if n == 4096 and label == "online":
                    continue
                ms = min(bench.time_ms(fn) for _ in range(2))
                frac = nb / (ms * 1e-3) / 1e9 / copy
                rows_out.append({"dtype": str(dtype), "n": n, "schedule": label, "ms": ms, "frac_2trips": frac})
                print(
                    f"  softmax {str(dtype):15s} {rows:>6} x {n:<7} {label:8s} {ms:8.4f} ms  {frac:6.1%} (2 trips)",
                    flush=True,
                )
            x = None
    with open(os.path.join(out, "softmax_split_vs_online.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_GBps": copy, "rows": rows_out}, f, indent=1)


def compare_ce(copy, out):
    """The package's cross-entropy fwd+bwd (bf16, out of place) with its split rows against its
    head-and-tail kernel (``head_n`` given: the split is off), on the GPU clock (queued) and as a call."""
    from fusionlab.kernels.cross_entropy import cross_entropy

    rows_out = []
    for tokens, vocab in ((8192, 128256), (8192, 151936), (4096, 256000), (4096, 262144)):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, generator=g) * 2
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        xg = x.requires_grad_()
        head = cross_entropy_config(vocab, x.dtype)["HEAD"]
        nb = 2 * x.numel() * 2
        for label, kw in (("default", {}), ("head-and-tail", {"head_n": head})):

            def fn(kw=kw):
                return torch.autograd.grad(cross_entropy(xg, t, **kw), xg)

            ms = bench.time_ms(fn)
            msq = bench.queued_ms(fn)
            rows_out.append({"tokens": tokens, "vocab": vocab, "schedule": label, "call_ms": ms, "gpu_ms": msq})
            print(
                f"  ce {tokens:>5} x {vocab:<7} {label:14s} call {ms:7.3f} ms {nb / ms / 1e6 / copy:6.1%}  "
                f"GPU clock {msq:7.3f} ms {nb / msq / 1e6 / copy:6.1%}",
                flush=True,
            )
        x = xg = None
    with open(os.path.join(out, "ce_split_vs_head.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_GBps": copy, "rows": rows_out}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ce", action="store_true", help="the package's cross-entropy split against its head-and-tail")
    ap.add_argument("--compare", action="store_true", help="the package's split against its online path only")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/probe_split"))
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    copy = bench.measure_copy_bandwidth()
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
        f"copy {copy:.0f} GB/s, {torch.cuda.get_device_properties(0).multi_processor_count} SMs",
        flush=True,
    )
    if a.compare or a.ce:
        if a.compare:
            compare(copy, a.out)
        if a.ce:
            compare_ce(copy, a.out)
        return
    res = {"device": torch.cuda.get_device_name(), "copy_GBps": copy, "rows": []}

    def rec(kind, shape, label, ms, nbytes, extra=""):
        frac = nbytes / (ms * 1e-3) / 1e9 / copy
        res["rows"].append({"kind": kind, "shape": shape, "label": label, "ms": ms, "frac": frac})
        print(f"  {kind:8s} {str(shape):16s} {label:34s} {ms:8.4f} ms  {frac:6.1%} {extra}", flush=True)

    # -- correctness first (a hang here would show before any timing)
    for chunk, tb in ((8192, 32), (16384, 32), (16384, 64), (32768, 64)):
        w = warps_for(chunk, tb)
        print(
            f"check chunk {chunk} w{w}: softmax max err {check_softmax(chunk, w):.2e}, "
            f"ce max err {check_ce(chunk, w):.2e}",
            flush=True,
        )

    # -- softmax: the package against split chunks, 256 MiB bf16
    variants = [(c, w) for c, ws in ((4096, (2, 4)), (8192, (4, 8)), (16384, (8, 16))) for w in ws]
    widths = (32768, 65536) if a.quick else (32768, 65536, 262144)
    for n in widths:
        rows = 2**27 // n
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        nb = 2 * x.numel() * 2
        rec("softmax", (rows, n), "package", bench.time_ms(lambda: softmax(x)), nb)
        for chunk, w in variants:
            for ticket in (True, False):
                for recompute in (False, True):
                    label = f"split {chunk} w{w} t{int(ticket)} r{int(recompute)}"
                    try:
                        f = lambda: softmax_split(x, chunk, w, ticket, recompute)  # noqa: E731
                        rec("softmax", (rows, n), label, bench.time_ms(f), nb)
                    except Exception as e:
                        print(f"  failed {label}: {type(e).__name__} {str(e)[:120]}", flush=True)
        x = None  # free before the next shape
    # the last wave: 4096 rows of 32768 on 2 x 132 programs is 15.5 rows a program
    for rows in (4096, 4224, 16384):
        x = torch.randn(rows, 32768, device="cuda", dtype=torch.bfloat16)
        rec("wave", (rows, 32768), "package", bench.time_ms(lambda: softmax(x)), 2 * x.numel() * 2)
        x = None  # free before the next shape

    # -- cross-entropy fwd+bwd kernels (GPU-bound sizes), out of place
    shapes = ((8192, 32000), (8192, 128256)) if a.quick else ((8192, 32000), (8192, 128256), (4096, 262144))
    for rows, n in shapes:
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) * 2
        t = torch.randint(0, n, (rows,), device="cuda")
        g = torch.empty_like(x)
        lr = torch.empty(rows, device="cuda")
        nb = 2 * x.numel() * 2
        cfg = cross_entropy_config(n, x.dtype, stride=x.stride(0))
        rec(
            "ce",
            (rows, n),
            "package kernel",
            bench.time_ms(lambda: ce_package(x, t, g, lr, cfg)),
            nb,
        )
        for chunk, w in variants:
            label = f"split {chunk} w{w}"
            try:
                f = lambda: ce_split(x, t, g, lr, chunk, w)  # noqa: E731
                rec("ce", (rows, n), label, bench.time_ms(f), nb)
            except Exception as e:
                print(f"  failed {label}: {type(e).__name__} {str(e)[:120]}", flush=True)
        x = g = None  # free before the next shape
    with open(os.path.join(a.out, "probe_split_rows.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"took {time.time() - t0:.0f} s")
