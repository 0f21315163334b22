"""What a second kernel after each norm forward would cost: the design left for rows of huge values.

The forward kernels stay as shipped (their builds unchanged: ``probe_norm_regs.py``); after each forward a
small kernel reads every row's statistic and would redo the rows whose statistic is not finite (RMSNorm's
rstd 0, LayerNorm's NaN). Here the second kernel only reads and finds none, which is what a normal row
costs: that launch, and the forward storing its statistics also where nothing asked for them (no grad).
Three versions of ``rmsnorm`` and ``layernorm`` on the lessons' bf16 shapes, timed in turn in one process
(``do_bench`` medians, rounds interleaved, the fastest round of each kept): as shipped; statistics stored +
the scan; the same with the scan launched as a programmatic dependent launch (sm_90), which the GPU may
place while the forward still runs.

    PYTHONPATH=. python3 benchmarks/probes/probe_norm_fixup_cost.py [--rounds 3]

Prints ``OP SHAPE shipped_ms scan_ms scan_pdl_ms`` per line (GPU only).
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

import fusionlab.kernels.layernorm as LN
import fusionlab.kernels.rmsnorm as RMS
from fusionlab.kernels._launch import Launcher, pdl_supported

SHAPES = ((32768, 4096), (4096, 8192), (32768, 8192), (4096, 5120))


@triton.jit
def _scan_kernel(stat_ptr, n_rows, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()  # the forward's statistics are complete only now
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    s = tl.load(stat_ptr + offs, mask=offs < n_rows, other=1.0)
    flagged = tl.max(((s == 0.0) | (s != s)).to(tl.int32), axis=0)
    if flagged > 0:  # where the fix-up would run: here it only marks the row block, never taken on these rows
        tl.store(stat_ptr + offs, s + 0.0, mask=offs < n_rows)


_launch_scan = Launcher(_scan_kernel)  # the package's launch path: the host time a shipped scan would take


def _scan(stat: torch.Tensor, pdl: bool) -> None:
    n = stat.numel()
    kwargs = {"launch_pdl": True} if pdl else {}
    _launch_scan((triton.cdiv(n, 1024),), stat, n, BLOCK=1024, PDL=pdl, num_warps=4, **kwargs)


def _candidate(mod, store: str, pdl: bool):
    """``mod._forward`` that always stores the statistics, then scans their rstd (the last of them)."""
    shipped = mod._forward

    def forward(*args, **kwargs):
        kwargs[store] = True
        out = shipped(*args, **kwargs)
        _scan(out[-1], pdl)
        return out

    return forward


def _timed(mod, forward, call) -> float:
    shipped = mod._forward
    mod._forward = forward or shipped
    try:
        call()
        torch.cuda.synchronize()
        return triton.testing.do_bench(call, warmup=30, rep=200)
    finally:
        mod._forward = shipped


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    pdl = pdl_supported()
    for rows, n in SHAPES:
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        cases = {
            "ln fwd": (LN, "store_stats", lambda: LN.layernorm(x, w, b, 1e-5)),  # noqa: B023
            "rms fwd": (RMS, "store_rstd", lambda: RMS.rmsnorm(x, w, 1e-6)),  # noqa: B023
        }
        for name, (mod, store, call) in cases.items():
            forwards = [None, _candidate(mod, store, False), _candidate(mod, store, True) if pdl else None]
            best = [float("inf")] * 3
            with torch.no_grad():
                for _ in range(args.rounds):
                    for i, f in enumerate(forwards):
                        if i == 0 or f is not None:
                            best[i] = min(best[i], _timed(mod, f, call))
            cells = " ".join("-" if v == float("inf") else f"{v:.4f}" for v in best)
            print(f"{name} {rows}x{n} {cells}", flush=True)


if __name__ == "__main__":
    main()
