"""Checkers for lesson 2's exercises (solutions/02_count_the_trips.ipynb).

Kernel exercises go through :func:`fusionlab.grading.check_function` (fresh random inputs, odd shapes,
NaN-poisoned outputs, one launch, no torch compute). On top of that, every output the answer
allocates with ``torch.empty``/``torch.empty_like`` is the front of a longer buffer whose tail (a
*guard zone*) is poisoned too: a kernel that stores without a mask, or with a mask that misses rows,
writes into the guard, and the checker says so. Unguarded, such a store lands in whatever memory
follows the tensor: on a GPU it corrupts it silently, in the interpreter it can crash the process.
"""

from __future__ import annotations

import torch

from ... import grading
from ...grading import CheckFailed, call_learner, number
from ...kernels.bias_gelu import bias_gelu_ledger, bias_gelu_reference
from ...kernels.chain import chain_ledger, chain_names, chain_reference
from ...ledger import human_bytes

#: (rows, cols) for the bias + GELU exercise: a single element, shapes that no power-of-two tile
#: divides in either direction, and one with more rows than a row block
SHAPES = ((1, 1), (37, 129), (130, 7), (257, 1000))
#: many programs at any tile (2 x 1024 on a GPU: 520; 64 Ki elements in the interpreter: 17)
MANY_SHAPE = (1031, 1031)
#: where an answer with one row a program is run again with 16-row tiles: rows no tile of 16 divides
TALL_SHAPE = (37, 129)
#: chain lengths the fused-chain exercise is checked at: every op once, the wrap-around, two rounds
CHAIN_KS = (1, 2, 3, 4, 5, 8)
Passed, _passed = grading.Passed, grading.passed


# -- exercise 1: the bias + GELU kernel --------------------------------------------------------------
def bias_gelu_inputs(shape, dtype, gen):
    """``x`` of ``shape`` (spread enough to reach GELU's curved part and both tails) and a bias row."""
    x = grading.randn(shape, dtype, gen=gen)
    bias = grading.randn(shape[-1], dtype, gen=gen, scale=1.0)
    return grading.with_room_after(x), grading.with_room_after(bias)


def check_bias_gelu(bias_gelu_fn) -> Passed:
    """Exercise 1: ``bias_gelu_fn(x, bias)`` computes exact ``GELU(x + bias)`` (erf form, fp32 inside,
    stored in x's dtype) for x of shape (M, N) and bias of shape (N,), in one Triton kernel."""
    res = grading.check_function(
        bias_gelu_fn,
        bias_gelu_reference,
        bias_gelu_inputs,
        name="bias_gelu",
        sizes=SHAPES,
        many=MANY_SHAPE,
        launches=1,
        quiet=True,
        hint="Compute in fp32 (.to(tl.float32)), add the bias along the rows (b[None, :]), use the exact "
        "GELU 0.5 v (1 + erf(v / sqrt(2))), and store in y's dtype.",
    )
    # one row a program (the GPU's BLOCK_M = 1) leaves no partial row tile: the row mask is tried with taller ones
    seed = grading.new_seed()
    with grading.seeded(seed):
        inputs = bias_gelu_inputs(TALL_SHAPE, torch.float32, grading.fresh_generator())
        grading.check_taller_tiles(bias_gelu_fn, inputs, bias_gelu_reference, name="bias_gelu", seed=seed)
    msg = (
        f"✓ bias_gelu: {res.checks} checks passed (shapes {', '.join(map(str, SHAPES))} × 2 dtypes, one of "
        f"{MANY_SHAPE[0]} × {MANY_SHAPE[1]} and one repeated; fresh random inputs, poisoned outputs, nothing "
        "written past the end, inputs unchanged, 1 launch each, no torch compute)"
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
            call = f"bias_gelu_bytes({m}, {n}, {b}, fused={fused})"
            got = number(
                call_learner(bias_gelu_bytes, m, n, b, fused, name="bias_gelu_bytes", where=call), call, "bytes"
            )
            if got == want:
                continue
            mn, tip = m * n * b, ""
            passes = 4 if not fused else 2
            if got == passes * mn:
                tip = " Close: you left out the bias. It is small, but a kernel that uses it reads it from HBM."
            elif got == passes * mn + m * n * b or got == passes * mn + 2 * m * n * b:
                tip = (
                    " The bias has n elements, not m × n: the kernel reads the row once and every row of "
                    "the tile reuses it on chip (that is what the broadcast b[None, :] does)."
                )
            elif not fused and got == 4 * mn + 2 * n * b:
                tip = " Only the add kernel reads the bias; the gelu kernel reads t alone."
            elif got in (mn, 2 * mn, 3 * mn, 4 * mn, 6 * mn) or got in (k * mn + n * b for k in (1, 2, 3, 4, 6)):
                tip = (
                    " Count the passes: eager is two kernels, each reads its input and writes its output; "
                    "fused is one kernel that reads x once and writes y once."
                )
            elif got in (want / b, want * 8, want / 8):
                tip = " Count bytes, not elements or bits: multiply elements by dtype_bytes."
            raise CheckFailed(f"{call} = {got:,}, expected {want:,} ({human_bytes(want)}).{tip}")
    led = bias_gelu_ledger(16384, 16384, 4)
    msg = (
        f"✓ bias_gelu bytes: eager 4 passes + the bias, fused 2 passes + the bias; "
        f"predicted speedup {led.saving:.4f}x at 16384 × 16384 fp32"
    )
    return _passed(msg)


# -- exercise 3: predict the k-chain ----------------------------------------------------------------
def check_predict_chain_ms(predict) -> Passed:
    """Exercise 3: ``predict(k, n, dtype_bytes, copy_GBps, fused)`` is the time in ms of the k-op
    chain on n elements at the copy bandwidth: 2kN elements eager, 2N fused."""
    for k, n, b, bw in ((1, 2**28, 4, 4000.0), (3, 2**28, 4, 4247.0), (8, 10**6, 2, 900.0), (5, 12345, 4, 3350.0)):
        led = chain_ledger(k, n, b)
        for fused in (False, True):
            want = led.predict_ms(bw, fused=fused)
            call = f"predict({k}, {n}, {b}, {bw}, fused={fused})"
            got = number(call_learner(predict, k, n, b, bw, fused, name="predict", where=call), call, "milliseconds")
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
    checks = 0
    for k in CHAIN_KS:
        name = f"chain k={k} ({' -> '.join(chain_names(k))})"
        checks += grading.check_function(
            chain_fn,
            chain_reference,
            lambda n, dtype, gen, k=k: (grading.with_room_after(grading.randn(n, dtype, gen=gen)), k),
            name=name,
            many=grading.MANY_PROGRAMS if k == CHAIN_KS[-1] else None,
            launches=1,
            quiet=True,
            hint="Op i of the chain is add 0.5, relu, multiply by 1.5, sigmoid, in turn (i % 4).",
        ).checks
    msg = (
        f"✓ chain: {checks} checks, k = {', '.join(map(str, CHAIN_KS))}, each on {len(grading.ODD_SIZES)} odd sizes "
        "× 2 dtypes and one repeated, one needing many programs (fresh random inputs, poisoned outputs, nothing "
        "written past the end, inputs unchanged), 1 launch whatever k is"
    )
    return _passed(msg)
