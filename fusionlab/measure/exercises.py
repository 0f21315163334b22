"""Checkers of the measured-trips exercises (``solutions/measured_trips.ipynb``): one a family of kernels
(element-wise, reduction, matmul, attention), each holding a learner's ledger against the trips their own
kernel makes, counted load by load in Triton's interpreter (:mod:`fusionlab.measure.interpreter`).

The learner's ledger is the prediction; the interpreter's count is the measurement. A check passes when
the two agree tensor by tensor, at sizes drawn afresh at block boundaries; where they differ it says
which tensor, in which direction, by how much, and what that difference usually means (a re-read the
ledger forgot, the eager schedule counted for a fused kernel, elements for bytes...). Element-wise and
reduction kernels are the learner's own, checked first as every kernel of the course is
(:func:`fusionlab.grading.check_function`: fresh inputs, poisoned outputs, awkward sizes, one launch).
The matmul and the attention are the package's kernels run with the learner's tiles: the ledger is the
exercise.

On a GPU the kernels run compiled, so the interpreter cannot count them: there the GPU counts them. The
learner's kernel runs under Nsight Compute (:mod:`fusionlab.measure.own`), caches flushed, at sizes of
about a gigabyte, far past the L2: the element-wise and reduction kernels' DRAM bytes are held against
the ledger (reads within :data:`DRAM_TOLERANCE`; writes may fall short by up to the L2's size, the tail
of the output still in it when the kernel ends), the matmul's L2 bytes (every load and store crosses the
L2; its re-reads are served there, so DRAM sees fewer) within :data:`L2_TOLERANCE`. Attention's L2 bytes
bound its ledger from below only: programs of one head on one SM share K and V in the SM's own cache (the
H200, 2026-11-27: 0.38x of the ledger crossed the L2), so the ledger is also held tensor by tensor against
the package's count of the schedule.
Where the counters cannot be read (no ``ncu``; no permission, as on Colab) the check says why once and
compares the ledger with the package's own ledger of the same schedule instead, and says so.
"""

from __future__ import annotations

import json
import subprocess

import torch

from .. import grading, runtime
from ..grading import CheckFailed, answer_key, call_learner
from ..kernels.attention import attention, attention_ledger
from ..kernels.matmul import matmul, matmul_ledger
from ..ledger import READ, WRITE, Ledger, human_bytes
from .compare import against_ledger, ledger_by_tensor
from .interpreter import InterpreterTrips
from .ncu import NcuFailed, NcuUnavailable
from .ncu import cases_thunk as ncu_cases_thunk
from .ncu import failure as ncu_failure
from .own import counted as gpu_counted
from .own import l2_size, unavailable


# -- the comparison ---------------------------------------------------------------------------------------
def _counted(run, rename: dict[str, str] | None = None) -> dict[tuple[str, str], int]:
    """The bytes ``run()`` moves by ``(tensor, direction)``, counted in the interpreter, each kernel
    parameter named through ``rename`` (:meth:`InterpreterTrips.by_tensor`)."""
    with InterpreterTrips() as t:
        run()
    return t.by_tensor(rename)


def _totals(by: dict[tuple[str, str], int]) -> tuple[int, int]:
    return sum(n for (_, d), n in by.items() if d == READ), sum(n for (_, d), n in by.items() if d == WRITE)


def _ledger(got, call: str) -> Ledger:
    if not isinstance(got, Ledger):
        raise CheckFailed(f"{call} returned {type(got).__name__}; return a fusionlab.ledger.Ledger.")
    return got


def _why(predicted: int, measured: int) -> str:
    if predicted and measured and abs(measured / predicted - 2) < 0.01:
        return " The kernel moved it twice: a re-read your ledger does not count (or a second pass you did not mean)."
    if predicted and measured and abs(predicted / measured - 2) < 0.01:
        return " Your ledger counts it twice: the kernel moves it once (fused, an intermediate never leaves chip)."
    if predicted and measured and round(predicted / measured) in (2, 4, 8) and predicted % measured == 0:
        return " Off by a whole factor: bytes against elements, or the wrong dtype size?"
    return ""


def _hidden(led: Ledger, tensor: str, direction: str) -> str:
    key = (tensor, direction)
    if ledger_by_tensor(led, fused=False).get(key) and not ledger_by_tensor(led).get(key):
        return (
            f" Your ledger has {tensor}, but inside a chain of ops, where the fused count keeps only what enters "
            "and leaves the chain: a kernel is one op, its reads and writes all in it."
        )
    return ""


#: how :func:`compare_with_count` names its count: the interpreter's, or (on a GPU) the package's ledger
INTERPRETER_COUNT, SCHEDULE_COUNT = "counted load by load in the interpreter", "as the package counts its schedule"


def compare_with_count(
    led: Ledger,
    counted: dict[tuple[str, str], int],
    where: str,
    by_tensor: bool,
    hints: dict[str, str] | None = None,
    how: str = INTERPRETER_COUNT,
) -> None:
    """Fail unless the ledger's fused trips equal the counted ones: tensor by tensor (``by_tensor``: the
    learner names the tensors as the exercise says) or in total reads and writes (the learner's kernel
    names its own parameters). ``hints``: a tensor's own advice where its count is off (before the
    general reasons)."""
    if by_tensor:
        bad = [c for c in against_ledger(counted, led) if c.predicted != c.measured]
        if bad:
            c = bad[0]
            why = (hints or {}).get(c.tensor) or _why(c.predicted, c.measured) or _hidden(led, c.tensor, c.direction)
            raise CheckFailed(
                f"{where}: your ledger says {c.direction} {c.tensor} {human_bytes(c.predicted)}; the kernel, {how}, "
                f"{'read' if c.direction == READ else 'wrote'} "
                f"{human_bytes(c.measured)}.{why}"
            )
        return
    want = _totals(ledger_by_tensor(led))
    got = _totals(counted)
    for what, p, m in (("read", want[0], got[0]), ("written", want[1], got[1])):
        if p != m:
            raise CheckFailed(
                f"{where}: your ledger says {human_bytes(p)} {what}; your kernel, {how}, {what} {human_bytes(m)}."
                f"{_why(p, m)}"
            )


def _count_how() -> str:
    """What the fallback's count is: the interpreter's on a CPU, the package's ledger on a GPU."""
    return SCHEDULE_COUNT if runtime.is_gpu() else INTERPRETER_COUNT


def _gpu_note() -> str:
    return (
        " (on this GPU the kernels run compiled and its counters could not be read, so the ledger was held "
        "against the package's count of the same schedule; on a CPU the interpreter counts your kernel's own loads)"
    )


#: DRAM reads of a kernel at about a gigabyte, caches flushed first, against its ledger's reads
DRAM_TOLERANCE = 0.03
#: bytes through the L2 against the ledger's whole trips (loads served there included): at most this much
#: more (sectors at the edges)...
L2_TOLERANCE = 0.10
#: bytes any count may differ by whatever the size (the H200, 2026-11-27, wrote 331 KiB to DRAM for a
#: kernel whose output is 2 KiB): a thousandth of the gigabyte-sized counts'
SLACK = 2**20


def gpu_counters(fns: dict, builder: str, specs: list[list]) -> list[dict] | None:
    """The GPU's counters of the learner's kernel at each spec, or None (and why, said once) where they
    cannot be had here. Where ncu runs but counts nothing of the kernel (:class:`NcuFailed`), ``fns``
    decides: the learner's kernel (rebuilt in ncu's process, where it may fail as it did not here) falls
    back, saying why in full; the package's own kernel (``fns`` empty: the matmul's and attention's
    exercises) is the package's fault, and the error is raised, never hidden behind the fallback."""
    said = unavailable()
    try:
        return gpu_counted(fns, f"{__name__}:cases_target", builder, specs)
    except NcuUnavailable as e:
        if said is None:
            print(
                "No GPU counters for your kernel here: " + str(e).split("\n")[0][:400] + "\nThe checks hold your "
                "ledger against the package's count of the same schedule instead."
            )
    except (NcuFailed, subprocess.TimeoutExpired) as e:
        if not fns:
            raise NcuFailed(f"Nsight Compute counted nothing of the package's {builder} kernel (a fault of "
                            f"fusionlab, not of your ledger): {e}") from e  # fmt: skip
        print(f"⚠ Nsight Compute could not count your kernel ({type(e).__name__}): {ncu_failure(e)}\nThe check holds "
              "your ledger against the package's count of the same schedule instead.")  # fmt: skip
    return None


def compare_with_dram(led: Ledger, c: dict, where: str, l2: int) -> None:
    """Fail unless the DRAM bytes the GPU counted (caches flushed) are the ledger's fused trips: reads
    within :data:`DRAM_TOLERANCE`, writes short by no more than the L2 holds."""
    want_r, want_w = _totals(ledger_by_tensor(led))
    r, w = c["dram_read"], c["dram_write"]
    how = "counted by the GPU (Nsight Compute, caches flushed before it)"
    if abs(r - want_r) > DRAM_TOLERANCE * want_r + SLACK:
        raise CheckFailed(
            f"{where}: your ledger says {human_bytes(want_r)} read; your kernel, {how}, read {human_bytes(r)} "
            f"from DRAM.{_why(want_r, round(r))}"
            + (
                " On a GPU a re-read of what the program loaded moments before comes from its caches, not DRAM."
                if r < want_r
                else ""
            )  # fmt: skip
        )
    # a kernel whose output is a sliver of its traffic: DRAM's write count moves with the traffic around it
    # (the H200, 2026-11-27: 3.98 MiB written by row_var, whose output is 1 MiB of 1 GiB moved), so the
    # upper bound's slack is the tolerance of the whole count; a ledger that writes the rows back still fails
    if not want_w - l2 - SLACK <= w <= want_w + DRAM_TOLERANCE * (want_r + want_w) + SLACK:
        raise CheckFailed(
            f"{where}: your ledger says {human_bytes(want_w)} written; your kernel, {how}, wrote {human_bytes(w)} to "
            f"DRAM (up to the L2's {human_bytes(l2)} may still be in it when the kernel ends).{_why(want_w, round(w))}"
        )


def compare_with_l2_floor(led: Ledger, c: dict, where: str) -> None:
    """Fail where the L2 alone saw more bytes than the ledger has the kernel ask for (every byte the L2
    sees was asked for; the SMs' own caches serve some of a tiled kernel's re-reads, as many as its programs
    share, so the counters bound the ledger from below only)."""
    want, got = led.fused_bytes, c["l2_bytes"]
    if got > (1 + L2_TOLERANCE) * want + SLACK:
        raise CheckFailed(
            f"{where}: your ledger says {human_bytes(want)} in all; the kernel, counted by the GPU (Nsight Compute), "
            f"moved {human_bytes(got)} through the L2 alone, more than your ledger has it ask for: a re-read it "
            f"does not count?{_why(want, round(got))}"
        )


def _on_gpu_shared(builder: str, specs: list[list], ledger_at, schedule_at, rereads: str, hints=None) -> str | None:
    """The check of a tiled kernel whose programs share re-read tiles in their SM's own cache (the matmul's A
    and B, attention's K and V; the H200, 2026-11-27: 0.73x of the matmul's ledger crossed the L2 at 16 x 64
    tiles): the L2's bytes bound the learner's ledger from below (:func:`compare_with_l2_floor`), and the
    package's count of the same schedule (``schedule_at(spec)``) holds it tensor by tensor. The note that
    says so, or None where there are no counters here (the caller falls back)."""
    got = gpu_counters({}, builder, specs)
    if got is None:
        return None
    seen = []
    for spec, c in zip(specs, got, strict=True):
        where, led = ledger_at(spec)
        led = _ledger(led, where)
        compare_with_l2_floor(led, c, where)
        compare_with_count(led, ledger_by_tensor(schedule_at(spec)), where, True, hints, how=SCHEDULE_COUNT)
        seen.append(c["l2_bytes"] / led.fused_bytes)
    return (
        f" (counted by this GPU under Nsight Compute at {len(specs)} sizes: {min(seen):.2f}-{max(seen):.2f}x of "
        f"your ledger crossed the L2, the rest of {rereads} served by the SMs' own caches; your ledger held "
        "tensor by tensor against the package's count of the schedule)"
    )


def _on_gpu(fns: dict, builder: str, specs: list[list], ledger_at, compare, measure: str) -> str | None:
    """The check on this GPU's counters: the learner's ledger at each spec (``ledger_at(spec)`` returns
    ``(where, ledger)``) held against the counters of the kernel run there (``compare``); the note that
    says so, or None where there are no counters here (the caller falls back)."""
    got = gpu_counters(fns, builder, specs)
    if got is None:
        return None
    for spec, c in zip(specs, got, strict=True):
        where, led = ledger_at(spec)
        compare(_ledger(led, where), c, where)
    return f" (counted by this GPU under Nsight Compute at {len(specs)} sizes past its L2: {measure})"


def _dram(led: Ledger, c: dict, where: str) -> None:
    compare_with_dram(led, c, where, l2_size())


# -- 1. element-wise --------------------------------------------------------------------------------------
@answer_key
def silu_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x.float()).to(x.dtype)


@answer_key
def silu_fused_ledger(n: int, dtype) -> Ledger:
    return Ledger(dtype_bytes=dtype).op("silu", reads={"x": n}, writes={"y": n})


def check_silu_trips(silu, silu_ledger) -> grading.Passed:
    """Exercise 1: ``silu(x)``, one Triton kernel, and ``silu_ledger(n, dtype)``, the trips it makes."""
    grading.check_function(
        silu,
        silu_reference,
        lambda n, dtype, gen: (grading.with_room_after(grading.randn(n, dtype, gen=gen)),),
        name="silu",
        hint="y = x * sigmoid(x), in fp32, stored in x's dtype.",
        quiet=True,
    )
    if runtime.is_gpu():
        # about a gigabyte a tensor, far past the L2, one element past a block boundary drawn afresh
        specs = [[2**28 + grading.drawn_length(0, 8), grading.dtype_name(d)] for d in (torch.float32, runtime.HALF)]

        def at(spec):
            where = f"silu_ledger({spec[0]}, {spec[1]})"
            return where, call_learner(silu_ledger, spec[0], getattr(torch, spec[1]), name="silu_ledger", where=where)

        note = _on_gpu({"silu": silu}, "silu", specs, at, _dram, "DRAM bytes against your ledger")
        if note:
            return grading.passed(f"✓ silu: correct in one launch, and your ledger is its trips{note}")
    sizes = grading.drawn_sizes(2, 6, 12)
    for n in sizes:
        for dtype in (torch.float32, runtime.HALF):
            where = f"silu_ledger({n}, {grading.dtype_name(dtype)})"
            led = _ledger(call_learner(silu_ledger, n, dtype, name="silu_ledger", where=where), where)
            if runtime.is_gpu():
                counted = ledger_by_tensor(silu_fused_ledger(n, dtype))
            else:
                x = grading.randn(n, dtype)
                counted = _counted(lambda x=x: silu(x))
            compare_with_count(led, counted, where, False, how=_count_how())
    note = _gpu_note() if runtime.is_gpu() else f" (counted in the interpreter, {len(sizes)} drawn sizes, 2 dtypes)"
    return grading.passed(f"✓ silu: correct in one launch, and your ledger is its trips{note}")


# -- 2. a reduction ---------------------------------------------------------------------------------------
@answer_key
def row_var_reference(x: torch.Tensor) -> torch.Tensor:
    return x.float().var(dim=-1, unbiased=False).to(x.dtype)


def check_row_var_trips(row_var, row_var_ledger) -> grading.Passed:
    """Exercise 2: ``row_var(x, block)``, each row's variance in one Triton kernel that reads the row in
    tiles of ``block`` elements, and ``row_var_ledger(rows, n, dtype, block)``, the trips it makes (a row
    read twice where the kernel makes two passes over it, once where it fits one tile or the kernel makes
    one pass)."""
    for block in (16, 1024):
        grading.check_function(
            lambda x, block=block: row_var(x, block),
            row_var_reference,
            lambda shape, dtype, gen: (grading.with_room_after(grading.randn(shape, dtype, gen=gen)),),
            name=f"row_var(x, block={block})",
            sizes=((1, 5), (7, 33), (3, 1000)),
            many=(300, 17),
            hint="mean first, then the mean of (x - mean)², in fp32; one program a row.",
            quiet=True,
        )
    if runtime.is_gpu():
        # one tile a row (read once), and rows of 4 MiB with 512 of them in flight, 2 GiB against an L2 of
        # tens of MiB: a second pass over a row comes back from DRAM. Rows start on 128-byte lines: with rows
        # of 2**20 + 255 floats the H100 (2026-11-27) read 1.135x what the two passes ask for
        specs = [
            [2**18, 1024 - 32 * grading.drawn_length(0, 3), 1024],
            [512, 2**20 + 32 * grading.drawn_length(0, 3), 1024],
        ]

        def at(spec):
            rows, n, block = spec
            where = f"row_var_ledger({rows}, {n}, float32, block={block})"
            return where, call_learner(
                row_var_ledger, rows, n, torch.float32, block, name="row_var_ledger", where=where
            )

        note = _on_gpu({"row_var": row_var}, "row_var", specs, at, _dram, "DRAM bytes against your ledger")
        if note:
            return grading.passed(f"✓ row_var: correct in one launch, and your ledger is its trips{note}")
    rows = grading.drawn_length(2, 5)
    checked = []
    for n, block in ((grading.drawn_length(3, 5), 64), (grading.drawn_length(7, 9), 64), (100, 128)):
        where = f"row_var_ledger({rows}, {n}, float32, block={block})"
        led = _ledger(
            call_learner(row_var_ledger, rows, n, torch.float32, block, name="row_var_ledger", where=where), where
        )
        if runtime.is_gpu():
            reads = rows * n * (1 if n <= block else 2)
            counted = ledger_by_tensor(Ledger(dtype_bytes=4).op("var", reads={"x": reads}, writes={"v": rows}))
        else:
            x = grading.randn((rows, n), torch.float32)
            counted = _counted(lambda x=x, block=block: row_var(x, block))
        compare_with_count(led, counted, where, False, how=_count_how())
        checked.append(f"{n} wide")
    note = _gpu_note() if runtime.is_gpu() else f" (counted in the interpreter, {len(checked)} widths)"
    return grading.passed(f"✓ row_var: correct in one launch, and your ledger is its trips{note}")


# -- 3. matmul --------------------------------------------------------------------------------------------
#: the package's plain matmul kernel's parameters, named as the exercise names the tensors
MATMUL_NAMES = {"a_ptr": "A", "b_ptr": "B", "c_ptr|bias_ptr|res_ptr|scale_ptr": "C"}


def run_matmul(a: torch.Tensor, b: torch.Tensor, block_m: int, block_n: int, block_k: int = 16) -> torch.Tensor:
    """The package's tiled matmul (its plain kernel) with tiles of ``block_m x block_n``: what the
    exercise counts."""
    return matmul(a, b, variant="plain", config={"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k})


def check_matmul_trips(my_ledger) -> grading.Passed:
    """Exercise 3: ``my_ledger(M, N, K, block_m, block_n, dtype)``: the trips of the tiled matmul ``C = A
    @ B`` (tensors named A, B, C) with tiles of ``block_m x block_n``, every program reading the whole K
    extent of its rows of A and its columns of B."""
    rng = grading.fresh_generator()
    tiles = ((16, 16), (32, 16), (16, 64))
    if runtime.is_gpu():
        # whole tiles and 64-element rows: no partial 32-byte sector at any edge for the L2 to round up
        specs = [[64 * int(torch.randint(8, 17, (1,), generator=rng)) for _ in range(3)] + [bm, bn] for bm, bn in tiles]

        def at(spec):
            where = "my_ledger({}, {}, {}, block_m={}, block_n={}, float32)".format(*spec)
            return where, call_learner(my_ledger, *spec, torch.float32, name="my_ledger", where=where)

        note = _on_gpu_shared("matmul", specs, at, lambda spec: matmul_ledger(*spec, torch.float32),
                              "the tiles' re-reads")  # fmt: skip
        if note:
            return grading.passed(
                f"✓ matmul ledger: A read once per column of tiles, B once per row of tiles, C written once{note}"
            )
    shapes = []
    for block_m, block_n in tiles:
        M, N, K = (int(torch.randint(17, 90, (1,), generator=rng)) for _ in range(3))
        where = f"my_ledger({M}, {N}, {K}, block_m={block_m}, block_n={block_n}, float32)"
        led = _ledger(
            call_learner(my_ledger, M, N, K, block_m, block_n, torch.float32, name="my_ledger", where=where), where
        )
        if runtime.is_gpu():
            counted = ledger_by_tensor(matmul_ledger(M, N, K, block_m, block_n, torch.float32))
        else:
            a, b = torch.randn(M, K), torch.randn(K, N)
            counted = _counted(lambda a=a, b=b, bm=block_m, bn=block_n: run_matmul(a, b, bm, bn), MATMUL_NAMES)
        compare_with_count(led, counted, where, True, how=_count_how())
        shapes.append(f"{M}x{N}x{K}")
    note = _gpu_note() if runtime.is_gpu() else f" (counted in the interpreter at {len(shapes)} shapes drawn afresh)"
    return grading.passed(
        f"✓ matmul ledger: A read once per column of tiles, B once per row of tiles, C written once{note}"
    )


# -- 4. attention -----------------------------------------------------------------------------------------
#: where the attention ledger's lse is off: it is fp32 whatever q's dtype
LSE_HINT = {
    "lse": " lse is fp32 (4 bytes a row) whatever the inputs' dtype: Ledger(dtype_bytes=dtype, sizes={'lse': 4})."
}
ATTENTION_NAMES = {"q_src": "Q", "k_src": "K", "v_src": "V", "o_ptr|o_desc": "O", "lse_ptr": "lse"}


def run_attention(q, k, v, block_m: int, block_n: int = 16):
    """The package's FlashAttention forward with query tiles of ``block_m`` rows: what the exercise counts."""
    return attention(q, k, v, config={"BLOCK_M": block_m, "BLOCK_N": block_n})


def attention_gpu_specs(rng) -> list[list]:
    """The shapes the attention exercise is counted at on a GPU, ``[B, H, N_q, N_k, D, block_m, dtype]``:
    whole 64-row tiles (no partial sector at an edge), and the GPU kernel's 16-bit inputs (it refuses fp32
    there: tensor cores), the lse still fp32."""
    lengths = [64 * int(torch.randint(8, 17, (1,), generator=rng)) for _ in range(4)]
    dtype = grading.dtype_name(runtime.HALF)
    return [[1, 2, lengths[2 * i], lengths[2 * i + 1], 64, bm, dtype] for i, bm in enumerate((16, 32))]


def check_attention_trips(my_ledger) -> grading.Passed:
    """Exercise 4: ``my_ledger(B, H, N_q, N_k, D, dtype, block_m)``: the trips of FlashAttention's forward
    (tensors named Q, K, V, O and lse, the row's log-sum-exp in fp32) with query tiles of ``block_m``
    rows, K and V streamed past each tile."""
    rng = grading.fresh_generator()
    tiles = "K and V read once per query tile, Q read and O written once"
    if runtime.is_gpu():
        specs = attention_gpu_specs(rng)

        def at(spec):
            B, H, N_q, N_k, D, bm, dtype = spec
            where = f"my_ledger({B}, {H}, {N_q}, {N_k}, {D}, {dtype}, block_m={bm})"
            return where, call_learner(my_ledger, B, H, N_q, N_k, D, getattr(torch, dtype), bm, name="my_ledger",
                                       where=where)  # fmt: skip

        def schedule(spec):
            B, H, N_q, N_k, D, bm, dtype = spec
            return attention_ledger(B, H, N_q, N_k, D, getattr(torch, dtype), block_m=bm)

        note = _on_gpu_shared("attention", specs, at, schedule, "K's and V's re-reads (programs of one head share "
                              "them)", LSE_HINT)  # fmt: skip
        if note:
            return grading.passed(f"✓ attention ledger: {tiles}{note}")
    shapes = []
    # the second shape in 16 bits: lse stays fp32 (4 bytes a row) whatever the inputs' dtype
    for block_m, dtype in ((16, torch.float32), (32, runtime.HALF)):
        B, H = 1, int(torch.randint(1, 3, (1,), generator=rng))
        N_q, N_k = (int(torch.randint(17, 80, (1,), generator=rng)) for _ in range(2))
        D = 16
        where = f"my_ledger({B}, {H}, {N_q}, {N_k}, {D}, {grading.dtype_name(dtype)}, block_m={block_m})"
        led = _ledger(call_learner(my_ledger, B, H, N_q, N_k, D, dtype, block_m, name="my_ledger", where=where), where)
        if runtime.is_gpu():
            counted = ledger_by_tensor(attention_ledger(B, H, N_q, N_k, D, dtype, block_m=block_m))
        else:
            q, k, v = attention_inputs(B, H, N_q, N_k, D, grading.dtype_name(dtype), device="cpu")
            counted = _counted(lambda q=q, k=k, v=v, bm=block_m: run_attention(q, k, v, bm), ATTENTION_NAMES)
        compare_with_count(led, counted, where, True, LSE_HINT, how=_count_how())
        shapes.append(f"N_q={N_q}, N_k={N_k}")
    note = _gpu_note() if runtime.is_gpu() else f" (counted in the interpreter at {len(shapes)} shapes drawn afresh)"
    return grading.passed(f"✓ attention ledger: {tiles}{note}")


# -- the inputs each exercise's kernel is counted at on a GPU: built in ncu's process -------------------
def _silu_case(g, n, dtype):
    x = torch.randn(int(n), device="cuda", dtype=getattr(torch, dtype))
    return lambda: g["silu"](x)


def _row_var_case(g, rows, n, block):
    x = torch.randn(int(rows), int(n), device="cuda")
    return lambda: g["row_var"](x, int(block))


def _matmul_case(g, M, N, K, block_m, block_n):
    a, b = torch.randn(int(M), int(K), device="cuda"), torch.randn(int(K), int(N), device="cuda")
    return lambda: run_matmul(a, b, int(block_m), int(block_n))


def attention_inputs(B, H, N_q, N_k, D, dtype, device="cuda"):
    """q, k and v of one attention case (``dtype``: its name)."""
    kw = dict(device=device, dtype=getattr(torch, dtype))
    return tuple(torch.randn(int(B), int(H), int(n), int(D), **kw) for n in (N_q, N_k, N_k))


def _attention_case(g, B, H, N_q, N_k, D, block_m, dtype):
    q, k, v = attention_inputs(B, H, N_q, N_k, D, dtype)
    return lambda: run_attention(q, k, v, int(block_m))


#: exercise -> the function that builds one case's inputs (from the learner's functions ``g`` and the
#: spec's arguments) and returns the call that runs the kernel
BUILDERS = {"silu": _silu_case, "row_var": _row_var_case, "matmul": _matmul_case, "attention": _attention_case}


def cases_target(g: dict, builder: str, specs: str):
    """What ncu's process profiles (:func:`fusionlab.measure.own.counted`): a case a spec (a JSON list of
    argument lists), named by its index, in order."""
    make = BUILDERS[builder]
    return ncu_cases_thunk(({"name": str(i)}, make(g, *spec)) for i, spec in enumerate(json.loads(specs)))
