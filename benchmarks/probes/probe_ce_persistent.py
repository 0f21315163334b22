"""Probe: cross-entropy rows of up to 32 Ki logits walked by persistent programs, the softmax's schedule
(benchmarks/notes_lesson5.md, 2026-11-24 "persistent whole rows at 32000, and why they were not shipped").

    PYTHONPATH=. python3 benchmarks/probes/probe_ce_persistent.py

    PYTHONPATH=. python3 benchmarks/probes/probe_ce_persistent.py --ir       # TTGIR and times of PARTS 0/6/9/10
    PYTHONPATH=. python3 benchmarks/probes/probe_ce_persistent.py --widths   # the two best loops across widths

The configurations in ``configs`` are the last round's; ``PARTS`` bisects what cross-entropy adds to
the softmax's loop (see the kernel). notes_lesson5.md, 2026-11-24 "persistent whole rows at 32000": any per-row use of
the target
in the loop cost 10-25 points; with the targets gathered before the loop and the statistics kept in
vectors (PARTS=6, a fix-up kernel after) the loop ran at 90% of copy on the H200, but a package version
built on it gained 1.7 points there and lost 4-9 on the H100: not shipped. 2026-11-24 "cross-entropy at 32000 on the
H200": the
cost was the one-hot compare in int64 (every lane's column index widened, PARTS=12 shows it with the
target loaded before the loop), not the pipeliner; compared in int32, with ignored rows not read
(PARTS=10) at 16 warps, the loop reached 90.4% on the H200 and shipped as the package's rows kernel
(the H200's alone: the H100 loses 4-7 points with it).

Lesson 4's softmax reaches 87-88% of copy on an H200 at 4096 x 32768 (91% at 16384 rows) with a few
programs a SM that each walk rows pid, pid + P, ..., the next rows' loads pipelined through shared
memory (``tl.range(..., num_stages=3)``) while this one reduces and writes. Cross-entropy at 32000 has
the same traffic (read a row once, write its gradient once) and ships a head of 8192 in registers with
the rest streamed twice: 82.5% on the H200, under the 85% bar. Here the softmax's schedule carries
cross-entropy's arithmetic: no branch on the target (an ignored row is a multiply by 0), the target's
one-hot subtracted in the tile (no scalar store after a barrier), the reference either the row's
maximum (one more reduction) or the target's logit (no maximum; the package falls back to the maximum
when the sum leaves fp32's safe range, left out here). fwd+bwd bf16 "mean" through the package's
prologue and finish kernels, GPU clock, share of copy by two trips; the package's own ``_loss`` (the
same three launches) beside it. Each configuration checked against float64 on rows with ignored
targets first.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import cross_entropy as ce
from fusionlab.kernels._launch import sm_count
from fusionlab.kernels.softmax import softmax

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _ce_rows_kernel(
    x_ptr,
    t_ptr,
    g_ptr,
    loss_ptr,
    sync_ptr,
    n_rows,
    n_cols,
    stride_xm,
    stride_gm,
    ignore_index,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
    REF_TARGET: tl.constexpr,
    EVEN: tl.constexpr,
    XY_REG: tl.constexpr = False,
    Y_AHEAD: tl.constexpr = False,
    PARTS: tl.constexpr = 3,
    MAX_ROWS: tl.constexpr = 64,
):
    # PARTS (a bisection of what the softmax does not do): 0 a softmax's work (no target at all), 1 the
    # target loaded and its one-hot subtracted, 2 also the loss stored, 3 also x_y (the full loss)
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK_N)
    col_ok = offs < n_cols
    scale = 1.0 / tl.load(sync_ptr).to(tl.float32)
    step = tl.num_programs(0)
    if PARTS >= 6:
        idx = tl.arange(0, MAX_ROWS)
        my_rows = pid + step * idx.to(tl.int64)
        lses = tl.zeros([MAX_ROWS], tl.float32)
    if PARTS == 4:
        # the program's targets, their logits and its losses as vectors of MAX_ROWS: no scalar load or
        # store in the pipelined loop (each cost 10-20 points); a row's own picked out by a reduction
        idx = tl.arange(0, MAX_ROWS)
        my_rows = pid + step * idx.to(tl.int64)
        ys = tl.load(t_ptr + my_rows, mask=my_rows < n_rows, other=ignore_index)
        ys_ok = (ys >= 0) & (ys < n_cols)
        xys = tl.load(x_ptr + my_rows * stride_xm + ys, mask=ys_ok, other=float("nan")).to(tl.float32)
        losses = tl.zeros([MAX_ROWS], tl.float32)
    if PARTS >= 9:
        # the targets and their logits gathered before the loop, for the losses after it; in the loop
        # a row's target is a one-element tensor broadcast against the tile (no reduction, no scalar)
        ys = tl.load(t_ptr + my_rows, mask=my_rows < n_rows, other=ignore_index)
        ys_ok = (ys >= 0) & (ys < n_cols)
        xys = tl.load(x_ptr + my_rows * stride_xm + ys, mask=ys_ok, other=float("nan")).to(tl.float32)
        one = tl.arange(0, 1)
    if PARTS == 12:
        y_first = tl.load(t_ptr + pid + one)
    if Y_AHEAD and PARTS >= 9:
        y_next = tl.load(t_ptr + pid + one, mask=pid + one < n_rows, other=ignore_index)
    elif Y_AHEAD:  # the next row's target loaded a row ahead, in a register
        y_next = tl.load(t_ptr + pid, mask=pid < n_rows, other=ignore_index)
    for row in tl.range(pid, n_rows, step, num_stages=STAGES):
        r = tl.full([], 0, tl.int64) + row  # int64 offsets (row.to fails in the interpreter)
        if PARTS >= 13:  # the row's target picked out of the gathered vector by a reduction
            y = tl.sum(tl.where(idx == (row - pid) // step, ys.to(tl.int32), 0), axis=0)
        elif PARTS == 12:  # a diagnostic: the first row's target, loaded before the loop, for every row
            y = y_first
        elif PARTS >= 9 and Y_AHEAD:
            y = y_next
            y_next = tl.load(t_ptr + r + step + one, mask=row + step + one < n_rows, other=ignore_index)
        elif PARTS >= 9:
            y = tl.load(t_ptr + r + one)
        elif PARTS == 4:
            i = (row - pid) // step
            y = tl.sum(tl.where(idx == i, ys, 0), axis=0)
        elif PARTS == 7:  # the target as a one-element tensor load, not a scalar load
            y = tl.sum(tl.load(t_ptr + r + tl.arange(0, 1)), axis=0)
        elif PARTS == 8:  # the same through a 16-lane load, lane 0 kept
            lane = tl.arange(0, 16)
            y = tl.sum(tl.load(t_ptr + r + lane, mask=lane < 1, other=0), axis=0)
        elif PARTS == 0 or PARTS >= 5:
            y = ignore_index + 1
        elif Y_AHEAD:
            y = y_next
            y_next = tl.load(t_ptr + r + step, mask=row + step < n_rows, other=ignore_index)
        else:
            y = tl.load(t_ptr + r)
        valid = (y >= 0) & (y < n_cols)
        keep = y != ignore_index
        if PARTS == 10 or PARTS == 13:  # an ignored row is not read (the mask follows the target)
            x = tl.load(x_ptr + r * stride_xm + offs, mask=tl.where(keep, col_ok, False), other=float("-inf"))
            x = x.to(tl.float32)
        elif PARTS >= 9 and EVEN:
            x = tl.load(x_ptr + r * stride_xm + offs).to(tl.float32)
        elif PARTS >= 9:
            x = tl.load(x_ptr + r * stride_xm + offs, mask=col_ok, other=float("-inf")).to(tl.float32)
        elif PARTS >= 7:  # an ignored row is not read
            x = tl.load(x_ptr + r * stride_xm + offs, mask=col_ok & keep, other=float("-inf")).to(tl.float32)
        elif EVEN:
            x = tl.load(x_ptr + r * stride_xm + offs).to(tl.float32)
        else:
            x = tl.load(x_ptr + r * stride_xm + offs, mask=col_ok, other=float("-inf")).to(tl.float32)
        if PARTS == 4:
            x_y = tl.sum(tl.where(idx == i, xys, 0.0), axis=0)
        elif PARTS < 3 or PARTS >= 9:
            x_y = 0.0
        elif XY_REG:  # picked out of the row in registers: a reduction, no dependent load
            x_y = tl.where(valid, tl.sum(tl.where(offs == y, x, 0.0), axis=0), float("nan"))
        else:
            x_y = tl.load(x_ptr + r * stride_xm + y, mask=valid, other=float("nan")).to(tl.float32)
        if REF_TARGET and (PARTS == 3 or PARTS == 4):
            ref = tl.where(tl.abs(x_y) < float("inf"), x_y, 0.0)
        else:
            m = tl.max(x, axis=0)
            ref = tl.where(m == float("-inf"), 0.0, m)
        e = tl.math.exp2((x - ref) * LOG2E)
        d = tl.sum(e, axis=0)
        lse = ref + tl.math.log2(d) * LN2
        if PARTS == 5:  # lse alone, stored a row at a time
            tl.store(loss_ptr + r, lse)
        elif PARTS >= 6:  # lse alone, kept in a vector, stored after the loop
            lses = tl.where(idx == (row - pid) // step, lse, lses)
        elif PARTS == 4:
            losses = tl.where(idx == i, tl.where(keep, lse - x_y, 0.0), losses)
        elif PARTS >= 2:
            tl.store(loss_ptr + r, tl.where(keep, lse - x_y, 0.0))
        if PARTS >= 9:  # y, keep, valid: one-element tensors broadcast against the tile
            c = tl.where(keep, tl.where(valid, scale / d, float("nan")), 0.0)
            hot = tl.where(keep, scale, 0.0)
            # compared in int32: an int64 compare widens the column index of every lane (two more
            # registers an element, hoisted out of the loop: the loop ran at 59% of copy, not 90%)
            grad = e * c - tl.where(offs == y.to(tl.int32), hot, 0.0)  # an ignored row: e * 0 - 0
        elif PARTS >= 7:
            grad = e * tl.where(keep, scale / d, 0.0) - tl.where(offs == y, scale, 0.0)
        elif PARTS == 0 or PARTS >= 5:
            grad = e * (scale / d)
        else:
            c = tl.where(keep, tl.where(valid, scale / d, float("nan")), 0.0)
            hot = tl.where(keep, scale, 0.0)
            grad = e * c - tl.where(offs == y, hot, 0.0)
        if EVEN:
            tl.store(g_ptr + r * stride_gm + offs, grad.to(g_ptr.dtype.element_ty))
        else:
            tl.store(g_ptr + r * stride_gm + offs, grad.to(g_ptr.dtype.element_ty), mask=col_ok)
    if PARTS == 4:
        tl.store(loss_ptr + my_rows, losses, mask=my_rows < n_rows)
    if PARTS >= 9:
        losses = tl.where(ys != ignore_index, lses - xys, 0.0)
        tl.store(loss_ptr + my_rows, losses, mask=my_rows < n_rows)
    elif PARTS >= 6:
        tl.store(loss_ptr + my_rows, lses, mask=my_rows < n_rows)


def persistent_loss(x, t, grad, cfg):
    n_rows, n_cols = x.shape
    sync = ce._prologue(t, -100, count=True)
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(n_cols)
    programs = n_rows if cfg["per_sm"] == 0 else min(n_rows, cfg["per_sm"] * sm_count())
    cfg["compiled"] = _ce_rows_kernel[(programs,)](
        x,
        t,
        grad,
        loss_rows,
        sync,
        n_rows,
        n_cols,
        x.stride(0),
        grad.stride(0),
        -100,
        BLOCK_N=block,
        STAGES=cfg["stages"],
        REF_TARGET=cfg["ref_target"],
        EVEN=block == n_cols and not cfg.get("masked"),
        XY_REG=cfg.get("xy_reg", False),
        Y_AHEAD=cfg.get("y_ahead", False),
        PARTS=cfg.get("parts", 3),
        MAX_ROWS=triton.next_power_of_2(triton.cdiv(n_rows, programs)),
        num_warps=cfg["warps"],
    )
    return ce._reduce(loss_rows, sync, "mean", x.dtype)


def configs(quick):
    """(per_sm, stages, warps, reference, x_y from registers, target a row ahead); per_sm 0: one
    program a row. The first run (H200) put 3 stages, 16 warps, the target's reference first (77%)."""
    out = {}
    for per_sm, stages, warps, ref, parts, ahead in (
        (1, 3, 32, False, 6, False),
        (1, 3, 32, False, 9, False),
        (1, 3, 16, False, 9, False),
        (1, 3, 32, False, 10, False),
        (1, 3, 16, False, 10, False),
        (1, 4, 32, False, 10, False),
        (1, 3, 32, False, 13, False),
        (1, 3, 16, False, 13, False),
        (1, 3, 32, False, 14, False),
        (1, 3, 16, False, 14, False),
    ):
        label = f"persistent {per_sm}/SM" if per_sm else "a row each"
        label += f" s{stages} w{warps} parts={parts}" + (" ahead" if ahead else "")
        out[label] = dict(per_sm=per_sm, stages=stages, warps=warps, ref_target=ref, parts=parts, y_ahead=ahead)
    return out


def ir_counts():
    """``--ir``: which loads Triton's pipeliner turned into asynchronous copies, for PARTS 0, 6, 9 and
    12 (the target loaded before the loop), with each one's time at 8192 x 32000; the TTGIR under $OUT."""
    import os

    out = os.environ.get("OUT", ".")
    copy = bench.measure_copy_bandwidth()
    x = torch.randn(8192, 32000, device="cuda", dtype=torch.bfloat16) * 2
    t = torch.randint(0, 32000, (8192,), device="cuda")
    grad = torch.empty_like(x)
    nb = 2 * x.numel() * 2
    for parts in (0, 6, 9, 10):
        cfg = dict(per_sm=1, stages=3, warps=32, ref_target=False, parts=parts)
        ms = bench.queued_ms(lambda cfg=cfg: persistent_loss(x, t, grad, cfg))
        ir = cfg["compiled"].asm["ttgir"]
        with open(f"{out}/ce_rows_parts{parts}.ttgir", "w") as f:
            f.write(ir)
        keys = ("async_copy_global_to_local", "async_wait", "local_alloc", "tt.load", "scf.for", "gpu.barrier")
        counts = ", ".join(f"{k} {ir.count(k)}" for k in keys)
        print(f"parts={parts:<3} {ms:7.4f} ms {nb / ms / 1e6 / copy:6.1%}  {counts}", flush=True)


def widths_configs(quick):
    """``--widths``: the two best loops of the last sweep across the widths the tile of 32768
    would take."""
    return {
        "persistent 1/SM s3 w16 parts=10": dict(per_sm=1, stages=3, warps=16, ref_target=False, parts=10),
        "persistent 1/SM s3 w16 parts=13": dict(per_sm=1, stages=3, warps=16, ref_target=False, parts=13),
        "persistent 1/SM s3 w32 parts=10": dict(per_sm=1, stages=3, warps=32, ref_target=False, parts=10),
        "persistent 1/SM s3 w16 parts=10 masked": dict(
            per_sm=1, stages=3, warps=16, ref_target=False, parts=10, masked=True
        ),
    }


def main():
    if "--ir" in sys.argv:
        return ir_counts()
    quick = "--quick" in sys.argv
    shapes = ((8192, 32000, 0.0), (4096, 32000, 0.0), (8192, 32000, 0.3), (16384, 32000, 0.0))
    global configs
    if "--widths" in sys.argv:
        configs = widths_configs
        shapes = ((8192, 32000, 0.0), (4096, 32000, 0.0), (16384, 32000, 0.0), (8192, 32000, 0.3))
        shapes += tuple((8192, n, 0.0) for n in (32768, 30000, 28000, 24592, 20000, 16448))
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    for tokens, vocab, ignored in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, generator=g) * 2
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        t[torch.rand(tokens, device="cuda", generator=g) < ignored] = -100
        print(f"  ignored {ignored:.0%}")
        grad = torch.empty_like(x)
        nb = 2 * x.numel() * 2
        xs, ts = x[:97].clone(), t[:97].clone()
        ts[::5] = -100
        xd = xs.double().requires_grad_()
        want_loss = F.cross_entropy(xd, ts)
        (want_g,) = torch.autograd.grad(want_loss, xd)
        shipped = ce.cross_entropy_config(vocab, torch.bfloat16)

        def pkg():
            return ce._loss(x, t, grad, -100, "mean", 0.0, shipped)

        msq = bench.queued_ms(pkg)
        print(f"  {tokens:>5} x {vocab:<6} {'package _loss (shipped)':40s} {msq:7.4f} ms {nb / msq / 1e6 / copy:6.1%}")
        msq = bench.queued_ms(lambda: softmax(x))
        name = "package softmax (same traffic)"
        print(f"  {tokens:>5} x {vocab:<6} {name:40s} {msq:7.4f} ms {nb / msq / 1e6 / copy:6.1%}")
        for label, cfg in configs(quick).items():
            try:
                gs = torch.empty_like(xs)
                got = persistent_loss(xs, ts, gs, cfg)
                err = ((gs.double() - want_g).norm() / want_g.norm()).item()
                lerr = abs(got.double().item() - want_loss.item()) / abs(want_loss.item())
                msq = bench.queued_ms(lambda cfg=cfg: persistent_loss(x, t, grad, cfg))
                print(
                    f"  {tokens:>5} x {vocab:<6} {label:40s} {msq:7.4f} ms {nb / msq / 1e6 / copy:6.1%}"
                    f"  grad err {err:.1e} loss err {lerr:.1e}",
                    flush=True,
                )
            except Exception as exc:  # a configuration that does not fit (shared memory, registers): go on
                print(f"  {tokens:>5} x {vocab:<6} {label:40s} failed: {type(exc).__name__} {str(exc)[:120]}")
        x = grad = None


if __name__ == "__main__":
    main()
