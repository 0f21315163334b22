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

On a GPU the kernels run compiled, so the interpreter cannot count them: each check then compares the
ledger with the count the package's own ledger makes of the same schedule, and says so. Counting a
kernel's bytes on a GPU is :mod:`fusionlab.measure.ncu`'s (the recorded trips of the course's kernels:
:mod:`fusionlab.measure.recorded`).
"""

from __future__ import annotations

import torch

from .. import grading, runtime
from ..grading import CheckFailed, answer_key, call_learner
from ..kernels.attention import attention, attention_ledger
from ..kernels.matmul import matmul, matmul_ledger
from ..ledger import READ, WRITE, Ledger, human_bytes
from .compare import against_ledger, ledger_by_tensor
from .interpreter import InterpreterTrips


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


def compare_with_count(led: Ledger, counted: dict[tuple[str, str], int], where: str, by_tensor: bool) -> None:
    """Fail unless the ledger's fused trips equal the counted ones: tensor by tensor (``by_tensor``: the
    learner names the tensors as the exercise says) or in total reads and writes (the learner's kernel
    names its own parameters)."""
    if by_tensor:
        bad = [c for c in against_ledger(counted, led) if c.predicted != c.measured]
        if bad:
            c = bad[0]
            raise CheckFailed(
                f"{where}: your ledger says {c.direction} {c.tensor} {human_bytes(c.predicted)}; the kernel, counted "
                f"load by load in the interpreter, {'read' if c.direction == READ else 'wrote'} "
                f"{human_bytes(c.measured)}.{_why(c.predicted, c.measured) or _hidden(led, c.tensor, c.direction)}"
            )
        return
    want = _totals(ledger_by_tensor(led))
    got = _totals(counted)
    for what, p, m in (("read", want[0], got[0]), ("written", want[1], got[1])):
        if p != m:
            raise CheckFailed(
                f"{where}: your ledger says {human_bytes(p)} {what}; your kernel, counted load by load in the "
                f"interpreter, {what} {human_bytes(m)}.{_why(p, m)}"
            )


def _gpu_note() -> str:
    return (
        " (on this GPU the kernels run compiled, so the ledger was held against the package's count of the "
        "same schedule; on a CPU the interpreter counts your kernel's own loads)"
    )


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
            compare_with_count(led, counted, where, by_tensor=False)
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
        compare_with_count(led, counted, where, by_tensor=False)
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
    shapes = []
    for block_m, block_n in ((16, 16), (32, 16), (16, 64)):
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
        compare_with_count(led, counted, where, by_tensor=True)
        shapes.append(f"{M}x{N}x{K}")
    note = _gpu_note() if runtime.is_gpu() else f" (counted in the interpreter at {len(shapes)} shapes drawn afresh)"
    return grading.passed(
        f"✓ matmul ledger: A read once per column of tiles, B once per row of tiles, C written once{note}"
    )


# -- 4. attention -----------------------------------------------------------------------------------------
ATTENTION_NAMES = {"q_src": "Q", "k_src": "K", "v_src": "V", "o_ptr|o_desc": "O", "lse_ptr": "lse"}


def run_attention(q, k, v, block_m: int, block_n: int = 16):
    """The package's FlashAttention forward with query tiles of ``block_m`` rows: what the exercise counts."""
    return attention(q, k, v, config={"BLOCK_M": block_m, "BLOCK_N": block_n})


def check_attention_trips(my_ledger) -> grading.Passed:
    """Exercise 4: ``my_ledger(B, H, N_q, N_k, D, dtype, block_m)``: the trips of FlashAttention's forward
    (tensors named Q, K, V, O and lse, the row's log-sum-exp in fp32) with query tiles of ``block_m``
    rows, K and V streamed past each tile."""
    rng = grading.fresh_generator()
    shapes = []
    for block_m in (16, 32):
        B, H = 1, int(torch.randint(1, 3, (1,), generator=rng))
        N_q, N_k = (int(torch.randint(17, 80, (1,), generator=rng)) for _ in range(2))
        D = 16
        where = f"my_ledger({B}, {H}, {N_q}, {N_k}, {D}, float32, block_m={block_m})"
        led = _ledger(
            call_learner(my_ledger, B, H, N_q, N_k, D, torch.float32, block_m, name="my_ledger", where=where), where
        )
        if runtime.is_gpu():
            counted = ledger_by_tensor(attention_ledger(B, H, N_q, N_k, D, torch.float32, block_m=block_m))
        else:
            q, k, v = torch.randn(B, H, N_q, D), torch.randn(B, H, N_k, D), torch.randn(B, H, N_k, D)
            counted = _counted(lambda q=q, k=k, v=v, bm=block_m: run_attention(q, k, v, bm), ATTENTION_NAMES)
        compare_with_count(led, counted, where, by_tensor=True)
        shapes.append(f"N_q={N_q}, N_k={N_k}")
    tiles = "K and V read once per query tile, Q read and O written once"
    note = _gpu_note() if runtime.is_gpu() else f" (counted in the interpreter at {len(shapes)} shapes drawn afresh)"
    return grading.passed(f"✓ attention ledger: {tiles}{note}")
