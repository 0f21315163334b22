"""Exercise checkers a student can trust.

Every check draws fresh random inputs (a new seed each call), poisons outputs with NaN before the
run (so an element the kernel never wrote cannot pass by luck) with a poisoned guard zone behind
them (so a store past the end is caught too), uses sizes that are not a multiple
of any block size (so a missing mask shows), compares with a tolerance that fits the dtype, and,
where the exercise asks for fusion, counts the kernels launched and the torch ops called.
Failures raise :class:`CheckFailed` with what is wrong and where to look.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import runtime

# (atol, rtol) per dtype: a few units in the last place of each, since kernel and reference may
# round in a different order.
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float64: (1e-10, 1e-10),
}

#: lengths that are not multiples of any power-of-two block, so the last block always hangs over.
#: The same in every mode (small enough for the interpreter), so a checker prints the same line
#: on a laptop and on a GPU.
ODD_SIZES = (1, 7, 1000, 4097, 12_345)


class CheckFailed(AssertionError):
    """The answer is not right yet; the message says what and where to look."""


class Passed(str):
    """A checker's success message. It is printed when the check passes and returned for tests; as the
    last expression of a notebook cell it displays nothing, so the message does not appear twice."""

    def _ipython_display_(self):
        pass


def passed(msg: str) -> Passed:
    print(msg)
    return Passed(msg)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return TOLERANCES.get(dtype, (1e-3, 1e-3))


def fresh_generator(device=None) -> torch.Generator:
    """A generator with a new seed every call: the answer must be right on any input."""
    g = torch.Generator(device="cpu")
    g.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1))
    return g


def randn(shape, dtype=torch.float32, device=None, gen=None, scale: float = 3.0) -> torch.Tensor:
    gen = gen or fresh_generator()
    device = device or runtime.DEVICE
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


# -- comparing --------------------------------------------------------------------------------------
def assert_close(actual, expected, *, what: str = "output", hint: str = "") -> None:
    """Like ``torch.testing.assert_close`` but says how many elements are off, and where."""
    if not isinstance(actual, torch.Tensor):
        raise CheckFailed(f"{what}: expected a torch.Tensor, got {type(actual).__name__}. Did you forget to return it?")
    if actual.shape != expected.shape:
        raise CheckFailed(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}.")
    if actual.dtype != expected.dtype:
        raise CheckFailed(f"{what}: dtype {actual.dtype}, expected {expected.dtype} (store in the input's dtype).")
    if actual.device.type != expected.device.type:
        raise CheckFailed(f"{what}: on {actual.device}, expected {expected.device}.")
    atol, rtol = tolerance(expected.dtype)
    a = actual.detach().double().cpu().flatten()
    e = expected.detach().double().cpu().flatten()
    unwritten = torch.isnan(a) & ~torch.isnan(e)
    if unwritten.any():
        idx = unwritten.nonzero().flatten()
        raise CheckFailed(
            f"{what}: {idx.numel()} of {a.numel()} elements were never written (still the NaN poison), "
            f"first at flat index {idx[0].item()}. Look at the grid (enough programs to cover every "
            f"element?) and at the offsets/mask of the last block. {hint}".rstrip()
        )
    bad = ~torch.isclose(a, e, atol=atol, rtol=rtol, equal_nan=True)
    if bad.any():
        idx = bad.nonzero().flatten()
        i = idx[0].item()
        raise CheckFailed(
            f"{what}: {idx.numel()} of {a.numel()} elements differ beyond atol={atol:g}, rtol={rtol:g} "
            f"for {str(expected.dtype).replace('torch.', '')}; first at flat index {i}: got {a[i].item():.6g}, "
            f"expected {e[i].item():.6g}. {hint}".rstrip()
        )


# -- poisoning ---------------------------------------------------------------------------------------
def poison_(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(True)
    return t.fill_(-12345)


#: the smallest guard zone behind an output (or room behind an input), in elements
GUARD_MIN = 2**16


@contextlib.contextmanager
def poisoned_allocations():
    """While active, ``torch.empty`` and ``torch.empty_like`` hand out NaN-filled memory, so an
    output that a student's launcher allocates is poisoned too.

    A floating-point contiguous allocation is also the front of a buffer twice as long (at least
    :data:`GUARD_MIN` elements longer) whose poisoned tail is a *guard zone*: a store without a proper
    mask writes into it, where on a GPU it would silently corrupt whatever memory follows. Yields the
    guard zones, one per such allocation, for :func:`writes_past_the_end`.
    """
    orig_empty, orig_like = torch.empty, torch.empty_like
    guards: list[torch.Tensor] = []

    def guarded(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point() or not t.is_contiguous():
            return poison_(t)
        n = t.numel()
        big = poison_(orig_empty(n + max(n, GUARD_MIN), dtype=t.dtype, device=t.device))
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
    first one is; None if every guard is intact."""
    for g in guards:
        hit = ~torch.isnan(g.detach().float().cpu())
        if hit.any():
            return int(hit.sum()), int(hit.nonzero()[0][0])
    return None


def with_room_after(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied to the front of a longer buffer of zeros: a load past its end (a missing load mask)
    reads finite zeros, not whatever memory follows, and cannot fault."""
    n = t.numel()
    big = torch.zeros(n + max(n, GUARD_MIN), dtype=t.dtype, device=t.device)
    big[:n] = t.reshape(-1)
    return big[:n].view(t.shape)


# -- counting launches -----------------------------------------------------------------------------
# aten ops that allocate, view or move memory: not computation, so not counted against fusion
_NOT_COMPUTE = (
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "fill_", "zeros", "zeros_like",
    "ones", "full", "copy_", "_to_copy", "to", "view", "_unsafe_view", "reshape", "as_strided", "detach",
    "alias", "lift_fresh", "t", "contiguous", "clone", "expand", "squeeze", "unsqueeze", "flatten",
    "numel", "sym_size", "sym_stride", "is_same_size", "_local_scalar_dense", "resolve_conj", "resolve_neg",
    "set_", "slice", "select", "permute", "transpose",
)


def _triton_fn_classes():
    classes = []
    try:
        from triton.runtime.jit import JITFunction

        classes.append(JITFunction)
    except Exception:
        pass
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except Exception:
        pass
    return classes


class LaunchCounter(TorchDispatchMode):
    """Counts Triton kernel launches and torch compute ops inside a ``with`` block.

    >>> with LaunchCounter() as c:
    ...     y = my_fused_fn(x)
    >>> c.triton_launches, c.torch_ops
    (['my_kernel'], [])
    """

    def __init__(self):
        super().__init__()
        self.triton_launches: list[str] = []
        self.torch_ops: list[str] = []
        self._depth = 0  # inside a Triton launch (the interpreter copies tensors with torch ops)
        self._patched = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if self._depth == 0 and name not in _NOT_COMPUTE:
            self.torch_ops.append(name)
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        counter = self
        for cls in _triton_fn_classes():
            orig = cls.run

            def run(self_, *a, __orig=orig, **k):
                counter.triton_launches.append(getattr(self_, "__name__", None) or self_.fn.__name__)
                counter._depth += 1
                try:
                    return __orig(self_, *a, **k)
                finally:
                    counter._depth -= 1

            cls.run = run
            self._patched.append((cls, orig))
        return super().__enter__()

    def __exit__(self, *exc):
        for cls, orig in self._patched:
            cls.run = orig
        self._patched.clear()
        return super().__exit__(*exc)


def _unfilled_stub(e: BaseException) -> str | None:
    """The hint of an exercise stub that is still in place, however it surfaced: a plain
    NotImplementedError, one wrapped by Triton's interpreter, or a failed ``tl.static_assert``
    when the stub sits inside a kernel compiled for a GPU."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, NotImplementedError):
            return str(e)
        text = str(e)
        if "NotImplementedError" in text or "Exercise:" in text:
            line = next((ln for ln in text.splitlines() if "Exercise" in ln or "NotImplementedError" in ln), text)
            return line.strip()
        e = e.__cause__ or e.__context__
    return None


# -- the checks --------------------------------------------------------------------------------------
def _dtype_name(d) -> str:
    return str(d).replace("torch.", "")


def check_function(
    student: Callable,
    reference: Callable,
    make_inputs: Callable[[int, torch.dtype, torch.Generator], tuple],
    *,
    name: str,
    sizes: Sequence[int] = ODD_SIZES,
    dtypes: Sequence[torch.dtype] | None = None,
    launches: int | None = 1,
    allow_torch_ops: bool = False,
    hint: str = "",
) -> Passed:
    """Run ``student(*inputs)`` against ``reference(*inputs)`` on fresh inputs of every size and dtype.

    ``launches``: the number of Triton kernels the answer must launch (1 for a fused answer; None to
    skip). ``allow_torch_ops=False`` rejects answers that compute with torch (calling the reference
    is right but is not a Triton kernel).
    """
    dtypes = list(dtypes) if dtypes is not None else [d for d in (torch.float32, runtime.HALF)]
    n_checks = 0
    for dtype in dtypes:
        for n in sizes:
            gen = fresh_generator()
            inputs = make_inputs(n, dtype, gen)
            expected = reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
            where = f"{name}, size {n}, {_dtype_name(dtype)}"
            with poisoned_allocations() as guards, LaunchCounter() as counter:
                try:
                    actual = student(*inputs)
                except CheckFailed:
                    raise
                except Exception as e:
                    stub = _unfilled_stub(e)
                    if stub is not None:
                        raise CheckFailed(f"{name}: not implemented yet ({stub}).") from None
                    raise CheckFailed(f"{where}: your code raised {type(e).__name__}: {e}") from e
            past = writes_past_the_end(guards)
            if past is not None:
                count, first = past
                start = "right after the end" if first == 0 else f"{first} elements after the end"
                raise CheckFailed(
                    f"{where}: the kernel wrote {count} elements past the end of its output (the first one "
                    f"{start}). A store whose mask misses the rows or columns beyond the tensor (or has no "
                    "mask) writes into whatever memory follows: on a GPU that corrupts it silently. Mask "
                    "every store: offs < n_elements for a 1-D block, (offs_m[:, None] < n_rows) & "
                    "(offs_n[None, :] < n_cols) for a 2-D tile."
                )
            if not allow_torch_ops and counter.torch_ops:
                ops = ", ".join(sorted(set(counter.torch_ops)))
                raise CheckFailed(
                    f"{where}: the answer computes with torch ({ops}). The result may be right, but the exercise "
                    "asks for the work to happen inside your Triton kernel."
                )
            if launches is not None and len(counter.triton_launches) != launches:
                got = len(counter.triton_launches)
                what = ", ".join(counter.triton_launches) or "none"
                msg = (
                    f"{where}: expected {launches} Triton kernel launch{'es' if launches != 1 else ''}, "
                    f"saw {got} ({what})."
                )
                if got > launches:
                    msg += " Each launch is a round trip through HBM: fuse them into one kernel."
                raise CheckFailed(msg)
            assert_close(actual, expected, what=where, hint=hint)
            n_checks += 1
    # Mode-independent wording (fp16 in the interpreter, bf16 on a GPU): nbval compares this line.
    msg = (
        f"✓ {name}: {n_checks} checks passed ({len(sizes)} odd sizes from {min(sizes)} to {max(sizes)} "
        f"× {len(dtypes)} dtypes, fresh random inputs, poisoned outputs"
        + (f", {launches} launch each" if launches is not None else "")
        + ")"
    )
    return passed(msg)
