"""Checkers for lesson 2's exercises (solutions/02_count_the_trips.ipynb).

Kernel exercises go through :func:`fusionlab.check.check_function` (fresh random inputs, odd shapes,
NaN-poisoned outputs, one launch, no torch compute). On top of that, every output the answer
allocates with ``torch.empty``/``torch.empty_like`` is the front of a longer buffer whose tail (a
*guard zone*) is poisoned too: a kernel that stores without a mask, or with a mask that misses rows,
writes into the guard, and the checker says so. Unguarded, such a store lands in whatever memory
follows the tensor: on a GPU it corrupts it silently, in the interpreter it can crash the process.
"""

from __future__ import annotations

import contextlib
import io
import math

import torch

from .. import check
from ..check import CheckFailed
from ..kernels.bias_gelu import bias_gelu_reference
from ..kernels.chain import chain_names, chain_reference
from ..suites.lesson2 import bias_gelu_ledger
from ..trips import Ledger, human_bytes

#: (rows, cols) for the bias + GELU exercise: a single element, shapes that no power-of-two tile
#: divides in either direction, and one with more rows than a row block
SHAPES = ((1, 1), (37, 129), (130, 7), (257, 1000))
#: chain lengths the fused-chain exercise is checked at: every op once, the wrap-around, two rounds
CHAIN_KS = (1, 2, 3, 4, 5, 8)
#: the smallest guard zone, in elements (at least the size of the tensor itself)
GUARD_MIN = 2**16


Passed, _passed = check.Passed, check.passed


# -- guard zones -----------------------------------------------------------------------------------
@contextlib.contextmanager
def guarded_allocations():
    """While active, ``torch.empty`` and ``torch.empty_like`` return NaN-filled tensors that are the
    front of a buffer twice as long (at least :data:`GUARD_MIN` elements longer); yields the list of
    the guard zones (the poisoned tails), one per allocation, for :func:`writes_past_the_end`."""
    orig_empty, orig_like = torch.empty, torch.empty_like
    guards: list[torch.Tensor] = []

    def guarded(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point() or not t.is_contiguous():
            return check.poison_(t)
        n = t.numel()
        big = check.poison_(orig_empty(n + max(n, GUARD_MIN), dtype=t.dtype, device=t.device))
        guards.append(big[n:])
        return big[:n].view(t.shape)

    torch.empty = lambda *a, **k: guarded(orig_empty(*a, **k))
    torch.empty_like = lambda *a, **k: guarded(orig_like(*a, **k))
    try:
        yield guards
    finally:
        torch.empty, torch.empty_like = orig_empty, orig_like


def writes_past_the_end(guards) -> tuple[int, int] | None:
    """``(count, first)``: how many guard elements were overwritten and how far past the end the
    first one is; None if every guard is intact. Uses only copies and numpy, which a
    :class:`fusionlab.check.LaunchCounter` does not count as torch compute."""
    for g in guards:
        hit = ~_isnan_numpy(g)
        if hit.any():
            return int(hit.sum()), int(hit.nonzero()[0][0])
    return None


def _isnan_numpy(t: torch.Tensor):
    import numpy as np

    return np.isnan(t.detach().cpu().float().numpy())  # cpu() and float() are copies: not compute


def _guarded(student, name: str):
    """Wrap ``student`` so that its output allocations carry guard zones, checked after each call."""

    def run(x, *rest):
        with guarded_allocations() as guards:
            y = student(x, *rest)
        past = writes_past_the_end(guards)
        if past is not None:
            count, first = past
            dtype = str(x.dtype).replace("torch.", "")
            shape = tuple(x.shape) if x.dim() > 1 else x.numel()
            start = "right after the end" if first == 0 else f"{first} elements after the end"
            raise CheckFailed(
                f"{name}, size {shape}, {dtype}: the kernel wrote {count} elements past the end of its output "
                f"(the first one {start}). A store whose mask misses the rows or columns "
                "beyond the tensor (or has no mask) writes into whatever memory follows: on a GPU that "
                "corrupts it silently. Mask every store: offs < n_elements for a 1-D block, "
                "(offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols) for a 2-D tile."
            )
        return y

    return run


@contextlib.contextmanager
def _only_failures_printed():
    """Run a check_function quietly: its ✓ line is replaced by ours; anything else it (or the
    learner's code) prints is passed through, also when the check fails."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            yield
    finally:
        for line in buf.getvalue().splitlines():
            if not line.startswith("✓"):
                print(line)


def with_room_after(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied to the front of a longer buffer of zeros: a load past its end (a missing load mask)
    reads finite zeros, not whatever memory follows, and cannot fault."""
    n = t.numel()
    big = torch.zeros(n + max(n, GUARD_MIN), dtype=t.dtype, device=t.device)
    big[:n] = t.reshape(-1)
    return big[:n].view(t.shape)


# -- exercise 1: the bias + GELU kernel --------------------------------------------------------------
def bias_gelu_inputs(shape, dtype, gen):
    """``x`` of ``shape`` (spread enough to reach GELU's curved part and both tails) and a bias row."""
    x = check.randn(shape, dtype, gen=gen)
    bias = check.randn(shape[-1], dtype, gen=gen, scale=1.0)
    return with_room_after(x), with_room_after(bias)


def check_bias_gelu(bias_gelu_fn) -> Passed:
    """Exercise 1: ``bias_gelu_fn(x, bias)`` computes exact ``GELU(x + bias)`` (erf form, fp32 inside,
    stored in x's dtype) for x of shape (M, N) and bias of shape (N,), in one Triton kernel."""
    with _only_failures_printed():
        check.check_function(
            _guarded(bias_gelu_fn, "bias_gelu"),
            bias_gelu_reference,
            bias_gelu_inputs,
            name="bias_gelu",
            sizes=SHAPES,
            launches=1,
            hint="Compute in fp32 (.to(tl.float32)), add the bias along the rows (b[None, :]), use the exact "
            "GELU 0.5 v (1 + erf(v / sqrt(2))), and store in y's dtype.",
        )
    msg = (
        f"✓ bias_gelu: {2 * len(SHAPES)} checks passed (shapes {', '.join(map(str, SHAPES))} × 2 dtypes, fresh "
        "random inputs, poisoned outputs, nothing written past the end, 1 launch each, no torch compute)"
    )
    return _passed(msg)


# -- exercise 2: the trips of bias + GELU ------------------------------------------------------------
def check_bias_gelu_bytes(bias_gelu_bytes) -> Passed:
    """Exercise 2: ``bias_gelu_bytes(m, n, dtype_bytes, fused)`` is the HBM traffic of ``gelu(x + bias)``
    with x of shape (m, n) and bias of shape (n,): eager (two kernels) when ``fused`` is False."""
    for m, n, b in ((16384, 16384, 4), (32768, 16384, 2), (37, 129, 4), (1, 1000, 2)):
        want_led = bias_gelu_ledger(m, n, b)
        for fused in (False, True):
            want = want_led.bytes(fused)
            got = bias_gelu_bytes(m, n, b, fused)
            call = f"bias_gelu_bytes({m}, {n}, {b}, fused={fused})"
            if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
                raise CheckFailed(f"{call} returned {got!r}; expected a number of bytes.")
            if got == want:
                continue
            mn, tip = m * n * b, ""
            passes = 4 if not fused else 2
            if got == passes * mn:
                tip = " Close: you left out the bias. It is small, but a kernel that uses it reads it from HBM."
            elif got == passes * mn + m * n * b or got == passes * mn + 2 * m * n * b:
                tip = (" The bias has n elements, not m × n: the kernel reads the row once and every row of "
                       "the tile reuses it on chip (that is what the broadcast b[None, :] does).")
            elif not fused and got == 4 * mn + 2 * n * b:
                tip = " Only the add kernel reads the bias; the gelu kernel reads t alone."
            elif got in (mn, 2 * mn, 3 * mn, 4 * mn, 6 * mn) or got in (k * mn + n * b for k in (1, 2, 3, 4, 6)):
                tip = (" Count the passes: eager is two kernels, each reads its input and writes its output; "
                       "fused is one kernel that reads x once and writes y once.")
            elif got in (want / b, want * 8, want / 8):
                tip = " Count bytes, not elements or bits: multiply elements by dtype_bytes."
            raise CheckFailed(f"{call} = {got:,}, expected {want:,} ({human_bytes(want)}).{tip}")
    led = bias_gelu_ledger(16384, 16384, 4)
    msg = (f"✓ bias_gelu bytes: eager 4 passes + the bias, fused 2 passes + the bias; "
           f"predicted speedup {led.saving:.4f}x at 16384 × 16384 fp32")
    return _passed(msg)


# -- exercise 3: predict the k-chain ----------------------------------------------------------------
def check_predict_chain_ms(predict) -> Passed:
    """Exercise 3: ``predict(k, n, dtype_bytes, copy_GBps, fused)`` is the time in ms of the k-op
    chain on n elements at the copy bandwidth: 2kN elements eager, 2N fused."""
    for k, n, b, bw in ((1, 2**28, 4, 4000.0), (3, 2**28, 4, 4247.0), (8, 10**6, 2, 900.0), (5, 12345, 4, 3350.0)):
        led = Ledger.chain(chain_names(k), n, b)
        for fused in (False, True):
            want = led.predict_ms(bw, fused=fused)
            got = predict(k, n, b, bw, fused)
            call = f"predict({k}, {n}, {b}, {bw}, fused={fused})"
            if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
                raise CheckFailed(f"{call} returned {got!r}; expected a number of milliseconds.")
            if abs(got - want) <= 1e-6 * want:
                continue
            ratio, tip = got / want, ""
            if fused and abs(ratio - k) < 1e-6 * k and k > 1:
                tip = " Fused, the chain is one kernel: it reads x once and writes y once, whatever k is."
            elif not fused and abs(ratio - 1 / k) < 1e-6 and k > 1:
                tip = " Eager, each of the k ops is its own kernel with its own read and write."
            elif abs(ratio - 0.5) < 1e-6:
                tip = " Count both directions: every pass reads n elements and writes n elements."
            elif min(abs(ratio - s) / s for s in (1e3, 1e-3, 1e6, 1e-6, 1e9, 1e-9)) < 1e-6:
                tip = " Check the units: GB/s is 1e9 bytes per second, and the answer is in milliseconds."
            raise CheckFailed(f"{call} = {got:.6g} ms, expected {want:.6g} ms.{tip}")
    msg = "✓ chain prediction: eager 2kN elements, fused 2N, over the copy bandwidth — a speedup of k"
    return _passed(msg)


# -- exercise 4: the fused chain kernel ---------------------------------------------------------------
def check_chain(chain_fn) -> Passed:
    """Exercise 4: ``chain_fn(x, k)`` runs the chain's first k ops (fusionlab.kernels.chain) in one
    Triton kernel, for every k in :data:`CHAIN_KS`."""
    for k in CHAIN_KS:
        name = f"chain k={k} ({' -> '.join(chain_names(k))})"
        with _only_failures_printed():
            check.check_function(
                _guarded(chain_fn, name),
                chain_reference,
                lambda n, dtype, gen, k=k: (with_room_after(check.randn(n, dtype, gen=gen)), k),
                name=name,
                launches=1,
                hint="Op i of the chain is add 0.5, relu, multiply by 1.5, sigmoid, in turn (i % 4).",
            )
    msg = (
        f"✓ chain: k = {', '.join(map(str, CHAIN_KS))}, each on {len(check.ODD_SIZES)} odd sizes × 2 dtypes "
        "(fresh random inputs, poisoned outputs, nothing written past the end), 1 launch whatever k is"
    )
    return _passed(msg)
