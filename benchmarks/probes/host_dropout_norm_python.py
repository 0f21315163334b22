"""Probe: how much host time lesson 4b's residual + dropout + norm forward spends in the package's own
Python at 4096 x 4096, the shape whose forward missed its bars on the GPU hosts (benchmarks/notes_lesson4b.md,
"2026-11-27: the forward's plans by call signature"), and at 16 x 4096. CPU only.

What is timed is everything but Triton's launch: both launchers are put on their GPU hit path
(:class:`_host.HitPath`: the :class:`~fusionlab.kernels._launch.Launcher`'s own code, the key and the table
lookup, with its module's GPU switches on) and the compiled kernel's ``run`` is a no-op. So a row is the
checks, the configuration lookups, the seed, the allocations, ``autograd.Function.apply`` where it is taken,
the launcher's key, and no kernel; beside them, the four ``torch.empty`` of the outputs (h, y, and the fp32
mean and rstd) and :func:`~fusionlab.kernels.dropout_norm.new_seed` alone (the two torch calls a forward
cannot avoid). This CPU's allocator maps and unmaps a 32 MiB tensor on every ``torch.empty`` (a GPU's caching
allocator hands back a freed block), so at 4096 rows the empties are most of a call; at 16 rows (the same
Python: no step of the host path depends on the row count) they are not. fp16 (the interpreter's 16-bit
type, so the checks pass); the configurations are the
interpreter's (this machine's mode): a GPU's differ in values, not in how they are looked up. Each row is
the fastest of ``--rounds`` rounds (this machine's other work only ever adds time), per call, in
microseconds; then a cProfile of the no_grad forward.

Rows: ``bench`` is the forward as ``benchmarks/bench_lesson4b.py --sections norm`` times it (no_grad,
a fresh seed each call, the four inputs detached each call as the bench does); ``no_grad`` the call alone
with a fresh seed; ``seed given`` with an explicit seed; ``autograd`` the training step's forward (inputs
that require grad, no backward).

    PYTHONPATH=. .venv/bin/python benchmarks/probes/host_dropout_norm_python.py [--rounds 7] [--no-profile]

Before and after a change: the same script with ``PYTHONPATH`` at the other tree (the script takes
``_host.py`` from beside itself).
"""

from __future__ import annotations

import _host  # beside this script
import torch

import fusionlab  # noqa: F401
from fusionlab.kernels import dropout_norm as D

for name in ("_launch_fwd", "_launch_bwd"):
    setattr(D, name, _host.HitPath(getattr(D, name)))

DT = torch.float16
N, P = 4096, 0.1


def _inputs(rows, norm, grad=False):
    x, r = torch.randn(rows, N, dtype=DT), torch.randn(rows, N, dtype=DT)
    w = torch.randn(N, dtype=DT)
    b = torch.randn(N, dtype=DT) if norm == "layernorm" else None
    return [t.requires_grad_(grad) if t is not None else None for t in (x, r, w, b)]


def _empties(rows):
    def make():
        torch.empty(size=(rows, N), dtype=DT)
        torch.empty(size=(rows, N), dtype=DT)
        torch.empty(rows, dtype=torch.float32)
        torch.empty(rows, dtype=torch.float32)

    return make


def calls(rows, norm):
    """(name, grad mode, a call) for one norm at ``rows`` rows."""
    ins = _inputs(rows, norm)
    grads = _inputs(rows, norm, grad=True)

    def bench():
        return D.dropout_norm(*[t.detach() if t is not None else None for t in ins], P, norm=norm)

    return [
        ("bench forward (no_grad)", False, bench),
        ("no_grad", False, lambda: D.dropout_norm(*ins, P, norm=norm)),
        ("no_grad, seed given", False, lambda: D.dropout_norm(*ins, P, norm=norm, seed=12345)),
        ("autograd forward", True, lambda: D.dropout_norm(*grads, P, norm=norm)),
    ]


def main():
    args = _host.arguments(__doc__)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {D.__file__}")
    print(f"us per call, fp16, p = {P}, best of {args.rounds} rounds of 300 calls")
    for rows in (4096, 16):
        for norm in D.NORMS:
            for name, grad, fn in calls(rows, norm):
                with torch.set_grad_enabled(grad):
                    us = _host.per_call_us(fn, calls=300, rounds=args.rounds, warmup=100)
                print(f"{rows:5d}x{N} {norm:10s} {name:26s} {us:7.2f}")
        us = _host.per_call_us(_empties(rows), 300, args.rounds, 100)
        print(f"{rows:5d}x{N} {'':10s} {'four torch.empty':26s} {us:7.2f}")
    print(f"{'':10s} {'':10s} {'new_seed()':26s} {_host.per_call_us(D.new_seed, 300, args.rounds, 100):7.2f}")
    if args.no_profile:
        return
    fn = calls(16, "layernorm")[1][2]
    print("\n== 16x4096 layernorm, no_grad: cProfile of 2000 calls, by own time")
    with torch.no_grad():
        _host.print_profile(fn, 2000)


if __name__ == "__main__":
    main()
