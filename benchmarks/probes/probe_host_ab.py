"""The call clock of two copies of the package on one GPU: cross-entropy and RMSNorm, forward + backward.

    git archive REV fusionlab | tar -x -C /tmp/old          # the copy to compare with, made here
    PYTHONPATH= python3 benchmarks/probes/probe_host_ab.py old /tmp/old    # on the GPU (carry /tmp/old)
    PYTHONPATH= python3 benchmarks/probes/probe_host_ab.py new .

Prints each copy's best of 5 x 50 synchronised calls and the time to queue 50 calls; the new copy also
prints where a cross-entropy call's host time goes (cProfile). Two processes, one copy each: a change that
moved only the host's share of a launch-bound call shows here and not in the GPU's own clock.
"""

from __future__ import annotations

import cProfile
import importlib
import io
import pstats
import sys
import time

import torch


def clock(f, n: int = 50) -> float:
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - t0) / n * 1e3)
    return min(best)


def queued(f, n: int = 50) -> float:
    """Host time to queue n calls (no sync inside; a full queue makes it wait for the GPU too)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e3


def main(which: str, where: str) -> None:
    sys.path.insert(0, where)  # this copy of fusionlab first
    fusionlab = importlib.import_module("fusionlab")
    cross_entropy = importlib.import_module("fusionlab.kernels.cross_entropy").cross_entropy
    rmsnorm = importlib.import_module("fusionlab.kernels.rmsnorm").rmsnorm
    print(which, fusionlab.__file__)
    x = torch.randn(4096, 32000, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 32000, (4096,), device="cuda")
    h = torch.randn(4096, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8192, device="cuda", dtype=torch.bfloat16)

    def ce_call():
        cross_entropy(x.detach().requires_grad_(), t).backward()

    def rms_call():
        rmsnorm(h.detach().requires_grad_(), w, 1e-6).sum().backward()

    for name, f in (("ce 32000 fwd+bwd", ce_call), ("rms 4096x8192 fwd+bwd", rms_call)):
        print(f"{which:4s} {name:24s} call {clock(f):.4f} ms  queued {queued(f):.4f} ms", flush=True)
    if which == "new":
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            ce_call()
        torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
        print(s.getvalue()[-3500:])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
