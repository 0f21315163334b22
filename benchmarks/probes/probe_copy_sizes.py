"""Probe: how fast a plain copy runs at the sizes the suites time (benchmarks/NOTES.md,
2026-11-25 "the H200's two open misses, measured further").

    PYTHONPATH=. python3 benchmarks/probes/probe_copy_sizes.py

The bars divide an op's bytes by ``bench.measure_copy_bandwidth()``: ``y.copy_(x)`` on 1 GiB of fp32
(2 GiB moved, about 0.5 ms on an H200), timed by ``bench.time_ms``. An op that moves less pays its
launch, ramp and last wave over fewer bytes. Here ``copy_`` itself at each size, on both clocks
(``time_ms``: L2 flushed between calls, median; ``queued_ms``: calls back to back, fastest round, the
suites' GPU clock), and beside it the H200's two open cases (lesson 4's softmax at 4096 x 32768 and
at 16384 x 32768; lesson 5's cross-entropy at 8192 x 128256), each against the 1 GiB copy and against
a copy of its own bytes. Evidence for the notes, not a change of any bar.
"""

from __future__ import annotations

import torch
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import cross_entropy as ce
from fusionlab.kernels.softmax import softmax

MIB = 2**20


def copy_rates(nbytes: int) -> tuple[float, float]:
    """GB/s of ``copy_`` on ``nbytes`` (read + write counted) by time_ms and by queued_ms."""
    x = torch.randn(nbytes // 4, device="cuda")
    y = torch.empty_like(x)
    moved = 2 * x.numel() * 4
    return bench.gbps(moved, bench.time_ms(lambda: y.copy_(x))), bench.gbps(moved, bench.queued_ms(lambda: y.copy_(x)))


def main():
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    print(f"  {'copy_ source':>14} {'time_ms GB/s':>13} {'share':>7} {'queued GB/s':>12} {'share':>7}")
    same = {}
    for mib in (8, 32, 128, 256, 512, 1024, 2048):
        t_rate, q_rate = copy_rates(mib * MIB)
        same[mib] = q_rate
        print(f"  {mib:>10} MiB {t_rate:13.0f} {t_rate / copy:7.1%} {q_rate:12.0f} {q_rate / copy:7.1%}", flush=True)
    cases = []
    for rows in (4096, 16384):
        x = torch.randn(rows, 32768, device="cuda", dtype=torch.bfloat16)
        cases.append((f"softmax {rows} x 32768", 2 * x.numel() * 2, lambda x=x: softmax(x)))
    x = torch.randn(8192, 128256, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 128256, (8192,), device="cuda")
    grad = torch.empty_like(x)
    cfg = ce.cross_entropy_config(128256, torch.bfloat16)
    cases.append(
        ("cross-entropy 8192 x 128256", 2 * x.numel() * 2, lambda: ce._loss(x, t, grad, -100, "mean", 0.0, cfg))
    )
    for name, moved, fn in cases:
        ms = bench.queued_ms(fn)
        rate = bench.gbps(moved, ms)
        src_mib = moved // 2 // MIB
        own = same.get(src_mib) or copy_rates(src_mib * MIB)[1]
        print(
            f"  {name:30s} {ms:7.4f} ms {rate:6.0f} GB/s: {rate / copy:6.1%} of the 1 GiB copy, "
            f"{rate / own:6.1%} of a {src_mib} MiB copy_ on the same clock ({own:.0f} GB/s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
