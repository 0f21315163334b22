"""Probe: where the persistent softmax's time goes at 32768 wide, and rows handed out as they are asked
for (2026-11-26 "the H200's 32768-wide softmax on a timeline"; benchmarks/notes_softmax.md).

    PYTHONPATH=. python3 benchmarks/probes/probe_softmax_timeline.py [--quick]

Lesson 4's one miss: the H200's 4096 x 32768 bf16 softmax at 87.7% of copy (bar 90%). Fitting the
2026-11-25 "the H200's two open misses, measured further" section's times at 2048-16384 rows to ``a + b * rows`` gives
a marginal rate of 93-95% of
copy and a fixed cost of about 7 us a call, where a copy of the same bytes has about 1.3 us. Two
candidates for those 7 us: (1) the fill and the drain of the row pipeline (nothing written until each
program's first row has arrived; nothing read while the last rows are written); (2) rows dealt out in
advance (program p takes rows p, p + P, ...): 4096 rows over 132 SMs is 31 rows for most and 32 for
four, and an SM that the memory system serves a little slower than the others finishes last.

Here the package's persistent one-tile kernel is copied with a timeline: each program writes the
global timer (ns) when it starts, when each row's maximum is known (the row has arrived) and when its
stores are issued, and the SM it ran on. Variants: rows dealt as the package deals them (132 programs
or as many as give every program the same rows), as dependent launches (``gdc_wait`` at the top), rows
taken from a counter (an atomic ticket a row, or a ticket one row ahead: a program that is served
faster takes more rows), and rows dealt for all but the last rounds, then counted. Every variant is
checked against float64 first and the counter checked back at 0 after every call; shares of copy by
two trips (read x, write y); the GPU clock (``bench.queued_ms``) and lesson 4's (``bench.time_ms``),
variants timed in turn, medians of 7. What it measured on an H200: notes_softmax.md,
2026-11-26 "where the 32768-wide rows' time goes" (the rows stream at 97% of copy once started; the first row's 5 us
and the slowest SMs' 6-7 us
are the rest; counted rows lose the loads ahead and run at 70-74%).
"""

from __future__ import annotations

import statistics
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import softmax as S

SLOTS = 80  # timeline slots a program: rows it may take (the counter variant may take more than its share)


@triton.jit
def _now(dummy):
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l,r", [dummy], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _smid(dummy):
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [dummy], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _body(x, y_ptr, row, ok, n_cols, offs, col_ok, t_row, k, TIMELINE: tl.constexpr, SLOTS: tl.constexpr):
    x = x.to(tl.float32)
    m = tl.max(x, axis=0)
    if TIMELINE:  # the row has arrived: its maximum is known
        tl.store(t_row + 2 + 2 * k, _now(m.to(tl.int32)), mask=k < SLOTS)
    e = tl.exp(x - m)
    y = e * (1.0 / tl.sum(e, axis=0))
    tl.store(y_ptr + tl.cast(row, tl.int64) * n_cols + offs, y.to(y_ptr.dtype.element_ty), mask=col_ok & ok)
    if TIMELINE:  # its stores issued
        tl.store(t_row + 3 + 2 * k, _now(k), mask=k < SLOTS)
    return k + 1


@triton.jit
def _load(x_ptr, row, ok, stride, offs, col_ok, EVEN: tl.constexpr):
    ptrs = x_ptr + tl.cast(row, tl.int64) * stride + offs
    if EVEN:  # only the row's own mask (uniform over the program)
        return tl.load(ptrs, mask=ok, other=float("-inf"))
    return tl.load(ptrs, mask=col_ok & ok, other=float("-inf"))


@triton.jit
def _tickets(x_ptr, y_ptr, ctr_ptr, first, iters, n_rows, n_cols, stride, offs, col_ok, t_row, k,
             STAGES: tl.constexpr, EVEN: tl.constexpr, TIMELINE: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
    # rows first, first + 1, ... handed out by a counter, each ticket taken one row ahead of its load so
    # the atomic's round trip overlaps this row's work; a ticket left when the iterations run out is
    # still done (plain loop), so no row is lost whatever the programs' speeds
    nxt = first + tl.atomic_add(ctr_ptr, 1)
    for _ in tl.range(0, iters, num_stages=STAGES):
        row = nxt
        nxt = first + tl.atomic_add(ctr_ptr, 1)
        ok = row < n_rows
        x = _load(x_ptr, row, ok, stride, offs, col_ok, EVEN)
        if ok:
            k = _body(x, y_ptr, row, ok, n_cols, offs, col_ok, t_row, k, TIMELINE, SLOTS)
    while nxt < n_rows:
        x = _load(x_ptr, nxt, nxt < n_rows, stride, offs, col_ok, EVEN)
        k = _body(x, y_ptr, nxt, nxt < n_rows, n_cols, offs, col_ok, t_row, k, TIMELINE, SLOTS)
        nxt = first + tl.atomic_add(ctr_ptr, 1)
    return k


@triton.jit
def _timeline_kernel(
    x_ptr,
    y_ptr,
    t_ptr,
    ctr_ptr,
    n_rows,
    n_cols,
    stride,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
    STEAL: tl.constexpr,  # 0 dealt, 1 a ticket a row, 2 tickets a row ahead, 3 dealt then tickets ahead
    SLACK: tl.constexpr,
    SKIP: tl.constexpr,
    TIMELINE: tl.constexpr,
    PDL: tl.constexpr,
    SLOTS: tl.constexpr,
    EVEN: tl.constexpr = False,
    TAIL_ROUNDS: tl.constexpr = 2,
):
    if PDL:
        gdc_wait()
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK_N)
    col_ok = offs < n_cols
    t_row = t_ptr + pid.to(tl.int64) * (3 + 2 * SLOTS)
    if TIMELINE:
        tl.store(t_row, _now(pid))
        tl.store(t_row + 1, _smid(pid).to(tl.int64))
    k = 0
    if STEAL == 1:  # a ticket a row: tickets past the last row are empty
        for _ in tl.range(0, tl.cdiv(n_rows, n_prog) + SLACK, num_stages=STAGES):
            row = tl.atomic_add(ctr_ptr, 1)
            ok = row < n_rows
            x = _load(x_ptr, row, ok, stride, offs, col_ok, EVEN)
            if SKIP:
                if ok:
                    k = _body(x, y_ptr, row, ok, n_cols, offs, col_ok, t_row, k, TIMELINE, SLOTS)
            else:
                k = _body(x, y_ptr, row, ok, n_cols, offs, col_ok, t_row, k, TIMELINE, SLOTS)
    elif STEAL == 2:
        iters = tl.cdiv(n_rows, n_prog) + SLACK
        k = _tickets(x_ptr, y_ptr, ctr_ptr, 0, iters, n_rows, n_cols, stride, offs, col_ok, t_row, k,
                     STAGES, EVEN, TIMELINE, SLOTS)  # fmt: skip
    else:  # rows dealt out in advance, as the package does (STEAL 3: all but the last rounds)
        dealt = n_rows
        if STEAL == 3:
            dealt = tl.maximum(n_rows // n_prog - TAIL_ROUNDS, 0) * n_prog
        for row in tl.range(pid, dealt, n_prog, num_stages=STAGES):
            x = _load(x_ptr, row, row < n_rows, stride, offs, col_ok, EVEN)
            k = _body(x, y_ptr, row, row < n_rows, n_cols, offs, col_ok, t_row, k, TIMELINE, SLOTS)
        if STEAL == 3:
            iters = tl.cdiv(n_rows - dealt, n_prog) + SLACK
            k = _tickets(x_ptr, y_ptr, ctr_ptr, dealt, iters, n_rows, n_cols, stride, offs, col_ok, t_row, k,
                         STAGES, EVEN, TIMELINE, SLOTS)  # fmt: skip
    if STEAL > 0:  # the last program out resets the counter for the next call
        done = tl.atomic_add(ctr_ptr + 1, 1)
        if done == n_prog - 1:
            tl.atomic_xchg(ctr_ptr, 0)
            tl.atomic_xchg(ctr_ptr + 1, 0)
    if TIMELINE:
        tl.store(t_row + 2 + 2 * SLOTS, _now(pid))


_COUNTERS = {}


def _idle_counter(device):
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(2, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def run(
    x,
    programs,
    *,
    steal=0,
    slack=2,
    skip=True,
    timeline=None,
    pdl=False,
    ctr=None,
    stages=3,
    even=False,
    tail=2,
):
    rows, n = x.shape
    y = torch.empty_like(x)
    ctr = _idle_counter(x.device) if ctr is None else ctr  # no zeroing kernel in the timed call
    t = timeline if timeline is not None else y
    extra = {"launch_pdl": True} if pdl else {}
    _timeline_kernel[(programs,)](
        x, y, t, ctr, rows, n, x.stride(0),
        BLOCK_N=triton.next_power_of_2(n), STAGES=stages, STEAL=steal, SLACK=slack, SKIP=skip,
        TIMELINE=timeline is not None, PDL=pdl, SLOTS=SLOTS, EVEN=even, TAIL_ROUNDS=tail, num_warps=32, **extra,
    )  # fmt: skip
    return y


def package_with(x, **over):
    """The package's softmax with its persistent configuration's keys replaced by ``over``."""
    orig = S.softmax_config

    def fixed(*a, **k):
        cfg = orig(*a, **k)
        return {**cfg, **over} if cfg.get("programs") else cfg

    S.softmax_config = fixed
    try:
        return S.softmax(x)
    finally:
        S.softmax_config = orig


def time_in_turn(variants, nbytes, copy, rounds=7):
    """Each variant timed in turn ``rounds`` times on the GPU's clock (``bench.queued_ms``) and lesson
    4's (``bench.time_ms``); medians printed with their share of ``copy`` (GB/s) for ``nbytes``."""
    times = {label: ([], []) for label in variants}
    for _ in range(rounds):
        for label, fn in variants.items():
            times[label][0].append(bench.queued_ms(fn))
            times[label][1].append(bench.time_ms(fn))
    for label, (q, c) in times.items():
        q, c = statistics.median(q), statistics.median(c)
        print(
            f"  {label:24s} GPU {q * 1e3:7.1f} us {nbytes / q / 1e6 / copy:6.1%}   "
            f"call {c * 1e3:7.1f} us {nbytes / c / 1e6 / copy:6.1%}",
            flush=True,
        )


def summarize(label, tl_buf, programs):
    t = tl_buf.view(programs, 3 + 2 * SLOTS).cpu()
    t0 = int(t[:, 0].min())
    start = (t[:, 0] - t0).double() / 1e3  # us
    end = (t[:, 2 + 2 * SLOTS] - t0).double() / 1e3
    sm = t[:, 1]
    first = []
    rows_done = []
    for p in range(programs):
        stamps = t[p, 2 : 2 + 2 * SLOTS].view(SLOTS, 2)
        got = stamps[:, 0] > 0
        rows_done.append(int(got.sum()))
        if got.any():
            first.append((int(stamps[0, 0]) - t0) / 1e3 - float(start[p]))
    span = float(end.max())
    per_sm_end = {}
    for p in range(programs):
        s = int(sm[p])
        per_sm_end[s] = max(per_sm_end.get(s, 0.0), float(end[p]))
    ends = sorted(per_sm_end.values())
    print(
        f"  {label}: span {span:.1f} us; starts {float(start.min()):.1f}-{float(start.max()):.1f} us; "
        f"first row after {statistics.median(first):.1f} us (max {max(first):.1f}); rows a program "
        f"{min(rows_done)}-{max(rows_done)}; SMs used {len(per_sm_end)}; SM ends min {ends[0]:.1f} / "
        f"median {statistics.median(ends):.1f} / max {ends[-1]:.1f} us",
        flush=True,
    )
    # the rate each program kept between its first and last row (rows per us), slowest and fastest
    rates = []
    for p in range(programs):
        stamps = t[p, 2 : 2 + 2 * SLOTS].view(SLOTS, 2)
        n_got = int((stamps[:, 0] > 0).sum())
        if n_got > 2:
            rates.append((n_got - 1) / ((int(stamps[n_got - 1, 0]) - int(stamps[0, 0])) / 1e3))
    if rates:
        rates.sort()
        print(
            f"    us a row (steady): fastest {1 / rates[-1]:.2f}, median {1 / statistics.median(rates):.2f}, "
            f"slowest {1 / rates[0]:.2f}",
            flush=True,
        )


def main():
    quick = "--quick" in sys.argv
    copy = bench.measure_copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"copy {copy:.0f} GB/s, {sms} SMs", flush=True)  # fmt: skip
    for rows in (4096,) if quick else (4096, 2048, 8192, 16384):
        x = torch.randn(rows, 32768, device="cuda", dtype=torch.bfloat16) * 3
        want = torch.softmax(x.double(), dim=-1)
        x_before = x.clone()
        ctr = torch.zeros(2, dtype=torch.int32, device="cuda")
        balanced = triton.cdiv(rows, triton.cdiv(rows, sms))  # every program the same rows, at most one a SM
        variants = {
            "package": lambda: S.softmax(x),
            f"package, {balanced} programs": lambda: package_with(x, programs=balanced),
            f"package, {sms} programs": lambda: package_with(x, programs=sms),
            f"dealt {sms} even": lambda: run(x, sms, even=True),
            f"dealt {balanced} even": lambda: run(x, balanced, even=True),
            f"dealt {sms} even pdl": lambda: run(x, sms, even=True, pdl=True),
            f"dealt {balanced} even pdl": lambda: run(x, balanced, even=True, pdl=True),
            f"tickets {sms}": lambda: run(x, sms, steal=1, even=True, ctr=ctr),
            f"tickets ahead {sms}": lambda: run(x, sms, steal=2, even=True, ctr=ctr),
            f"tickets ahead {2 * sms}": lambda: run(x, 2 * sms, steal=2, even=True, ctr=ctr),
            f"dealt+tickets {sms}": lambda: run(x, sms, steal=3, even=True, ctr=ctr),
            f"dealt+tickets {sms} t4": lambda: run(x, sms, steal=3, even=True, ctr=ctr, tail=4),
            f"dealt+tickets {sms} pdl": lambda: run(x, sms, steal=3, even=True, ctr=ctr, pdl=True),
        }
        print(f"\n{rows} x 32768 bf16", flush=True)
        for label, fn in list(variants.items()):
            try:
                fn()
            except Exception as e:  # e.g. out of shared memory
                print(f"  {label}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                del variants[label]
                continue
            for _ in range(3):  # the counter must come back to 0 call after call
                err = (fn().double() - want).abs().max().item()
                assert err < 2e-2, (label, err)
            assert torch.equal(x, x_before), label
            assert ctr.tolist() == [0, 0], (label, ctr.tolist())
        time_in_turn(variants, 2 * x.numel() * x.element_size(), copy)
        print("  timelines (one call each, after a warm call):", flush=True)
        for label, programs, kw in (
            (f"dealt {sms} even", sms, {"even": True}),
            (f"dealt {balanced} even", balanced, {"even": True}),
            (f"tickets ahead {sms}", sms, {"even": True, "steal": 2, "ctr": ctr}),
            (f"dealt+tickets {sms}", sms, {"even": True, "steal": 3, "ctr": ctr}),
        ):
            buf = torch.zeros(programs * (3 + 2 * SLOTS), dtype=torch.int64, device="cuda")
            run(x, programs, timeline=buf, **kw)
            buf.zero_()
            torch.cuda.synchronize()
            run(x, programs, timeline=buf, **kw)
            torch.cuda.synchronize()
            summarize(label, buf, programs)
        x = want = x_before = None  # freed before the next shape
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
