"""The machinery every exercise checker uses: checks a learner cannot fool, messages a learner can use.

Each kernel check, on every call:

- draws **fresh random inputs** from a new master seed, which every failure message quotes, so
  ``with fusionlab.grading.replay(SEED): check_...(fn)`` reruns the very inputs that failed;
- **poisons every allocation** the answer makes, through whatever path (``torch.empty``,
  ``empty_like``, ``new_empty``, ``empty_strided``...): a :class:`Sandbox` (a ``TorchDispatchMode``)
  fills each new tensor with a NaN *bit pattern* (other dtypes: a value that fits them, :func:`poison_`)
  and puts a poisoned **guard zone** behind it, so an element never written and a store past the end
  are both seen by bit comparison (a kernel that writes NaN does not look unwritten; one that writes
  past the end does not hide behind a NaN);
- gives inputs room behind them, filled with NaN (a load past the end never faults, and an unmasked
  one shows in the result, where zeros would add nothing to a sum), and compares every input **bit for
  bit** after the call: an answer that writes into its input is caught;
- uses sizes that are not block multiples, lengths **drawn afresh** at a block boundary (n equal to
  the block included), one size **large enough to need many programs** at any block size the GPU or
  the interpreter would use, and one size **tried twice** with fresh values (an answer that caches by
  shape is caught); computes the reference only **after** the answer ran, so no answer finds it on the
  stack;
- where fusion is asked: counts **Triton launches** (one logical launch per call, autotuned kernels
  included), **torch compute ops** and **torch passes** (copies and casts of tensor data), requires
  the launched kernel to receive the inputs and the output itself, sees torch run inside a launch (a
  heuristics function) and torch run with dispatch switched off (the profiler records it), and refuses
  the package's own kernels and the checkers' answer keys inside the answer;
- **conceals the inputs** outside the runs of the answer's kernels (they hold decoys there), so that
  numpy, another library or torch out of sight, followed by one kernel that copies the result in,
  computes the answer for the decoys; requires what the answer returns to be as its last kernel run left
  it; refuses a kernel whose run would execute the answer's own code (a pre-run hook, a thread started
  alongside, a pointer that is not a tensor). :func:`run_answer` is that sequence, in one place, for
  every lesson's checkers;
- turns any exception the learner's code raises into a short message (what, where to look, seed).

Checkers return a :class:`Passed`, printed once when the check passes and displayed as nothing, so
the ✓ line never shows twice.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import numbers
import os
import random
import re
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from . import _exercise, _triton, runtime
from ._triton import Launch, one_profiler_cycle, quiet_stderr  # noqa: F401  (Launch: the grading command rebuilds launches with it)
from .instrument import FREE, PASSES, LaunchCounter, op_name
from .ledger import Ledger, human_bytes

# the comparisons the checks make, bound once at import: an answer that rebinds torch.isclose or
# torch.equal while it runs cannot change what a check compares with (the grading command goes further:
# its references and comparisons live in another process, see fusionlab.grade)
_isclose, _equal, _nonzero = torch.isclose, torch.equal, torch.Tensor.nonzero

#: (atol, rtol) per dtype — a few units in the last place of each, since kernel and reference may
#: round in a different order. The one table: tests import it too.
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float64: (1e-10, 1e-10),
}

#: lengths that are not multiples of any power-of-two block, so the last block always hangs over.
#: The same in every mode, so a checker prints the same line on a laptop and on a GPU.
ODD_SIZES = (1, 7, 1000, 4097, 12_345)
#: a length that needs many programs at any block a kernel would use on a GPU (<= 8192 elements: 128
#: programs) or in the interpreter (65536: 16); a fixed grid of a dozen programs cannot cover it
MANY_PROGRAMS = 2**20 + 3
#: the smallest guard zone behind an output (or room behind an input), in elements
GUARD_MIN = 2**16


class CheckFailed(AssertionError):
    """The answer is not right yet; the message says what, where to look, and the seed to reproduce."""


class ExerciseNotDone(NotImplementedError):
    """Raised by an exercise stub that is still in place."""


@dataclass(frozen=True)
class Passed:
    """A checker's success: printed once by the checker, displayed as nothing (so a checker as the
    last line of a cell does not show its ✓ twice)."""

    message: str
    checks: int = 0

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return self.message

    def _ipython_display_(self):
        pass

    def __contains__(self, text: str) -> bool:
        return text in self.message

    def startswith(self, prefix: str) -> bool:
        return self.message.startswith(prefix)


def passed(msg: str, checks: int = 0) -> Passed:
    print(msg)
    return Passed(msg, checks)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return TOLERANCES.get(dtype, (1e-3, 1e-3))


def dtype_name(d) -> str:
    return str(d).replace("torch.", "")


# -- seeds --------------------------------------------------------------------------------------------
_REPLAY: list[int] = []
_CURRENT: list[random.Random] = []


def new_seed() -> int:
    """A fresh master seed (or the one :func:`replay` asks for)."""
    if _REPLAY:
        return _REPLAY[-1]
    return int.from_bytes(os.urandom(6), "little")


@contextlib.contextmanager
def replay(seed: int):
    """Rerun a check with the inputs of a failure message: ``with replay(SEED): check_x(fn)``."""
    _REPLAY.append(int(seed))
    try:
        yield
    finally:
        _REPLAY.pop()


@contextlib.contextmanager
def seeded(seed: int):
    """Within the block, :func:`fresh_generator` derives its seeds from ``seed``."""
    _CURRENT.append(random.Random(seed))
    try:
        yield seed
    finally:
        _CURRENT.pop()


def fresh_generator() -> torch.Generator:
    """A CPU generator with a new seed: derived from the running check's master seed, else random."""
    g = torch.Generator(device="cpu")
    g.manual_seed(_CURRENT[-1].getrandbits(63) if _CURRENT else int.from_bytes(os.urandom(8), "little") >> 1)
    return g


def randn(shape, dtype=torch.float32, device=None, gen=None, scale: float = 3.0) -> torch.Tensor:
    gen = gen or fresh_generator()
    device = device or runtime.DEVICE
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


def fail(msg: str, seed: int | None = None) -> CheckFailed:
    """A CheckFailed whose message ends with how to reproduce it."""
    if seed is not None:
        msg = f"{msg.rstrip()}\n  (seed {seed}: `with fusionlab.grading.replay({seed}): ...` reruns these inputs)"
    return CheckFailed(msg)


# -- poison -------------------------------------------------------------------------------------------
def _known(table: dict) -> dict:
    """``table`` keyed by dtype names, less the dtypes this torch does not have."""
    return {getattr(torch, k): v for k, v in table.items() if hasattr(torch, k)}


#: the poison of each floating dtype, as (the integer view, its bits): NaN patterns with a payload no
#: arithmetic produces (a computed NaN is 0x7FC00000 and the like). An 8-bit float with a single NaN
#: (e4m3fn has 0x7F and 0xFF, the fnuz formats 0x80, e8m0 0xFF) gets that NaN: a kernel that stores NaN
#: there looks unwritten, a mistake either way
_POISON_BITS = _known(
    {
        "float64": (torch.int64, 0x7FF5A5A5A5A5A5A5),
        "float32": (torch.int32, 0x7FA5A5A5),
        "float16": (torch.int16, 0x7DA5),
        "bfloat16": (torch.int16, 0x7FA5),
        "float8_e5m2": (torch.uint8, 0x7D),
        "float8_e4m3fn": (torch.uint8, 0xFF),
        "float8_e5m2fnuz": (torch.uint8, 0x80),
        "float8_e4m3fnuz": (torch.uint8, 0x80),
        "float8_e8m0fnu": (torch.uint8, 0xFF),
    }
)


#: the NaN behind an input: another payload than the poison's, so a kernel that copies it unmasked past the
#: end of its output does not leave the guard looking untouched
_PAD_BITS = {
    torch.float64: (torch.int64, 0x7FF4B4B4B4B4B4B4),
    torch.float32: (torch.int32, 0x7FB4B4B4),
    torch.float16: (torch.int16, 0x7CB4),
    torch.bfloat16: (torch.int16, 0x7FB4),
}

#: the integer view of a dtype with no poison of its own (packed 4-bit floats, bit types), by element size
_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _poison_of(dtype: torch.dtype) -> tuple[torch.dtype | None, int | bool]:
    """``(view, value)``: the poison of ``dtype`` is ``value`` written through ``t.view(view)`` (None: into
    ``t`` itself). Every value fits its dtype. Integers: -12345 where it fits, else the dtype's own extreme
    (int8's -128, which symmetric int8 quantization never produces; an unsigned type's maximum); bools:
    True; any other dtype: the bytes 0xA5."""
    if dtype in _POISON_BITS:
        return _POISON_BITS[dtype]
    if dtype == torch.bool:
        return None, True
    if not dtype.is_floating_point and not dtype.is_complex:
        try:
            info = torch.iinfo(dtype)
        except TypeError:
            info = None
        if info is not None:
            return None, (-12345 if info.min <= -12345 else info.min) if info.min < 0 else info.max
    size = torch.empty(0, dtype=dtype).element_size()
    view = _RAW[size]
    return view, int.from_bytes(b"\xa5" * size, "little", signed=view != torch.uint8)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """``t``'s raw bits as integers, contiguous, where ``t`` is (complex: its real and imaginary parts)."""
    t = t.detach()
    if t.is_complex():
        return _raw(torch.view_as_real(t))
    view = torch.uint8 if t.dtype == torch.bool else _poison_of(t.dtype)[0]
    return t.contiguous().view(view) if view is not None else t.contiguous()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s raw bits as integers (a copy on the CPU, contiguous)."""
    return _raw(t).cpu()


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with the poison of its dtype (:func:`_poison_of`: a NaN bit pattern for floats, a value
    that fits for integers, True for bools), whatever the dtype."""
    if t.is_complex():
        poison_(torch.view_as_real(t))
        return t
    view, value = _poison_of(t.dtype)
    (t.view(view) if view is not None else t).fill_(value)
    return t


def poisoned(t: torch.Tensor) -> torch.Tensor:
    """Where ``t`` still holds the poison bit pattern (flat bool mask on the CPU)."""
    if t.is_complex():  # both parts still the poison
        return poisoned(torch.view_as_real(t)).view(-1, 2).all(-1)
    _, value = _poison_of(t.dtype)
    return (_bits(t) == int(value)).flatten()


def first_unwritten(unwritten: torch.Tensor, cols: int) -> tuple[int, str]:
    """The row of the first element :func:`poisoned` found (``unwritten``, flat, rows of ``cols``), and a
    tip when that row's start was written and its end was not: a block that does not cover the row."""
    first = int(unwritten.nonzero()[0][0])
    row, col = divmod(first, cols)
    if col > 0 and not unwritten[row * cols : first].any():
        return row, f" Columns 0-{col - 1} of it were written, {col} on were not: a row's block must cover all {cols}."
    return row, ""


_ALLOC_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
#: the sandboxes entered now, innermost last (the grading command's remote answer reports into the top one)
ACTIVE: list[Sandbox] = []


#: a chain of this many 16-bit adds, each adding to the last one's result, is an accumulator kept in 16 bits
#: (``x + r + b`` is two; a loop's ``acc += ...`` over three blocks is three)
HALF_CHAIN = 3


class _HalfChains:
    """What :func:`_half_sums_hook` knows within one kernel run: the depth of each 16-bit add's result in a
    chain of 16-bit adds (the handles kept alive, so that their ids stay theirs)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.depth: dict[int, int] = {}
        self.keep: list = []


@contextlib.contextmanager
def _half_sums_hook(record: Callable[[str], None]):
    """Triton's interpreter only: call ``record(what)`` for each sum an interpreted kernel runs in a 16-bit
    float type, the precision mistake the lessons' fp32 upcasts prevent. The interpreter cannot show it by
    its numbers: ``tl.sum`` of a float16 block is numpy's sum, which accumulates in fp32 and rounds once,
    where a GPU adds in 16 bits. So it is seen by type: ``tl.sum`` (and ``tl.cumsum``) of a 16-bit tensor,
    ``tl.dot`` into a 16-bit accumulator, and a chain of :data:`HALF_CHAIN` 16-bit adds each adding to the
    last (``acc += ...`` with ``acc`` 16-bit). One 16-bit add (``h = x + r`` rounded, as it is stored) is
    not a sum. Yields the chains' state (reset as each kernel run begins)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as it
    except ImportError:  # no interpreter: nothing to watch
        yield _HalfChains()
        return
    half = {tl.float16: "float16", tl.bfloat16: "bfloat16"}
    state = _HalfChains()
    builder, reduce_ops = it.InterpreterBuilder, getattr(it, "ReduceOps", None)
    scan_ops = getattr(it, "ScanOps", None)
    saved = []

    def patch(cls, name, make):
        orig = cls.__dict__.get(name) if cls is not None else None
        if orig is not None:
            saved.append((cls, name, orig))
            setattr(cls, name, make(orig))

    def scalar(t):
        dt = getattr(t, "dtype", None)
        return getattr(dt, "scalar", dt)

    def on_reduce(what):
        def make(orig):
            def wrapped(self, input, *args, **kwargs):
                name = half.get(scalar(input))
                if name is not None:
                    record(f"{what} of a {name} tensor")
                return orig(self, input, *args, **kwargs)

            return wrapped

        return make

    def fadd(orig):
        def wrapped(self, lhs, rhs):
            out = orig(self, lhs, rhs)
            name = half.get(getattr(out.dtype, "scalar", out.dtype))
            if name is not None:
                depth = max(state.depth.get(id(lhs), 0), state.depth.get(id(rhs), 0)) + 1
                state.depth[id(out)] = depth
                state.keep.append(out)
                if depth >= HALF_CHAIN:
                    record(f"a {name} accumulator (acc += ... with acc in {name})")
            return out

        return wrapped

    def dot(orig):
        def wrapped(self, a, b, d, *args, **kwargs):
            name = half.get(getattr(d.dtype, "scalar", d.dtype))
            if name is not None:
                record(f"tl.dot into a {name} accumulator")
            return orig(self, a, b, d, *args, **kwargs)

        return wrapped

    patch(reduce_ops, "sum", on_reduce("tl.sum"))
    patch(scan_ops, "cumsum", on_reduce("tl.cumsum"))
    patch(builder, "create_fadd", fadd)
    patch(builder, "create_dot", dot)
    try:
        yield state
    finally:
        for cls, name, orig in reversed(saved):
            setattr(cls, name, orig)


#: a sum in a 16-bit float type in Triton's IR (TTIR): an add reduction's combine region, or a dot's accumulator
_IR_HALF_SUMS = (
    (re.compile(r"arith\.addf [^\n]*: (b?f16)\b[^\n]*\n\s*tt\.(?:reduce|scan)\.return"), "tl.sum of a {} tensor"),
    (re.compile(r"tt\.dot [^\n]*-> tensor<[0-9x]+x(b?f16)"), "tl.dot into a {} accumulator"),
)


#: a loop (``scf.for``) carrying a 16-bit float value, and a 16-bit add before its yield: an accumulator
_IR_LOOP = re.compile(r"scf\.for [^\n]*-> \(([^)]*)\)|scf\.for [^\n]*-> (tensor<[^>]*>|b?f16)\s*\{?")
_IR_HALF_ADD = re.compile(r"arith\.addf [^\n]*: (?:tensor<[0-9x]+x)?(b?f16)\b")


def _half_accumulators_in_ir(ttir: str) -> list[str]:
    found = []
    for m in _IR_LOOP.finditer(ttir):
        carried = m.group(1) or m.group(2) or ""
        if not re.search(r"xb?f16>|(?:^|[ ,])b?f16\b", carried):
            continue
        end = ttir.find("scf.yield", m.end())
        add = _IR_HALF_ADD.search(ttir, m.end(), end if end >= 0 else len(ttir))
        if add is not None:
            found.append(f"a {'bfloat16' if add.group(1) == 'bf16' else 'float16'} accumulator carried by a loop")
    return found


def _half_sums_in_ir(compiled) -> list[str]:
    """On a GPU: the 16-bit sums in the Triton IR of ``compiled``, one build that a run launched (only the
    builds the answer launched: an earlier build of the same kernel, another specialisation or a version
    the learner has since fixed, is not the answer's). [] where the build keeps no IR."""
    asm = getattr(compiled, "asm", None)
    ttir = asm.get("ttir", "") if hasattr(asm, "get") else ""
    texts = [
        what.format("bfloat16" if m.group(1) == "bf16" else "float16")
        for pattern, what in _IR_HALF_SUMS
        for m in pattern.finditer(ttir)
    ]
    found: list[str] = []
    for t in texts + _half_accumulators_in_ir(ttir):
        if t not in found:
            found.append(t)
    return found


def _on_gpu(args) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in tree_leaves(args))


class Sandbox(LaunchCounter):
    """Where a learner's answer runs: every allocation poisoned and guarded, every launch, torch op and
    pass counted (see :class:`fusionlab.instrument.LaunchCounter`).

    Two more ways torch can do the work are seen here: torch run *inside* a launch (by a
    ``@triton.heuristics`` function or a pre-run hook: the launch counter leaves ops inside launches
    to the interpreter, which copies with torch; compute ops are counted there too), and torch run with
    Python dispatch switched off (``torch._C._DisableTorchDispatch()``), which no dispatch mode sees:
    the profiler, below dispatch, still records those ops (:attr:`hidden_ops`).

    Any other library (numpy, torch on a copy, anything that reads memory) is met by **concealed
    inputs** (:meth:`conceal`): outside the runs of its kernels the answer sees decoys in place of its
    inputs, the real values only while a kernel itself runs (after any heuristics function or autotuner
    hook; a kernel with a hook that Triton runs inside the run, or a pointer that is not a tensor, is
    refused its inputs, :attr:`refused`). A result computed before the launch is computed on decoys; one
    written into the output after the last run is seen, since each run's tensors are kept as it left
    them (:meth:`written_after`). Only the answer's kernels can have read the inputs and written the
    output."""

    def __init__(self, guard: bool = True, widen: dict | None = None):
        super().__init__()
        self.guard = guard
        #: ``{constexpr: (value, wider)}``: a kernel run with ``constexpr=value`` runs with ``wider`` instead
        #: (a tile of one row made taller, on the grid launched for one row: see :func:`check_taller_tiles`)
        self.widen = dict(widen or {})
        self.widened = False
        self.guards: list[torch.Tensor] = []
        self.allocations: list[torch.Tensor] = []
        #: every aten op the dispatch mode saw, at any depth (what the profiler may also list)
        self.seen: set[str] = set()
        #: compute ops the profiler recorded that no dispatch mode saw: torch with dispatch switched off
        self.hidden_ops: list[str] = []
        self._prof = None
        #: the concealed inputs: (tensor, its real values, its decoy)
        self._concealed: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        #: each storage a kernel run was handed, as the last run left it (its bytes, by address)
        self._after_run: dict[int, torch.Tensor] = {}
        #: why a kernel run was refused the real inputs
        self.refused: list[str] = []
        self._run_hook = None
        self._real_shown = True
        self._threads: set[int | None] = set()
        #: in the interpreter: the addresses every tl.store of the answer's kernels wrote (one array a store)
        self._stored: list = []
        self._mem_hook = None
        #: sums the answer's kernels ran in a 16-bit type (``"tl.sum of a float16 tensor"``...): see
        #: :func:`_half_sums_hook` (interpreter) and :func:`_half_sums_in_ir` (GPU)
        self.half_sums: list[str] = []
        self._half_hook = None
        self._half_state: _HalfChains | None = None
        #: in the interpreter: each concealed input a kernel loaded past the end of -> bytes past it, first load
        self.read_past: dict = {}
        self._rooms: list = []
        self._room_of: list = []
        self._kernels: list = []
        #: the builds the answer's runs launched (GPU): the IR its 16-bit sums are read from
        self._builds: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = op_name(func)
        self.seen.add(name)
        if (self._state is None or self._state.depth == 0) and name in _ALLOC_OPS:
            out = func(*args, **kwargs)
            return self._guarded(out)
        if self._state is not None and self._state.depth > 0 and name not in FREE and name not in PASSES:
            # torch computing inside a launch is the answer's (a heuristics function, a pre-run hook):
            # the interpreter only copies there; on a GPU the autotuner's timing runs on CPU tensors
            if not runtime.is_gpu() or _on_gpu((args, kwargs)):
                self.torch_ops.append(name)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def conceal(self, tensors: Sequence, gen: torch.Generator | None = None, decoys: Sequence | None = None) -> None:
        """Until the sandbox ends, ``tensors`` hold decoys (random values of their shape and dtype) except
        while a kernel itself runs. Call before entering; tensors with overlapping elements (stride 0)
        and single elements are left as they are. ``decoys``: the decoy of each tensor (None: drawn here), as
        the grading command sends them, so that the grader knows what the answer saw."""
        gen = gen or fresh_generator()
        decoys = list(decoys) if decoys is not None else [None] * len(tensors)
        with _bookkeeping():
            for t, d in zip(tensors, decoys, strict=True):
                if not isinstance(t, torch.Tensor) or t.numel() < 2 or t.is_complex():
                    continue
                if any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride(), strict=True)):
                    continue
                d = d.to(t.device) if isinstance(d, torch.Tensor) else _decoy(t, gen)
                self._concealed.append((t, t.detach().clone(), d))
        self._show(real=False)

    def _show(self, real: bool) -> None:
        # what was written into an input meanwhile is kept (a kernel storing into its input, or the host
        # writing into the decoy): the check that inputs are unchanged must still see it
        if not self._concealed or self._real_shown == real:
            return
        self._real_shown = real
        with _bookkeeping():
            for t, r, d in self._concealed:
                t = t.detach()
                if real:
                    if not _same_bits(t, d):
                        r.copy_(t)
                    t.copy_(r)
                else:
                    r.copy_(t)
                    t.copy_(d)

    @contextlib.contextmanager
    def showing_real(self):
        """The concealed inputs hold their real values inside the block (the grading command sends them
        to the learner's process, which conceals them there)."""
        self._show(real=True)
        try:
            yield
        finally:
            self._show(real=False)

    def concealed(self) -> set[int]:
        """The storages of the concealed inputs."""
        return {_storage(t) for t, _, _ in self._concealed}

    def decoy_of(self, t: torch.Tensor) -> torch.Tensor | None:
        """The decoy ``t`` holds outside kernel runs (None: not concealed)."""
        return next((d for c, _, d in self._concealed if c is t), None)

    def _launched(self, kernel, compiled) -> None:
        if compiled is not None and not any(c is compiled for c in self._builds):
            self._builds.append(compiled)

    def _run_begins(self, kernel, args, kwargs) -> None:
        if not any(k is kernel for k in self._kernels):
            self._kernels.append(kernel)
        if self._half_state is not None:
            self._half_state.reset()
        for key, (value, wider) in self.widen.items():
            if kwargs.get(key) == value:
                kwargs[key] = wider
                self.widened = True
        why = _triton.learner_hooks(kernel)
        # a thread the answer started, alive while its kernel runs, could read the real inputs meanwhile
        # (one that C++ code entered Python from, such as autograd's device threads, is not the answer's)
        started = [
            t.name
            for t in threading.enumerate()
            if t.ident not in self._threads and t.is_alive() and not isinstance(t, threading._DummyThread)
        ]
        why += [f"a thread it started, still running ({', '.join(started)})"] if started else []
        odd = {type(a).__name__ for a in tree_leaves((args, kwargs)) if _foreign_pointer(a)}
        why += [f"a pointer argument that is not a torch.Tensor ({', '.join(sorted(odd))})"] if odd else []
        if why:
            self.refused += [w for w in why if w not in self.refused]
            return
        self._show(real=True)

    def _run_ends(self, kernel, args, kwargs) -> None:
        if not self._concealed:
            return
        self._show(real=False)
        with _bookkeeping():
            for a in tree_leaves((args, kwargs)):
                if isinstance(a, torch.Tensor):
                    self._after_run[_storage(a)] = _storage_bytes(a).clone()

    def computed_from_decoys(self, actual, reference: Callable, inputs: Sequence) -> bool:
        """Whether ``actual`` is ``reference`` of the decoys the answer saw in place of ``inputs``: a result
        computed outside the answer's kernels. The absolute tolerance scales with the largest value: a sum
        of many terms (a matmul's) rounds by its terms' size, not its own, and the answer for random decoys
        is nowhere near the answer for the real inputs, nor that of any honest mistake on them."""
        decoys = {id(t): d for t, _, d in self._concealed}
        if not decoys or not isinstance(actual, torch.Tensor):
            return False
        fake = [decoys.get(id(t), t) if isinstance(t, torch.Tensor) else t for t in inputs]
        try:
            want = reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in fake])
            atol, rtol = tolerance(want.dtype)
            a, w = actual.detach().double().cpu(), want.detach().double().cpu()
            if a.shape != w.shape:
                return False
            finite = w[torch.isfinite(w)].abs()
            atol *= max(1.0, float(finite.max())) if finite.numel() else 1.0
            return bool(_isclose(a, w, atol=atol, rtol=rtol, equal_nan=True).all())
        except Exception:  # a reference that cannot take the decoys: no such verdict
            return False

    def _on_half_sum(self, what: str) -> None:
        if what not in self.half_sums:
            self.half_sums.append(what)

    def _on_access(self, direction: str, addresses, element_bytes: int) -> None:
        if direction == "write" and self._concealed:
            self._stored.append(addresses)
        elif direction == "read" and self._rooms and addresses.size and int(addresses.max()) >= self._rooms[0][0]:
            self._reads_in_rooms(addresses)

    def _reads_in_rooms(self, addresses) -> None:
        # the lanes that read an input's room (past its last element, inside its own buffer): an unmasked load
        for i, (lo, hi, spans) in enumerate(self._rooms):
            hit = addresses[(addresses >= lo) & (addresses < hi)]
            for a, b in spans:  # the room may hold another input (q, k, v as views of one buffer): not past
                hit = hit[(hit < a) | (hit >= b)]
            if hit.size:
                first = int(hit.min()) - lo
                self.read_past.setdefault(self._room_of[i], first)

    def _watch_rooms(self) -> None:
        """The concealed inputs whose buffer runs on past their last element (:func:`with_room_after`): a load
        there reads past the input's end (its values NaN: a masked store may still throw them away)."""
        self._rooms, self._room_of = [], []
        spans = []
        for t, _, _ in self._concealed:
            if t.numel() == 0 or min(t.stride(), default=1) < 0:
                continue
            last = t.data_ptr() + (sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) + 1) * (
                t.element_size()
            )
            spans.append((t.data_ptr(), last))
            storage_end = t.untyped_storage().data_ptr() + t.untyped_storage().nbytes()
            if storage_end > last:
                self._rooms.append((last, storage_end))
                self._room_of.append(t)
        order = sorted(range(len(self._rooms)), key=lambda i: self._rooms[i][0])
        # another input's elements inside a room (g and u as column halves of one buffer) are no room
        self._rooms = [(*self._rooms[i], [s for s in spans if s[1] > self._rooms[i][0]]) for i in order]
        self._room_of = [self._room_of[i] for i in order]

    def reads_past_the_end(self, inputs: Sequence) -> tuple[int, int] | None:
        """In the interpreter: ``(index, elements)`` of the first of ``inputs`` a kernel loaded past the end of
        (how far past its end, in elements, the first such load reached), or None."""
        for i, t in enumerate(inputs):
            for room_of, first in self.read_past.items():
                if isinstance(t, torch.Tensor) and room_of is t:
                    return i, first // t.element_size()
        return None

    def not_stored(self, out) -> int:
        """In the interpreter: how many elements of the tensors ``out`` holds, written (no longer the poison),
        that a kernel run was handed and no ``tl.store`` wrote: numpy, a heuristics function, or Python in a
        kernel's body writing memory itself (the interpreter runs it; a GPU would not compile it). 0 on a
        GPU, or where no input was concealed."""
        if getattr(self, "_remote_unstored", None) is not None:
            return self._remote_unstored
        if runtime.is_gpu():
            return 0
        import numpy as np

        stored = np.concatenate(self._stored) if self._stored else np.zeros(0, dtype=np.uint64)
        inputs, missing = self.concealed(), 0
        for t in [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.device.type != "meta"]:
            if _storage(t) in inputs or _storage(t) not in self._after_run or t.numel() == 0:
                continue
            index = torch.zeros((), dtype=torch.int64)
            for n, st in zip(t.shape, t.stride(), strict=True):
                index = index.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * st
            index = index.reshape(-1).numpy()  # each element's offset from t's first, in elements
            if index.min() < 0:  # a layout torch does not allocate: not judged here
                continue
            # the stores that landed on t's span, as offsets, marked on a map of the span
            size, base = t.element_size(), np.uint64(t.data_ptr())
            span = int(index.max()) + 1
            hit = stored[(stored >= base) & (stored < base + np.uint64(span * size))]
            marked = np.zeros(span, dtype=bool)
            marked[((hit - base) // np.uint64(size)).astype(np.int64)] = True
            # an element still holding the poison was written by nothing: the checkers name that mistake
            written = ~poisoned(t).numpy()
            missing += int((written & ~marked[index]).sum())
        return missing

    def written_after(self, out) -> bool:
        """Whether a tensor ``out`` holds was changed after the last kernel run that was handed it."""
        if getattr(self, "_remote_after", None) is not None:
            return self._remote_after
        inputs = self.concealed()  # an input returned is not a result written late (lessons name that mistake)
        with _bookkeeping():
            for t in [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.device.type != "meta"]:
                if _storage(t) in inputs:
                    continue
                snap = self._after_run.get(_storage(t))
                if snap is not None and not _equal(_storage_bytes(t), snap):
                    return True
        return False

    def __enter__(self):
        ACTIVE.append(self)
        self._threads = {t.ident for t in threading.enumerate()}
        self._run_hook = _triton.kernel_run_hook(self._run_begins, self._run_ends, self._launched)
        self._run_hook.__enter__()
        if not runtime.is_gpu():
            self._watch_rooms()
            # loads are watched only where an input has room behind it to read (with_room_after)
            self._mem_hook = _triton.memory_hook(self._on_access, reads=bool(self._rooms))
            self._mem_hook.__enter__()
            self._half_hook = _half_sums_hook(self._on_half_sum)
            self._half_state = self._half_hook.__enter__()
        try:
            from torch.profiler import ProfilerActivity, profile

            with _quiet_stderr(), one_profiler_cycle():
                self._prof = profile(activities=[ProfilerActivity.CPU])
                self._prof.__enter__()
        except Exception:  # a profiler already running (the learner's own): dispatch counting alone
            self._prof = None
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            ACTIVE.remove(self)
            if self._mem_hook is not None:
                self._mem_hook.__exit__(None, None, None)
                self._mem_hook = None
            if self._half_hook is not None:
                self._half_hook.__exit__(None, None, None)
                self._half_hook = self._half_state = None
            elif runtime.is_gpu():
                for compiled in self._builds:
                    for what in _half_sums_in_ir(compiled):
                        self._on_half_sum(what)
            self._run_hook.__exit__(None, None, None)
            self._show(real=True)
            if self._prof is not None:
                with _quiet_stderr(), one_profiler_cycle():
                    self._prof.__exit__(None, None, None)
                    events = self._prof.events()
                if not getattr(self, "remote", False):  # a remote answer's ops were profiled where it ran
                    self.hidden_ops += sorted(_unseen_compute(events, self.seen))
                self._prof = None

    def _guarded(self, out: torch.Tensor) -> torch.Tensor:
        # A dense layout (any order of strides) is the front of a longer buffer whose poisoned tail is
        # the guard: a store past the end lands there, where on a GPU it would corrupt what follows.
        n = out.numel()
        dense = n > 0 and out.untyped_storage().nbytes() == n * out.element_size()
        if not (self.guard and dense):
            self.allocations.append(out)
            return poison_(out)
        big = poison_(torch.empty(n + max(n, GUARD_MIN), dtype=out.dtype, device=out.device))
        view = big.as_strided(out.shape, out.stride(), 0)
        self.guards.append(big[n:])
        self.allocations.append(view)
        return view

    def writes_past_the_end(self) -> tuple[int, int] | None:
        """``(count, first)``: guard elements overwritten and how far past the end the first one is."""
        if getattr(self, "_remote_past", None) is not None:
            return self._remote_past
        for g in self.guards:
            hit = ~poisoned(g)
            if hit.any():
                return int(hit.sum()), int(hit.nonzero()[0][0])
        return None

    def remote_spec(self) -> dict:
        """The keyword arguments that build this sandbox again in the learner's process."""
        return {"guard": self.guard, "widen": self.widen}

    def take_report(self, report: dict) -> None:
        """Fill this sandbox from a :func:`report` made in another process (the grading command's learner
        process): the launches (their tensors already mapped to this process's), ops, passes,
        allocations (as meta tensors of their shapes) and the guards' verdict."""
        self.launches += report["launches"]
        self.torch_ops += report["torch_ops"]
        self.passes += report["passes"]
        self.hidden_ops += report["hidden_ops"]
        self.allocations += [torch.empty(s, dtype=d, device="meta") for s, d in report["allocations"]]
        self._remote_past = report["past"]
        self.refused += report.get("refused", [])
        self._remote_after = report.get("after")
        self.widened = report.get("widened", False)
        self._remote_unstored = report.get("unstored")
        self.half_sums += [w for w in report.get("half_sums", []) if w not in self.half_sums]
        for k, first in report.get("read_past", []):
            if k < len(self._concealed):
                self.read_past.setdefault(self._concealed[k][0], first)
        self.remote = True

    def report(self) -> dict:
        """What :meth:`take_report` takes (launch tensors left for the caller to map)."""
        return {
            "torch_ops": list(self.torch_ops),
            "passes": list(self.passes),
            "hidden_ops": list(self.hidden_ops),
            "allocations": [(tuple(a.shape), a.dtype) for a in self.allocations],
            "past": self.writes_past_the_end(),
            "refused": list(self.refused),
            "widened": self.widened,
            "half_sums": list(self.half_sums),
            # by position among the concealed inputs, which the grader conceals in the same order
            "read_past": [
                [k, self.read_past[t]] for k, (t, _, _) in enumerate(self._concealed) if t in self.read_past.keys()
            ],
        }


#: the profiler's label on the sandbox's own work (concealing, revealing, keeping what a run left)
_OWN = "fusionlab::sandbox"


@contextlib.contextmanager
def _bookkeeping():
    """The sandbox's own tensor work: out of the dispatch mode's sight and marked for the profiler, so
    neither counts it as the answer's."""
    with torch._C._DisableTorchDispatch(), torch.no_grad(), torch.profiler.record_function(_OWN):
        yield


def _decoy(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """What a concealed input holds outside its kernels' runs: random values of its shape and dtype
    (integers and booleans: its own values in a random order, so an index stays in range)."""
    if t.is_floating_point():
        return randn(t.shape, dtype=t.dtype, device=t.device, gen=gen)
    flat = t.detach().reshape(-1)
    return flat[torch.randperm(flat.numel(), generator=gen).to(t.device)].reshape(t.shape)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one dtype and shape hold the same bits (NaN payloads included), where they are."""
    return _equal(_raw(a), _raw(b))


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole storage under ``t``, as bytes (a view)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _foreign_pointer(a) -> bool:
    """An argument Triton would take as a pointer that is not a tensor: an object whose own ``data_ptr``
    code would run inside the kernel's run (Triton's own wrappers are tensors' stand-ins, allowed)."""
    return (
        hasattr(a, "data_ptr")
        and not isinstance(a, torch.Tensor)
        and not type(a).__module__.startswith(("triton.", "torch"))
    )


def _aten(event) -> str:
    return event.name.removeprefix("aten::") if event.name.startswith("aten::") else ""


#: ops the profiler records below dispatch that compute nothing: ``torch.tensor(data)`` ends in a ``detach_``
#: (dropping autograd history) that no dispatch mode meets
_NO_COMPUTE = frozenset({"detach_"})


def _unseen_compute(events, seen: set[str]) -> set[str]:
    """The outermost compute ops the profiler recorded that the dispatch mode never saw. A composite op
    (softmax) reaches a dispatch mode as what it decomposes into (_softmax): seen if a compute op under
    it was; the ops an op's own code calls (mean's sum and div_) never reach it: not counted."""

    def computes(name: str) -> bool:
        return bool(name) and name not in FREE and name not in PASSES and name not in _NO_COMPUTE

    def seen_below(e) -> bool:  # item() reaches it as _local_scalar_dense: below it, seen, no compute
        return any(
            (_aten(c) in seen and _aten(c) not in _ALLOC_OPS and _aten(c) not in PASSES) or seen_below(c)
            for c in e.cpu_children
        )

    def outermost(e) -> bool:  # an op another op runs inside its own code never meets a dispatch mode
        p = e.cpu_parent
        while p is not None:
            if _aten(p) or p.name == _OWN:
                return False
            p = p.cpu_parent
        return True

    return {
        _aten(e) for e in events if computes(_aten(e)) and _aten(e) not in seen and outermost(e) and not seen_below(e)
    }


def _quiet_stderr():
    # the profiler's start and stop print a line from C++ on some torch versions (not the learner's)
    try:
        return quiet_stderr()
    except Exception:  # pragma: no cover - no file descriptor 2
        return contextlib.nullcontext()


def with_room_after(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied to the front of a longer buffer: a load past its end (a missing load mask) cannot
    fault, and reads NaN, not zeros. Floats are padded with a NaN (:data:`_PAD_BITS`), so an unmasked
    load shows up as NaN in the result (zeros would pass for a sum, a matmul, an add: they add nothing);
    integers with zeros, a valid index wherever an unmasked load of them is used as one."""
    n = t.numel()
    big = torch.empty(n + max(n, GUARD_MIN), dtype=t.dtype, device=t.device)
    if t.dtype in _PAD_BITS:
        itype, bits = _PAD_BITS[t.dtype]
        big.view(itype).fill_(bits)
    else:
        big.zero_()
    big[:n] = t.reshape(-1)
    return big[:n].view(t.shape)


# -- answer keys and the package's own kernels ----------------------------------------------------
# the checkers' own answer keys are marked with fusionlab._exercise.answer_key (kernels use it too)
answer_key = _exercise.answer_key


def _learner_frame(tb) -> str:
    """The innermost frame of the learner's own code (a notebook cell or a file outside fusionlab)."""
    where = ""
    pkg = os.path.dirname(__file__)
    for frame in traceback.extract_tb(tb):
        fname = frame.filename
        if fname.startswith((pkg, sys.prefix, sys.base_prefix, sys.exec_prefix)) or "site-packages" in fname:
            continue
        cell = "your cell" if fname.startswith("<ipython") or "ipykernel" in fname else os.path.basename(fname)
        where = f"{cell}, line {frame.lineno}: {frame.line}" if frame.line else f"{cell}, line {frame.lineno}"
    return where


def stub_hint(e: BaseException) -> str | None:
    """The hint of an exercise stub still in place, however it surfaced: a plain NotImplementedError,
    one wrapped by Triton's interpreter, or a failed ``tl.static_assert`` in a kernel compiled for a GPU."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        found = re.search(r"Exercise:\s*(.*?)['\")]*\s*$", text, re.M)
        if found:  # the stub's own words, without the wrapper an interpreter or compiler put around them
            return found.group(1).strip()
        if isinstance(e, NotImplementedError):
            return text.strip() or "a blank to fill"
        e = e.__cause__ or e.__context__
    return None


def call_learner(fn: Callable, *args, name: str, where: str = "", seed: int | None = None):
    """Call the learner's ``fn(*args)``; any exception becomes a short CheckFailed."""
    _exercise.DEPTH[0] += 1
    try:
        return fn(*args)
    except CheckFailed:
        raise
    except _exercise.AnswerKeyCalled as e:
        raise fail(f"{where or name}: {e}", seed) from None
    except Exception as e:
        stub = stub_hint(e)
        if stub is not None:
            raise CheckFailed(f"{name}: not done yet — {stub}") from None
        line = getattr(e, "learner_line", None) or _learner_frame(e.__traceback__)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        msg = f"{where or name}: your code raised {type(e).__name__}: {first}"
        if line:
            msg += f"\n  at {line}"
        raise fail(msg, seed) from None
    finally:
        _exercise.DEPTH[0] -= 1


# -- comparing ----------------------------------------------------------------------------------------
def assert_close(
    actual,
    expected,
    *,
    what: str = "output",
    hint: str = "",
    seed: int | None = None,
    unwritten: torch.Tensor | None = None,
) -> None:
    """Like ``torch.testing.assert_close`` but says how many elements are off, and where.

    ``unwritten``: a flat mask of elements still holding the poison (from :func:`poisoned`)."""
    if not isinstance(actual, torch.Tensor):
        raise fail(f"{what}: expected a torch.Tensor, got {type(actual).__name__}. Did you forget to return it?", seed)
    if actual.shape != expected.shape:
        raise fail(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}.", seed)
    if actual.dtype != expected.dtype:
        raise fail(
            f"{what}: dtype {dtype_name(actual.dtype)}, expected {dtype_name(expected.dtype)} "
            "(store in the input's dtype).",
            seed,
        )
    if actual.device.type != expected.device.type:
        raise fail(f"{what}: on {actual.device}, expected {expected.device}.", seed)
    if unwritten is None:
        unwritten = poisoned(actual)
    if unwritten.any():
        idx = unwritten.nonzero().flatten()
        raise fail(
            f"{what}: {idx.numel()} of {actual.numel()} elements were never written (still the poison), "
            f"first at flat index {idx[0].item()}. Look at the grid (enough programs to cover every "
            f"element?) and at the offsets/mask of the last block.",
            seed,
        )
    atol, rtol = tolerance(expected.dtype)
    a = actual.detach().double().cpu().flatten()
    e = expected.detach().double().cpu().flatten()
    bad = ~_isclose(a, e, atol=atol, rtol=rtol, equal_nan=True)
    if bad.any():
        idx = bad.nonzero().flatten()
        i = idx[0].item()
        raise fail(
            f"{what}: {idx.numel()} of {a.numel()} elements differ beyond atol={atol:g}, rtol={rtol:g} "
            f"for {dtype_name(expected.dtype)}; first at flat index {i}: got {a[i].item():.6g}, "
            f"expected {e[i].item():.6g}. {hint}".rstrip(),
            seed,
        )


def nearer_to(actual: torch.Tensor, want: torch.Tensor, alt: torch.Tensor, share: float = 0.75) -> bool:
    """Whether ``actual`` is systematically the rounding of ``alt`` rather than of ``want`` (both float64):
    on the elements where the two round to different values in ``actual``'s dtype, ``actual`` sits
    nearer ``alt`` at least ``share`` of the time. A different function can hide inside a 16-bit
    tolerance (the tanh GELU for the exact one); it cannot hide from this, given enough such elements."""
    a = actual.detach().double().cpu().flatten()
    w, x = want.double().cpu().flatten(), alt.double().cpu().flatten()
    differ = w.to(actual.dtype) != x.to(actual.dtype)
    if int(differ.sum()) < 16:
        return False
    nearer = (a[differ] - x[differ]).abs() < (a[differ] - w[differ]).abs()
    return float(nearer.double().mean()) >= share


def _snapshot(inputs) -> list:
    return [_bits(t).clone() if isinstance(t, torch.Tensor) else None for t in inputs]


def _changed_input(inputs, before) -> int | None:
    for i, (t, b) in enumerate(zip(inputs, before, strict=True)):
        if b is not None and not _equal(_bits(t), b):
            return i
    return None


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


# -- the kernel check ------------------------------------------------------------------------------
def check_function(
    student: Callable,
    reference: Callable,
    make_inputs: Callable[[object, torch.dtype, torch.Generator], tuple],
    *,
    name: str,
    sizes: Sequence = ODD_SIZES,
    many: object | None = MANY_PROGRAMS,
    dtypes: Sequence[torch.dtype] | None = None,
    launches: int | None = 1,
    allow_torch_ops: bool = False,
    hint: str = "",
    quiet: bool = False,
    draw: bool = True,
) -> Passed:
    """Run ``student(*inputs)`` against ``reference(*inputs)`` on fresh inputs of every size and dtype.

    ``sizes``: what ``make_inputs(size, dtype, gen)`` takes (lengths or shapes); ``many``: one more
    size, large enough to need many programs (checked in the first dtype); the last of ``sizes`` is
    tried a second time with fresh values. With ``draw``, the sizes are not all fixed: lengths get one
    drawn afresh at a block boundary for each dtype, in place of the second to last (:func:`drawn_sizes`),
    and under the grading command shapes get one drawn more (:func:`drawn_shape`). ``launches``: the
    Triton launches the answer must make (1 for a fused answer; None: not counted).
    ``allow_torch_ops=False``: no torch compute and no torch passes over tensor data.
    """
    dtypes = list(dtypes) if dtypes is not None else [torch.float32, runtime.HALF]
    seed = new_seed()
    with seeded(seed):
        plan = [(d, s) for d in dtypes for s in _with_drawn(sizes, draw)]
        if many is not None:
            plan.append((dtypes[0], many))
        plan.append((dtypes[-1], sizes[-1]))  # the same size again, fresh values: no caching by shape
        for dtype, size in plan:
            _check_once(student, reference, make_inputs, name, size, dtype, launches, allow_torch_ops, hint, seed)
    desc = (
        f"{len(sizes)} awkward sizes × {len(dtypes)} dtypes + one needing many programs + one repeated, "
        "fresh random inputs, poisoned outputs, inputs unchanged"
        + (f", {launches} launch each" if launches is not None else "")
    )
    msg = f"✓ {name}: {len(plan)} checks passed ({desc})"
    return passed(msg, len(plan)) if not quiet else Passed(msg, len(plan))


def refuse_own_kernels(box: Sandbox, where: str, seed: int, advice: str = "Write it yourself.") -> None:
    """Fail when the answer launched one of the package's own kernels (a ``fusionlab.*`` module's):
    writing that kernel is the exercise."""
    own = sorted({la.name for la in box.launches if la.module.startswith("fusionlab.")})
    if own:
        raise fail(f"{where}: your answer launches fusionlab's own kernel ({', '.join(own)}). {advice}", seed)


def _size_text(size) -> str:
    return f"shape {tuple(size)}" if isinstance(size, (tuple, list)) else f"size {size}"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 kernel``, ``2 kernels`` (``many``: the plural when it is not ``word + "s"``)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


#: the advice for a store past the end, unless a lesson has words of its own
_STORE_HINT = (
    "Mask every store: offs < n for a 1-D block, (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols) for "
    "a 2-D tile."
)


def run_answer(
    fn: Callable,
    args: Sequence,
    *,
    name: str,
    where: str,
    seed: int,
    kwargs: dict | None = None,
    box: Sandbox | None = None,
    allow_torch_ops: bool = False,
    store_hint: str = _STORE_HINT,
    torch_hint: str = "",
    torch_message: Callable[[str], str] | None = None,
    before_torch: Callable[[Sandbox, object], None] | None = None,
    conceal: bool | Sequence[int] | None = None,
    half_sums_ok: bool = False,
):
    """The sequence every kernel check runs, in one place: call ``fn(*args, **kwargs)`` in a
    :class:`Sandbox` (``box``: a subclass), then refuse, each with its own message, an answer that

    1. changed one of its inputs (compared bit for bit);
    2. wrote past the end of a tensor it allocated (a guard zone overwritten, on a GPU as on a CPU);
    3. launched one of the package's own kernels;
    4. computed or moved tensor data with torch (unless ``allow_torch_ops``): ops seen outside
       launches, inside them (a heuristics function, a pre-run hook), and with dispatch switched off;
    5. summed in a 16-bit float type (unless ``half_sums_ok``): the fp32 upcast every lesson asks for,
       seen by type (:attr:`Sandbox.half_sums`), since the interpreter's numbers cannot show it;
    6. computed with anything else (numpy, a library, torch on a copy) and copied in: its inputs are
       concealed (:meth:`Sandbox.conceal`) outside its kernels' runs, and the tensors it returns must be
       as its last kernel run left them.

    ``conceal``: which inputs (positions in ``args``; True: every tensor of ``args`` and ``kwargs``);
    by default all of them unless ``allow_torch_ops`` (torch in the answer may then read some inputs,
    which the checker names).

    ``before_torch(box, output)``: a lesson's own check, run before the torch check (a more pointed message for
    some ops); ``torch_message(ops)``: a lesson's own words for torch doing the work.
    Returns ``(output, box)``; the reference is the caller's to compute *after* this returns,
    so nothing the answer runs can find it on the stack."""
    kwargs = kwargs or {}
    before = _snapshot(args)
    box = box if box is not None else Sandbox()
    if conceal is None:
        conceal = not allow_torch_ops
    if conceal is True:
        box.conceal([t for t in tree_leaves((list(args), kwargs)) if isinstance(t, torch.Tensor)])
    elif conceal:
        box.conceal([args[i] for i in conceal])
    try:
        with box:
            out = call_learner(lambda: fn(*args, **kwargs), name=name, where=where, seed=seed)
    except CheckFailed:
        _refuse_hooks(box, where, seed)  # the cause, where the answer failed for want of its inputs
        raise
    changed = _changed_input(args, before)
    if changed is not None:
        raise fail(
            f"{where}: your code changed input {changed} (argument {changed + 1}). A kernel reads its "
            "inputs and writes only its own outputs: check which pointer each tl.store writes to.",
            seed,
        )
    past = box.writes_past_the_end()
    if past is not None:
        count, first = past
        start = "right after the end" if first == 0 else f"{first} elements after the end"
        raise fail(
            f"{where}: the kernel wrote {plural(count, 'element')} past the end of a tensor it allocated (the "
            f"first {start}). {store_hint}",
            seed,
        )
    read = box.reads_past_the_end(args)
    if read is not None:
        index, first = read
        start = "right after its end" if first == 0 else f"{first} elements after its end"
        raise fail(
            f"{where}: your kernel loads past the end of input {index} (argument {index + 1}; the first such load "
            f"{start}). Those lanes hold no input (here NaN; on a GPU another tensor's memory, or a fault), even if "
            "a masked store throws them away: mask every load as you mask the store, tl.load(ptr + offs, "
            "mask=offs < n).",
            seed,
        )
    refuse_own_kernels(box, where, seed, "Write the kernel yourself: that is the exercise.")
    _refuse_hooks(box, where, seed)
    if before_torch is not None:
        before_torch(box, out)
    if box.hidden_ops:
        raise fail(
            f"{where}: torch computes with dispatch switched off ({', '.join(box.hidden_ops)}). Computing "
            "outside the kernel and copying the result in is not fused: do the work in your kernel.",
            seed,
        )
    if not allow_torch_ops and (box.torch_ops or box.passes):
        ops = ", ".join(sorted(set(box.torch_ops))) or ""
        moves = ", ".join(sorted(set(box.passes))) or ""
        if torch_message is not None:
            raise fail(f"{where}: {torch_message(', '.join(sorted(set(box.torch_ops) | set(box.passes))))}", seed)
        if ops:
            msg = (
                f"{where}: the answer computes with torch ({ops}). The result may be right, but the "
                "exercise asks for the work to happen inside your Triton kernel."
            )
        else:
            msg = (
                f"{where}: the answer moves tensor data with torch ({moves}): each copy or cast is a "
                "pass through memory of its own. Load in the input's dtype and cast inside the kernel "
                "(x.to(tl.float32)); allocate the output with torch.empty_like, in the output's dtype."
            )
        raise fail(f"{msg} {torch_hint}".rstrip(), seed)
    if box.half_sums and not half_sums_ok:
        raise fail(
            f"{where}: your kernel sums in 16 bits ({'; '.join(box.half_sums)}). The numbers may pass on these "
            "inputs, but each add rounds to the 16-bit type (float16 keeps 11 bits, bfloat16 8): a long row, or "
            "values that cancel, loses what fp32 keeps. Upcast before you sum (x.to(tl.float32)), accumulate in "
            "fp32 (tl.zeros(..., dtype=tl.float32)), and cast once, at the store.",
            seed,
        )
    # a write after the kernel that torch made in sight is the lesson's to judge (above, or its own checks)
    if not (box.torch_ops or box.passes) and box.written_after(out):
        raise fail(
            f"{where}: the tensor you return changed after your kernel finished with it: the result was written "
            "outside the kernel (numpy, a library, torch with dispatch switched off?). The kernel must compute "
            "the result and store it.",
            seed,
        )
    unstored = box.not_stored(out) if not (box.torch_ops or box.passes) else 0
    if unstored:
        raise fail(
            f"{where}: {plural(unstored, 'element')} of the tensor you return were written by no tl.store of your "
            "kernel: other code wrote them (numpy, Python in a heuristics function or in the kernel's body, which the "
            "interpreter runs and a GPU would not compile). The kernel must compute the result and tl.store it.",
            seed,
        )
    return out, box


def check_taller_tiles(
    fn: Callable,
    inputs: Sequence,
    reference: Callable,
    *,
    name: str,
    seed: int,
    key: str = "BLOCK_M",
    wider: int = 2,
    mask_hint: str = "(offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols)",
) -> bool:
    """An answer whose kernel runs with ``key = 1`` (one row a program, as lesson 2's GPU solution) has no
    partial row tile, so a missing or off-by-one row mask writes nothing out of place. Run it once more
    with ``key = wider`` on the grid it launches for one row (programs for ``wider`` times the tensor's
    rows): a masked kernel writes the same values (rows written twice), one whose row mask is missing or
    lets row ``n_rows`` through writes past the end, into the guard zone. ``wider`` stays small, so that
    what an unmasked kernel reaches (``wider`` times the tensor) stays inside the guard zone and the
    inputs' room behind them (:data:`GUARD_MIN` elements at least); an odd row count leaves the last tile
    partial. Returns whether the kernel ran with ``key = 1`` (and so was tried)."""
    where = f"{name}, shape {tuple(inputs[0].shape)}, your kernel with {key} = {wider} (you launch it with {key} = 1)"
    hint = (
        f"With {key} = 1 no tile hangs past the last row, so the mistake hides; with any taller tile it writes "
        f"rows that do not exist. Mask the rows as well as the columns, < n_rows (not <=): {mask_hint}."
    )
    box = Sandbox(widen={key: (1, wider)})
    out, box = run_answer(fn, inputs, name=name, where=where, seed=seed, box=box, store_hint=hint)
    if not box.widened:
        return False
    expected = reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
    assert_close(out, expected, what=where, hint=hint, seed=seed)
    return True


def _refuse_hooks(box: Sandbox, where: str, seed: int) -> None:
    if box.refused:
        raise fail(
            f"{where}: your kernel runs code of yours inside its launch ({'; '.join(box.refused)}). The checks "
            "give a kernel its inputs only while the kernel itself runs: launch a plain @triton.jit kernel (autotune "
            "and heuristics are fine) and pass it torch tensors.",
            seed,
        )


def _tensors_of(out) -> list[torch.Tensor]:
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def require_launches(box: Sandbox, out, inputs: Sequence, where: str, seed: int, *, launches: int = 1, why: str = ""):
    """Refuse an answer that did not make exactly ``launches`` Triton launches, or whose kernels were not
    handed every input and every tensor it returns (computed elsewhere and copied in is not fused).
    ``why``: the lesson's words on why the work belongs in one kernel."""
    got = len(box.launches)
    if got != launches:
        what = ", ".join(box.names) or "none"
        want = plural(launches, "Triton kernel launch", "Triton kernel launches")
        msg = f"{where}: expected {want}, saw {got} ({what})."
        own = {_storage(a) for a in box.allocations if a.device.type != "meta"}
        if got == 0 and _tensors_of(out):
            if not any(_storage(t) in own for t in _tensors_of(out) if t.device.type != "meta"):
                msg = (
                    f"{where}: your function returned without launching a kernel in this call, a tensor it did "
                    "not allocate in this call: a result kept from an earlier call? Each call must compute "
                    "on the inputs it is given (the checker tries the same shape twice, with fresh values)."
                )
        elif got > launches:
            msg += f" {why or 'Each launch is a round trip through HBM: fuse them into one kernel.'}"
        raise fail(msg, seed)
    if launches:
        given = {_storage(t) for la in box.launches for t in la.tensors}
        missing = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and _storage(t) not in given]
        unlaunched = [t for t in _tensors_of(out) if _storage(t) not in given]
        if missing or unlaunched:
            what = f"input {missing[0]}" if missing else "the tensor you return"
            raise fail(
                f"{where}: {what} is not passed to your kernel. The kernel itself must read the "
                "inputs and write the output (computing elsewhere and copying is not fused).",
                seed,
            )


#: set by the grading command (fusionlab.grade): checkers add cases drawn afresh that the notebook's
#: stored messages do not count (a notebook's ✓ line stays the same from run to run)
GRADING = [False]


def _with_drawn(sizes: Sequence, draw: bool) -> list:
    sizes = list(sizes)
    if not draw:
        return sizes
    if all(isinstance(s, int) for s in sizes) and len(sizes) >= 3:
        sizes[-2] = drawn_sizes(1)[0] if _CURRENT[-1].random() < 0.5 else drawn_sizes(2)[1]
    elif GRADING[0] and all(isinstance(s, tuple) and len(s) == 2 for s in sizes):
        sizes.append(drawn_shape())
    return sizes


def drawn_sizes(count: int = 2, lo: int = 4, hi: int = 12) -> list[int]:
    """Lengths drawn at random on every call (from the running check's seed) at a block boundary: a power
    of two 2**k (k from ``lo`` to ``hi``), the block itself, then one either side of another. An answer
    cannot special-case them, and a mask off by one at n equal to the block shows."""
    rng = _CURRENT[-1] if _CURRENT else random.Random(new_seed())
    out = [2 ** rng.randint(lo, hi)]
    while len(out) < count:
        out.append(2 ** rng.randint(lo, hi) + rng.choice((-1, 1)))
    return out


def drawn_length(lo: int = 4, hi: int = 11) -> int:
    """A length drawn on every call at a block boundary: 2**k (k from ``lo`` to ``hi``) or one either side."""
    rng = _CURRENT[-1] if _CURRENT else random.Random(new_seed())
    return 2 ** rng.randint(lo, hi) + rng.choice((-1, 0, 0, 1))


def drawn_shape(rows_max: int = 70, lo: int = 4, hi: int = 11) -> tuple[int, int]:
    """A ``(rows, cols)`` drawn on every call: ``cols`` a :func:`drawn_length`, ``rows`` from 1 to
    ``rows_max``."""
    rng = _CURRENT[-1] if _CURRENT else random.Random(new_seed())
    return rng.randint(1, rows_max), drawn_length(lo, hi)


def _check_once(student, reference, make_inputs, name, size, dtype, launches, allow_torch_ops, hint, seed):
    gen = fresh_generator()
    inputs = make_inputs(size, dtype, gen)
    where = f"{name}, {_size_text(size)}, {dtype_name(dtype)}"
    actual, box = run_answer(student, inputs, name=name, where=where, seed=seed, allow_torch_ops=allow_torch_ops)
    if launches is not None:
        require_launches(box, actual, inputs, where, seed, launches=launches)
    # the reference only now: nothing the answer ran could read it off this frame
    expected = reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
    unwritten = poisoned(actual) if isinstance(actual, torch.Tensor) else None
    try:
        assert_close(actual, expected, what=where, hint=hint, seed=seed, unwritten=unwritten)
    except CheckFailed:
        outside = computed_outside(box, actual, reference, inputs, where, seed)
        if outside is not None:
            raise outside from None
        raise


def computed_outside(
    box: Sandbox, actual, reference: Callable, inputs: Sequence, where: str, seed: int
) -> CheckFailed | None:
    """The failure to raise, naming it, when a wrong ``actual`` is ``reference`` of the decoys ``inputs`` held
    outside the answer's kernels (:meth:`Sandbox.computed_from_decoys`): a result computed outside the kernel
    and copied in. None otherwise. Every checker asks this before it reports values that differ."""
    if not box.computed_from_decoys(actual, reference, inputs):
        return None
    return fail(
        f"{where}: your result is the answer for the values the inputs held outside your kernel, values "
        "your kernel never read: it was computed outside the kernel (numpy, a library, torch out of "
        "sight) and copied in. The kernel must compute it from the inputs it is handed.",
        seed,
    )


def check_function_pair(
    student: Callable,
    reference: Callable,
    make_inputs: Callable[[object, torch.dtype, torch.Generator], tuple],
    *,
    name: str,
    parts: tuple[str, str],
    hints: tuple[str, str],
    **kwargs,
) -> int:
    """:func:`check_function` for an answer that returns a pair of tensors from one kernel (a backward's two
    gradients): each of ``parts`` in turn, against the same element of ``reference``'s pair, every check of
    the one (fresh inputs, poison, inputs unchanged, the launch count, the launch handed the output) for each.
    Returns the number of checks run."""
    checks = 0
    for index, part in enumerate(parts):

        def one(*args, index=index):
            out = student(*args)
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise CheckFailed(f"{name}: return ({', '.join(parts)}), a pair of tensors; got {type(out).__name__}.")
            return out[index]

        checks += check_function(
            one,
            lambda *args, index=index: reference(*args)[index],
            make_inputs,
            name=f"{name} ({part})",
            hint=hints[index],
            quiet=True,
            **kwargs,
        ).checks
    return checks


# -- numbers and ledgers -----------------------------------------------------------------------------
def number(got, call: str, unit: str = "") -> float:
    """``got`` as a finite float (any real number: a numpy scalar is one), or a CheckFailed that says what
    came back."""
    if isinstance(got, torch.Tensor) and got.numel() == 1 and not got.is_complex():
        raise CheckFailed(f"{call} returned a tensor ({got!r}); return a Python number: .item() gives it.")
    if isinstance(got, bool) or not isinstance(got, numbers.Real) or not math.isfinite(got):
        raise CheckFailed(f"{call} returned {got!r}; expected a finite number{' of ' + unit if unit else ''}.")
    return float(got)


def memory_answer_tip(got: float, want_gib: float, tensor_gib: float, tips: dict, dtype_bytes: int) -> str:
    """The hint for a peak-memory answer in GiB that is not ``want_gib``: the tip of ``tips`` (a count
    of tensors of ``tensor_gib`` each -> what that count misses) that ``got`` matches within 1%, or else
    the unit slip it matches (GB for GiB, bytes, elements instead of bytes); "" if none."""
    near = lambda a, b: abs(a - b) <= 0.01 * abs(b)  # noqa: E731
    for count, text in tips.items():
        if near(got, count * tensor_gib):
            return " " + text
    if near(got, want_gib * 2**30 / 1e9):
        return " That is in GB (1e9 bytes); the question asks for GiB (2**30 bytes)."
    if near(got, want_gib * 2**30):
        return " That is in bytes; divide by 2**30 for GiB."
    if near(got, want_gib / dtype_bytes):
        return " That counts elements; multiply by the bytes per element."
    return ""


def compare_ledgers(got, want: Ledger, where: str) -> None:
    """Compare two ledgers trip by trip (unfused, then fused); name the first trip that differs."""
    if not isinstance(got, Ledger):
        raise CheckFailed(f"{where}: expected a fusionlab.ledger.Ledger, got {type(got).__name__}.")
    if got.dtype_bytes != want.dtype_bytes:
        raise CheckFailed(
            f"{where}: the ledger counts {got.dtype_bytes} bytes per element, expected "
            f"{want.dtype_bytes}. Pass dtype_bytes=dtype."
        )
    if _renamed(got, want):  # the same trips under other names: the counts are what the exercise asks
        return
    unfused_differ = sorted((t.direction, t.elements) for t in got.trips(False)) != sorted(
        (t.direction, t.elements) for t in want.trips(False)
    )
    if len(got.ops) != len(want.ops) and unfused_differ:
        raise CheckFailed(
            f"{where}: your ledger has {plural(len(got.ops), 'op')}; eager runs {plural(len(want.ops), 'kernel')} "
            "here. One .op(...) per kernel, each with what that kernel reads and writes."
        )
    for fused in (False, True):
        kind = "fused" if fused else "unfused"
        g = [(t.op, t.tensor, t.direction, t.elements) for t in got.trips(fused)]
        w = [(t.op, t.tensor, t.direction, t.elements) for t in want.trips(fused)]
        if sorted(g) == sorted(w):
            continue
        if fused and sorted(got.ops, key=repr) == sorted(want.ops, key=repr):
            raise CheckFailed(
                f"{where}: the ops are right but not in the order they run: an op that reads what another writes "
                "comes after it (the fused kernel reads only what no earlier op wrote)."
            )
        missing = [t for t in w if t not in g]
        extra = [t for t in g if t not in w]
        if missing:
            op, tensor, d, n = missing[0]
            tip = ""
            if extra and extra[0][:3] == (op, tensor, d) and extra[0][3] == n * want.dtype_bytes:
                tip = " Count elements, not bytes: the ledger multiplies by the bytes per element itself."
            raise CheckFailed(
                f"{where}: {kind}, the trip '{op} {d}s {tensor}' ({n:,} elements) is missing"
                + (f"; you have '{extra[0][0]} {extra[0][2]}s {extra[0][1]}' ({extra[0][3]:,})" if extra else "")
                + "."
                + tip
            )
        op, tensor, d, n = extra[0]
        raise CheckFailed(
            f"{where}: {kind}, your ledger has a trip '{op} {d}s {tensor}' ({n:,} elements) "
            f"that does not happen (total {human_bytes(got.bytes(fused))}, expected "
            f"{human_bytes(want.bytes(fused))})."
        )


def _renamed(got: Ledger, want: Ledger) -> bool:
    """Whether ``got`` is ``want`` with its ops and tensors named otherwise, consistently: op for op in order,
    the same counts through a one-to-one renaming of tensors (ledgers of plain ops, a handful of tensors)."""
    plain = lambda led: not (led.schedule or led.rereads or led.sizes)  # noqa: E731
    if not (plain(got) and plain(want)) or len(got.ops) != len(want.ops):
        return False
    names = lambda led: list(dict.fromkeys(t for op in led.ops for t in (*op.reads, *op.writes)))  # noqa: E731
    g, w = names(got), names(want)
    if len(g) != len(w) or len(g) > 7:
        return False
    for perm in itertools.permutations(w):
        to = dict(zip(g, perm, strict=True))
        same_ops = all(
            {to[k]: v for k, v in a.reads.items()} == b.reads and {to[k]: v for k, v in a.writes.items()} == b.writes
            for a, b in zip(got.ops, want.ops, strict=True)
        )
        outs = lambda led, m=None: None if led.outputs is None else sorted((m or {}).get(t, t) for t in led.outputs)  # noqa: E731
        if same_ops and outs(got, to) == outs(want):
            return True
    return False


# -- notebooks: one short message instead of a traceback -----------------------------------------------
def _short_handler(shell, etype, evalue, tb, tb_offset=None):
    if issubclass(etype, CheckFailed):
        text = str(evalue)
    elif issubclass(etype, NotImplementedError):
        text = f"not done yet — {stub_hint(evalue) or evalue}"
    elif issubclass(etype, NameError):
        name = str(evalue).split("'")[1] if "'" in str(evalue) else str(evalue)
        text = (
            f"`{name}` is not defined yet: it is made by an earlier cell. Run the cells above in order "
            "(and fill in the exercise blank that defines it)."
        )
    else:  # pragma: no cover - only the types registered below reach here
        return shell.showtraceback((etype, evalue, tb), tb_offset=tb_offset)
    lines = text.splitlines() or [""]
    print("✗ " + "\n  ".join(line for line in lines[:5]), file=sys.stderr)
    return None


def install_notebook_messages(exercise: bool = False) -> bool:
    """In IPython, show a failed check (and, in exercise notebooks, an unfilled blank or a name an
    earlier blank should have defined) as one short message instead of a traceback. Returns whether
    it was installed."""
    try:
        from IPython import get_ipython  # optional: only notebooks have it
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    types = (CheckFailed, NotImplementedError, NameError) if exercise else (CheckFailed,)
    shell.set_custom_exc(types, _short_handler)
    return True
