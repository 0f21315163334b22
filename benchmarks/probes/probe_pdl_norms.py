"""Probe: the norms' backward with programmatic dependent launch against without (2026-11-25 "programmatic dependent
launch between a call's own kernels").

    PYTHONPATH=. python3 benchmarks/probes/probe_pdl_norms.py

RMSNorm with a residual and LayerNorm, bf16, backward through autograd (a gradient for y, and for h
with the residual), on the GPU's clock (``bench.queued_ms``): with PDL the kernel that sums the
backward's dw (and db) partials is placed while the backward kernel still runs and waits for it on
the SM, instead of being launched when it ends. Each shape first checks that both give the same bits;
then PDL off and on in turn, three rounds, the fastest of each. Shares are of the copy bandwidth by
the fused ledger, as lesson 4's suite.
"""

from __future__ import annotations

import torch
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import _launch
from fusionlab.kernels import layernorm as ln
from fusionlab.kernels import rmsnorm as rn

DT = torch.bfloat16
SHAPES = ((4096, 1024), (4096, 2048), (4096, 4096), (4096, 8192), (32768, 1024), (32768, 4096), (512, 4096))


def _rms(rows, n):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, n, device="cuda", dtype=DT, generator=g).requires_grad_()
    r = torch.randn(rows, n, device="cuda", dtype=DT, generator=g).requires_grad_()
    w = torch.randn(n, device="cuda", dtype=DT, generator=g).requires_grad_()
    dy, dh = torch.randn_like(x), torch.randn_like(x)
    y, h = rn.rmsnorm(x, w, 1e-6, r)
    nb = rn.rmsnorm_ledger(rows, n, DT, backward=True, grad_h=True).fused_bytes

    def call():
        return torch.autograd.grad((y, h), (x, r, w), (dy, dh), retain_graph=True)

    return call, nb


def _ln(rows, n):
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(rows, n, device="cuda", dtype=DT, generator=g).requires_grad_()
    w = torch.randn(n, device="cuda", dtype=DT, generator=g).requires_grad_()
    b = torch.randn(n, device="cuda", dtype=DT, generator=g).requires_grad_()
    dy = torch.randn_like(x)
    y = ln.layernorm(x, w, b)
    nb = ln.layernorm_ledger(rows, n, DT, backward=True).fused_bytes

    def call():
        return torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)

    return call, nb


def main():
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s")
    for name, make in (("rms bwd", _rms), ("ln bwd", _ln)):
        for rows, n in SHAPES:
            call, nb = make(rows, n)
            got = {}
            for flag in (False, True):
                _launch.PDL = flag
                got[flag] = call()
            same = all(torch.equal(a, b) for a, b in zip(got[False], got[True], strict=True))
            times = {False: [], True: []}
            for _ in range(3):
                for flag in (False, True):
                    _launch.PDL = flag
                    times[flag].append(bench.queued_ms(call))
            a, b = min(times[False]), min(times[True])
            print(
                f"{name} {rows:6d} x {n:5d}: no PDL {a * 1e3:7.1f} us {nb / a / 1e6 / copy:6.1%}  "
                f"PDL {b * 1e3:7.1f} us {nb / b / 1e6 / copy:6.1%}  ({(a - b) * 1e3:+4.1f} us)"
                + ("" if same else "  DIFFERENT BITS"),
                flush=True,
            )
    _launch.PDL = True


if __name__ == "__main__":
    main()
