"""Held-out wrong answers for lessons 1-7, written apart from the checkers: every cheat refused, every honest
mistake named, the right answers (other ways of writing them) accepted.

The cheats do the work outside the learner's kernel and hand the kernel the inputs, so that the launch
count and "the kernel was handed every input and the output" both hold:

- torch run in another thread (where no dispatch mode of the checker's thread sees it), then one copy
  kernel: a stand-in for numpy or any library, since the checker cannot tell them apart and need not:
  what it returns is computed from the values the inputs held outside the kernel's run (decoys);
- the kernel copies the inputs into a scratch buffer while it runs, and numpy writes the result into
  the output after it: the output changed after the kernel finished;
- numpy in a ``@triton.heuristics`` function or an autotuner's pre-hook (before the kernel runs: decoys);
- a pre-run hook, or a pointer argument that is not a tensor (code of the answer's inside the kernel's
  run): refused their inputs;
- the answer looking for the expected values on the checker's stack (it is computed after the answer).

The grading command (tests/test_grade_command.py) runs the same sandbox in the learner's process, so a
cheat refused here is refused there; what only the grading command can refuse (the comparison patched,
Triton's run path patched) is tested there.

The checkers' inputs are small in the interpreter; on a GPU the same tests run with the GPU's block sizes
(`runtime.pick`).
"""

from __future__ import annotations  # noqa: I001  (fusionlab before triton: see test_checkers_lesson2.py)

import sys
import threading
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusionlab import grading, runtime
import triton
import triton.language as tl

from fusionlab.grading import CheckFailed
from fusionlab.ledger import Ledger
from fusionlab.lessons.l1 import checkers as l1
from fusionlab.lessons.l2 import checkers as l2
from fusionlab.lessons.l3 import checkers as l3
from fusionlab.lessons.l4 import checkers as l4
from fusionlab.lessons.l4b import checkers as l4b
from fusionlab.lessons.l5 import checkers as l5
from fusionlab.lessons.l6 import checkers as l6
from fusionlab.lessons.l7 import checkers as l7

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
]

BLOCK = runtime.pick(gpu=1024, interpreter=4096)
#: what a cheat's result is refused with: computed from the decoys, or different from the answer
OUTSIDE = r"computed outside the kernel|differ|inf or NaN|dispatch switched off|written by no tl.store"
#: what every checker says of a result computed from the decoys and copied in (or of the torch that computed
#: it, where the profiler records another thread's ops)
NAMED_OUTSIDE = r"values your kernel never read: it was computed outside the kernel|dispatch switched off"


# -- the cheats' one kernel: copies a result in, handed every input too ------------------------------------
@triton.jit
def _copy_in_kernel(src_ptr, dst_ptr, n, src2_ptr, dst2_ptr, n2, a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)
    tl.store(dst2_ptr + offs, tl.load(src2_ptr + offs, mask=offs < n2), mask=offs < n2)


def _copy_in(results, inputs):
    """One launch copying ``results`` (one or two tensors) into fresh outputs, handed ``inputs`` as well."""
    results = [r.contiguous() for r in results]
    outs = [torch.empty_like(r) for r in results]
    pairs = list(zip(results, outs, strict=True)) + [(results[0], outs[0])] * (2 - len(results))
    (s1, d1), (s2, d2) = pairs[:2]
    extra = (list(inputs) + [s1] * 3)[:3]
    n = max(s1.numel(), s2.numel())
    _copy_in_kernel[(triton.cdiv(n, BLOCK),)](s1, d1, s1.numel(), s2, d2, s2.numel(), *extra, BLOCK=BLOCK)
    return outs[0] if len(outs) == 1 else tuple(outs)


def in_a_thread(torch_fn):
    """The cheat: ``torch_fn`` run in another thread (no dispatch mode of the checker's sees it), then
    copied in by one kernel handed every input."""

    def answer(*args):
        res = []
        worker = threading.Thread(target=lambda: res.append(torch_fn(*args)))
        worker.start()
        worker.join()
        out = res[0]
        return _copy_in(list(out) if isinstance(out, tuple) else [out], [a for a in args if torch.is_tensor(a)])

    return answer


def _gelu(x, b):
    return F.gelu(x.float() + b.float()).to(x.dtype)


def _flash(q, k, v, causal=False):
    s = (q.float() @ k.float().transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype), torch.logsumexp(s, -1)


def _window(q, k, v, window):
    # NaN-proof (the skip probes' NaN keys zeroed), so only the decoys can tell it from a kernel
    n = q.shape[-2]
    s = (q.float() @ k.float().nan_to_num().transpose(-1, -2)) / q.shape[-1] ** 0.5
    i, j = torch.arange(n, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :]
    s = s.masked_fill(~((j <= i) & (j > i - window)), float("-inf"))
    return (torch.softmax(s, -1) @ v.float().nan_to_num()).to(q.dtype), torch.logsumexp(s, -1)


def _add_rmsnorm(x, r, w, eps):
    h = x.float() + r.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype), h.to(x.dtype)


def _cross_entropy(logits, target):
    lf = logits.float().detach().requires_grad_()
    loss = F.cross_entropy(lf, target)
    (grad,) = torch.autograd.grad(loss, lf)
    return loss.detach(), grad.to(logits.dtype)


CHEATS = [
    pytest.param(l1.check_exp_cos, lambda x: torch.exp(torch.cos(x.float())).to(x.dtype), id="l1-exp_cos"),
    pytest.param(l2.check_bias_gelu, _gelu, id="l2-bias_gelu"),
    pytest.param(l2.check_chain, lambda x, k: l2.chain_reference.__wrapped__(x, k), id="l2-chain"),
    pytest.param(l4.check_add_rmsnorm, _add_rmsnorm, id="l4-add_rmsnorm"),
    pytest.param(l4.check_softmax, lambda x: torch.softmax(x.float(), -1).to(x.dtype), id="l4-softmax"),
    pytest.param(l5.check_cross_entropy, _cross_entropy, id="l5-cross_entropy"),
    pytest.param(l5.check_swiglu, lambda g, u: (F.silu(g.float()) * u.float()).to(g.dtype), id="l5-swiglu"),
    pytest.param(
        l6.check_linear_gelu, lambda x, w, b: F.gelu(x.float() @ w.float().T + b.float()).to(x.dtype), id="l6-linear"
    ),
    pytest.param(
        l6.check_rmsnorm_matmul,
        lambda x, w, eps: (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) @ w.float().T).to(
            x.dtype
        ),
        id="l6-rmsnorm_matmul",
    ),
    pytest.param(l5.check_geglu, l5.geglu_reference, id="l5-geglu"),
    pytest.param(l5.check_geglu_backward, l5.geglu_bwd_reference, id="l5-geglu_backward"),
    pytest.param(l6.check_silu_gate, l6.silu_gate_reference.__wrapped__, id="l6-silu_gate"),
    pytest.param(l7.check_flash_forward, _flash, id="l7-flash"),
    pytest.param(l7.check_flash_forward_causal, lambda q, k, v: _flash(q, k, v, causal=True), id="l7-flash_causal"),
    pytest.param(l7.check_sliding_window, _window, id="l7-sliding_window"),
]


@pytest.mark.parametrize("check, torch_fn", CHEATS)
def test_torch_out_of_sight_then_a_copy_kernel_is_refused_and_named(check, torch_fn):
    # every checker names it, whatever it compares first (softmax's rows, attention's O and lse, a matmul's
    # sums whose rounding is that of their terms)
    with pytest.raises(CheckFailed, match=NAMED_OUTSIDE):
        check(in_a_thread(torch_fn))


def test_a_result_copied_in_is_named_as_computed_outside_the_kernel():
    # (where the profiler records the other thread's ops, it is refused as torch with dispatch switched off)
    with pytest.raises(CheckFailed, match="values your kernel never read: it was computed outside|dispatch switched"):
        l1.check_exp_cos(in_a_thread(lambda x: torch.exp(torch.cos(x.float())).to(x.dtype)))


# -- lesson 1's exp_cos: the right answer and cheats of every kind ------------------------------------------
@triton.jit
def _exp_cos_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, tl.exp(tl.cos(x)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _exp_of(x):  # a helper: the work may live in any @triton.jit function
    return tl.exp(x)


@triton.heuristics({"BLOCK": lambda args: min(triton.next_power_of_2(args["n"]), BLOCK)})
@triton.jit
def _exp_cos_helper_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, _exp_of(tl.cos(x)).to(y_ptr.dtype.element_ty), mask=mask)


def exp_cos(x):
    y = torch.empty_like(x)
    _exp_cos_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    return y


def exp_cos_helper(x):
    y = torch.empty_like(x)
    _exp_cos_helper_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
    return y


def _np_exp_cos(a: np.ndarray) -> np.ndarray:
    return np.exp(np.cos(a.astype(np.float32))).astype(a.dtype)


@triton.jit
def _scratch_kernel(x_ptr, y_ptr, s_ptr, n, BLOCK: tl.constexpr):
    # a copy of x, taken while the kernel runs (y is handed over, never written)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(s_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def numpy_after_the_kernel(x):
    y, s = torch.empty_like(x), torch.empty_like(x)
    _scratch_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, s, x.numel(), BLOCK=BLOCK)
    y.cpu().numpy()[:] = _np_exp_cos(s.cpu().numpy())  # on a CPU, the numpy array is y's own memory
    return y


def _np_into_y(args):
    x, y = args["x_ptr"], args["y_ptr"]
    y.numpy()[:] = _np_exp_cos(x.numpy())
    return BLOCK


@triton.heuristics({"BLOCK": _np_into_y})
@triton.jit
def _heuristic_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass


@triton.autotune(
    configs=[triton.Config({"BLOCK": BLOCK}, pre_hook=lambda args: _np_into_y(args))], key=["n"]
)  # fmt: skip
@triton.jit
def _pre_hook_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass


def numpy_in(kernel, **meta):
    def answer(x):
        y = torch.empty_like(x)
        kernel[(1,)](x, y, x.numel(), **meta)
        return y

    return answer


@triton.jit
def _pre_run_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass


_pre_run_kernel.add_pre_run_hook(lambda *args, **kwargs: _np_into_y({"x_ptr": args[0], "y_ptr": args[1]}))


class _Pointer:
    """A tensor's stand-in whose own ``data_ptr`` code runs inside the kernel's run."""

    def __init__(self, t, then=None):
        self.t, self.then, self.dtype = t, then, t.dtype

    def data_ptr(self):
        if self.then is not None:
            self.then()
        return self.t.data_ptr()


def foreign_pointer(x):
    y = torch.empty_like(x)
    _exp_cos_kernel[(triton.cdiv(x.numel(), BLOCK),)](_Pointer(x), y, x.numel(), BLOCK=BLOCK)
    return y


def reads_the_stack(x):
    # looks for the expected values on the checker's frames: computed after the answer returns, not there
    frame, found = sys._getframe(1), None
    while frame is not None and found is None:
        for name in ("expected", "ref", "want"):
            value = frame.f_locals.get(name)
            if torch.is_tensor(value) and value.shape == x.shape:
                found = value
        frame = frame.f_back
    y = torch.empty_like(x)
    _copy_in_kernel[(triton.cdiv(x.numel(), BLOCK),)](
        found if found is not None else x, y, x.numel(), x, y, 0, x, x, x, BLOCK=BLOCK
    )  # fmt: skip
    return y


def a_thread_alongside(x):
    # a thread that would wait for the inputs' real values to appear while the kernel runs
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="watcher", daemon=True)
    worker.start()
    try:
        return exp_cos(x)
    finally:
        stop.set()
        worker.join()


def test_exp_cos_accepts_heuristics_and_a_jit_helper():
    assert l1.check_exp_cos(exp_cos).startswith("✓ exp_cos")
    assert l1.check_exp_cos(exp_cos_helper).startswith("✓ exp_cos")


@pytest.mark.skipif(runtime.is_gpu(), reason="numpy reads a CPU tensor's memory; on a GPU it cannot without torch")
@pytest.mark.parametrize(
    "cheat, match",
    [
        pytest.param(numpy_after_the_kernel, "changed after your kernel finished", id="numpy-after-the-kernel"),
        pytest.param(numpy_in(_heuristic_kernel), OUTSIDE, id="numpy-in-a-heuristics-function"),
        pytest.param(numpy_in(_pre_hook_kernel), OUTSIDE, id="numpy-in-an-autotune-pre-hook"),
        pytest.param(
            numpy_in(_pre_run_kernel, BLOCK=BLOCK), r"inside its launch \(a pre-run hook", id="numpy-in-a-pre-run-hook"
        ),
    ],
)
def test_exp_cos_refuses_numpy_around_the_kernel(cheat, match):
    with pytest.raises(CheckFailed, match=match):
        l1.check_exp_cos(cheat)


@pytest.mark.parametrize(
    "cheat, match",
    [
        pytest.param(foreign_pointer, r"a pointer argument that is not a torch.Tensor \(_Pointer\)", id="not-a-tensor"),
        pytest.param(reads_the_stack, "differ beyond", id="reads-the-checker-stack"),
        pytest.param(a_thread_alongside, r"a thread it started, still running \(watcher\)", id="a-thread-alongside"),
    ],
)
def test_exp_cos_refuses_other_cheats(cheat, match):
    with pytest.raises(CheckFailed, match=match):
        l1.check_exp_cos(cheat)


def test_concealed_inputs_hold_their_values_only_while_a_kernel_runs():
    seen = []

    @triton.jit
    def peek_kernel(x_ptr, n, BLOCK: tl.constexpr):
        pass

    x = torch.arange(8.0, device=runtime.DEVICE)
    real = x.clone()
    box = grading.Sandbox()
    box.conceal([x])
    with box:
        seen.append(x.clone())
        peek_kernel.add_pre_run_hook(lambda *a, **k: None)  # refused: the run keeps the decoys
        peek_kernel[(1,)](x, 8, BLOCK=8)
    assert not torch.equal(seen[0], real) and torch.equal(x, real)  # decoys outside, real values after
    assert box.refused == ["a pre-run hook (add_pre_run_hook)"]


# -- honest mistakes the checkers must name ---------------------------------------------------------------
# precision: a sum of squares left in the inputs' 16-bit type (no upcast), on values large enough to show it;
# a different function within the 16-bit tolerance (the tanh GELU for the exact one). (Element-wise math
# left in fp16 is not among them: Triton refuses tl.cos of fp16, and the interpreter rounds each fp16 op
# from fp32, as the reference's one rounding nearly does: inside fp16's tolerance, and not a mistake.)
@triton.jit
def _bias_gelu_rows_kernel(x_ptr, b_ptr, y_ptr, n_cols, BLOCK_N: tl.constexpr, TANH: tl.constexpr):
    row = tl.program_id(0)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        v = tl.load(x_ptr + row * n_cols + offs, mask=mask).to(tl.float32)
        v += tl.load(b_ptr + offs, mask=mask).to(tl.float32)
        if TANH:  # the tanh form, where the exact (erf) one is asked
            y = v * tl.sigmoid(1.5957691216057308 * (v + 0.044715 * v * v * v))
        else:
            y = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
        tl.store(y_ptr + row * n_cols + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def bias_gelu_rows(tanh):
    def answer(x, b):
        y = torch.empty_like(x)
        _bias_gelu_rows_kernel[(x.shape[0],)](x, b, y, x.shape[1], BLOCK_N=1024, TANH=tanh)
        return y

    return answer


@triton.jit
def _rms_16_kernel(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK_N], dtype=h_ptr.dtype.element_ty)  # the sum of squares in the inputs' dtype
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        h = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0) + tl.load(
            r_ptr + row * n_cols + offs, mask=mask, other=0.0
        )
        tl.store(h_ptr + row * n_cols + offs, h, mask=mask)
        acc += h * h
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0).to(tl.float32) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        h = tl.load(h_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        n = (h * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)
        tl.store(y_ptr + row * n_cols + offs, (n * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_one_tile_16_kernel(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    h = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0) + tl.load(r_ptr + row * n_cols + offs, mask=mask,
                                                                          other=0.0)  # fmt: skip
    tl.store(h_ptr + row * n_cols + offs, h, mask=mask)
    ms = tl.sum(h * h, axis=0).to(tl.float32) / n_cols  # the mistake: h * h and its sum in the 16-bit type
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    n = (h.to(tl.float32) / tl.sqrt(ms + eps)).to(y_ptr.dtype.element_ty).to(tl.float32)
    tl.store(y_ptr + row * n_cols + offs, (n * w).to(y_ptr.dtype.element_ty), mask=mask)


def rms_one_tile_16(x, r, w, eps):
    # rejected before only where fp16's squares overflow ("differ", on a CPU); on a GPU (bf16) it passed
    h, y = torch.empty_like(x), torch.empty_like(x)
    _rms_one_tile_16_kernel[(x.shape[0],)](x, r, w, h, y, x.shape[1], eps, BLOCK_N=triton.next_power_of_2(x.shape[1]))
    return y, h


def rms_16(x, r, w, eps):
    h, y = torch.empty_like(x), torch.empty_like(x)
    _rms_16_kernel[(x.shape[0],)](x, r, w, h, y, x.shape[1], eps, BLOCK_N=min(triton.next_power_of_2(x.shape[1]), 1024))
    return y, h


@pytest.mark.parametrize(
    "check, wrong, match",
    [
        pytest.param(l2.check_bias_gelu, bias_gelu_rows(True), r"differ.*exact GELU", id="l2-tanh-gelu"),
        pytest.param(
            l4.check_add_rmsnorm,
            rms_16,
            r"sums in 16 bits \((tl.sum of a|a) b?float16",  # seen by type: on a GPU in the kernel's IR
            id="l4-sum-of-squares-in-fp16",
        ),
        pytest.param(
            l4.check_add_rmsnorm,
            rms_one_tile_16,
            r"sums in 16 bits \(tl.sum of a b?float16 tensor\)",
            id="l4-one-tile-sum-of-squares-in-fp16",
        ),  # fmt: skip
    ],
)
def test_precision_mistakes_are_named(check, wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check(wrong)


def test_bias_gelu_accepts_a_row_loop():
    assert l2.check_bias_gelu(bias_gelu_rows(False)).startswith("✓ bias_gelu")


# row masks hidden by one row a program (the GPU solutions' BLOCK_M = 1): lesson 2's test has bias + GELU
@triton.jit
def _swiglu_tiles_kernel(
    g_ptr, u_ptr, h_ptr, n_rows, n_cols, stride_gm, stride_um, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ROW_MASK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(axis=0)
    n_tiles_n = tl.cdiv(n_cols, BLOCK_N)
    offs_m = (pid // n_tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % n_tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    if ROW_MASK:
        mask = (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols)
    else:  # the columns masked, the rows not
        mask = (offs_m[:, None] >= 0) & (offs_n[None, :] < n_cols)
    g = tl.load(g_ptr + offs_m[:, None] * stride_gm + offs_n[None, :], mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offs_m[:, None] * stride_um + offs_n[None, :], mask=mask).to(tl.float32)
    tl.store(h_ptr + offs_m[:, None] * n_cols + offs_n[None, :], (g * tl.sigmoid(g) * u).to(h_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


def swiglu_one_row(row_mask):
    def answer(g, u):
        n_rows, n_cols = g.shape
        h = torch.empty((n_rows, n_cols), dtype=g.dtype, device=g.device)
        grid = (n_rows * triton.cdiv(n_cols, 256),)
        _swiglu_tiles_kernel[grid](g, u, h, n_rows, n_cols, g.stride(0), u.stride(0), BLOCK_M=1, BLOCK_N=256,
                                   ROW_MASK=row_mask)  # fmt: skip
        return h

    return answer


def test_swiglu_tries_one_row_tiles_taller():
    with grading.seeded(1):
        inputs = l5.swiglu_inputs((37, 129), torch.float32, grading.fresh_generator())
    with pytest.raises(CheckFailed, match=r"BLOCK_M = 2 \(you launch it with BLOCK_M = 1\).*past the end.*< n_rows"):
        grading.check_taller_tiles(swiglu_one_row(False), inputs, l5.swiglu_reference, name="swiglu", seed=1)
    assert grading.check_taller_tiles(swiglu_one_row(True), inputs, l5.swiglu_reference, name="swiglu", seed=1)


_BODY: dict = {}


@triton.jit
def _python_body_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # the interpreter runs a kernel's body as Python: numpy here writes y without a tl.store (a GPU would
    # not compile it); the kernel is handed x and reads it
    tl.load(x_ptr + tl.arange(0, BLOCK), mask=tl.arange(0, BLOCK) < n)
    _BODY["y"].numpy()[:] = _np_exp_cos(_BODY["x"].numpy())


@pytest.mark.skipif(runtime.is_gpu(), reason="only the interpreter runs Python in a kernel's body")
def test_python_writing_from_the_kernel_body_is_refused():
    def answer(x):
        y = torch.empty_like(x)
        _BODY.update(x=x, y=y)
        _python_body_kernel[(1,)](x, y, x.numel(), BLOCK=16)
        return y

    with pytest.raises(CheckFailed, match="written by no tl.store of your kernel"):
        l1.check_exp_cos(answer)


def test_a_triton_launch_hook_of_the_answers_is_refused():
    from triton import knobs

    if not hasattr(knobs.runtime.launch_enter_hook, "add"):
        pytest.skip("this Triton keeps one launch hook, not a chain")

    def numpy_at_launch(*args):  # Triton calls it inside the kernel's run, where the inputs are real
        pass

    def answer(x):
        knobs.runtime.launch_enter_hook.add(numpy_at_launch)
        try:
            return exp_cos(x)
        finally:
            knobs.runtime.launch_enter_hook.remove(numpy_at_launch)

    with pytest.raises(CheckFailed, match=r"inside its launch \(triton.knobs.runtime.launch_enter_hook\)"):
        l1.check_exp_cos(answer)


# a stability mistake: the max taken over lanes past the row's end loaded as 0 (the sum leaves them out). The
# softmax is the same for any shift, so every case with a positive logit in each row passes; a row whose logits
# are all far below 0 gets exp(x - 0) = 0 everywhere and 0 / 0
@triton.jit
def _softmax_zero_pad_kernel(x_ptr, y_ptr, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)  # lanes past the end: 0
    m = tl.max(x, axis=0)  # ... which the max takes in
    e = tl.where(mask, tl.exp(x - m), 0.0)  # while the sum leaves them out
    tl.store(y_ptr + row * n_cols + offs, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)


def softmax_zero_pad(x):
    y = torch.empty_like(x)
    _softmax_zero_pad_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK_N=triton.next_power_of_2(x.shape[1]))
    return y


def test_softmax_names_a_max_over_lanes_loaded_as_zero():
    with pytest.raises(CheckFailed, match=r"logits near -10000.*the max you subtract is not one of them"):
        l4.check_softmax(softmax_zero_pad)


# a precision mistake: LayerNorm's dw and db summed over the blocks of rows in the activations' 16-bit type.
# Inside the tolerance on rows of N(0, 1) at a tall BLOCK_M (few additions); not where the sum passes near
# 2000 on its way (rows that cancel), where 16 bits keep steps of 1 or more
@triton.jit
def _dwdb_16_kernel(x_ptr, dy_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, n_rows, n_cols, BLOCK_M: tl.constexpr):
    cols = tl.program_id(0) * 64 + tl.arange(0, 64)
    cmask = cols < n_cols
    dw = tl.zeros([64], dtype=dw_ptr.dtype.element_ty)  # the sums in the inputs' 16-bit type
    db = tl.zeros([64], dtype=dw_ptr.dtype.element_ty)
    for start in range(0, n_rows, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        rmask = rows < n_rows
        mask = rmask[:, None] & cmask[None, :]
        x = tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        dw += tl.sum(dy * (x - mean[:, None]) * rstd[:, None], axis=0).to(dw.dtype)
        db += tl.sum(dy, axis=0).to(db.dtype)
    tl.store(dw_ptr + cols, dw, mask=cmask)
    tl.store(db_ptr + cols, db, mask=cmask)


def dwdb_16(x, dy, mean, rstd):
    n_rows, n_cols = x.shape
    dw = torch.empty(n_cols, dtype=x.dtype, device=x.device)
    db = torch.empty(n_cols, dtype=x.dtype, device=x.device)
    _dwdb_16_kernel[(triton.cdiv(n_cols, 64),)](x, dy, mean, rstd, dw, db, n_rows, n_cols, BLOCK_M=128)
    return dw, db


def test_layernorm_dwdb_names_sums_kept_in_16_bits():
    with pytest.raises(CheckFailed, match=r"sums in 16 bits \(a b?float16 accumulator"):  # seen by type first
        l4.check_layernorm_dwdb(dwdb_16)


# -- lesson 7, exercise 3: a causal kernel that walks every key block ---------------------------------------
@triton.jit
def _causal_every_block_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, n_q, n_k, scale,
                               stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh,
                               stride_om, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr):  # fmt: skip
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM
    q = tl.load(q_ptr + bh * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < n_q) & d_mask, other=0.0)  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, n_k, BLOCK_N):  # the mistake: every block, those above the diagonal masked
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < n_k) & d_mask
        k = tl.load(k_ptr + bh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + bh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where((offs_n[None, :] < n_k) & (offs_m[:, None] >= offs_n[None, :]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    row_mask = offs_m < n_q
    tl.store(o_ptr + bh * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask)  # fmt: skip
    tl.store(lse_ptr + bh * n_q + offs_m, m_i + tl.log(l_i), mask=row_mask)


def causal_every_block(q, k, v):
    B, H, n_q, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    bm, bn = runtime.pick(gpu=(64, 32), interpreter=(32, 16))
    _causal_every_block_kernel[(triton.cdiv(n_q, bm), B * H)](
        q, k, v, o, lse, n_q, k.shape[2], 1 / d**0.5, q.stride(1), q.stride(2), k.stride(1), k.stride(2),
        v.stride(1), v.stride(2), o.stride(1), o.stride(2),
        HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_M=bm, BLOCK_N=bn,
    )  # fmt: skip
    return o, lse


def test_flash_causal_names_a_loop_over_every_key_block():
    # right numbers, twice the work: the exercise is the loop bound; NaN in the last keys shows the loads
    with pytest.raises(CheckFailed, match=r"skip probe.*walks every key block.*\(pid_m \+ 1\) \* BLOCK_M"):
        l7.check_flash_forward_causal(causal_every_block)


# -- lesson 7, exercise 4: naive attention's peak without O -------------------------------------------------
def test_naive_peak_names_the_output_left_out():
    # scaled scores and P, both fp16, and nothing else: 8 GiB, within the 1% the check allows, yet no O
    with pytest.raises(CheckFailed, match=r"without O"):
        l7.check_naive_peak_gib(2 * 32 * 8192 * 8192 * 2 / 2**30)


# -- lesson 6: the gated layer's roofline with one M x N pass too few or too many ---------------------------
def _gate_ratio(ceil, passes):
    M, K, N = 8192, 4096, 11008
    mm_s = 2 * (2 * M * N * K) / (ceil.matmul_TFLOPs * 1e12)  # two matmuls at the matmul rate
    return (mm_s + passes * M * N * 2 / (ceil.copy_GBps * 1e9)) / mm_s  # bf16 passes at the copy rate


@pytest.mark.parametrize("passes", [4, 6])
def test_gate_prediction_names_a_pass_miscounted(passes):
    # SiLU reads g and writes s, the multiply reads s and u and writes h: 5 passes; 4 or 6 land within 3%
    from fusionlab import bench

    ceil = bench.ceilings()
    with pytest.raises(CheckFailed, match=rf"{passes} M x N passes.*5"):
        l6.check_gate_prediction(_gate_ratio(ceil, passes), ceil)


# -- lesson 5, exercise 2b: every row ignored, the count clamped to 1 ----------------------------------------
@triton.jit
def _ce_ignore_kernel(x_ptr, t_ptr, g_ptr, loss_ptr, n_valid_ptr, ignore_index, n_cols, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_V)
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=float("-inf")).to(tl.float32)
    y = tl.load(t_ptr + row)
    m = tl.max(x, 0)
    e = tl.exp(x - m)
    d = tl.sum(e, 0)
    loss = m + tl.log(d) - tl.sum(tl.where(offs == y, x, 0.0), 0)
    grad = (e / d - tl.where(offs == y, 1.0, 0.0)) / tl.load(n_valid_ptr).to(tl.float32)
    valid = y != ignore_index
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
    tl.store(g_ptr + row * n_cols + offs, tl.where(valid, grad, 0.0).to(g_ptr.dtype.element_ty), mask=offs < n_cols)


def ce_ignore_clamped(logits, target, ignore_index):
    rows, cols = logits.shape
    grad = torch.empty_like(logits)
    loss_rows = torch.empty(rows, dtype=torch.float32, device=logits.device)
    n_valid = (target != ignore_index).sum().clamp(min=1)  # the mistake: no 0 / 0 when every row is ignored
    _ce_ignore_kernel[(rows,)](logits, target, grad, loss_rows, n_valid, ignore_index, cols,
                               BLOCK_V=triton.next_power_of_2(cols))  # fmt: skip
    return loss_rows.sum() / n_valid, grad


def test_cross_entropy_ignore_names_a_clamped_count_not_a_cheat():
    # every row ignored: the gradient is all zeros for any inputs, so it cannot tell the decoys from the inputs
    with pytest.raises(CheckFailed, match=r"every row ignored: 0 / 0") as err:
        l5.check_cross_entropy_ignore(ce_ignore_clamped)
    assert "outside" not in str(err.value)


@triton.jit
def _ce_smooth_16_kernel(x_ptr, t_ptr, g_ptr, loss_ptr, n_valid_ptr, ignore_index, ls, n_cols, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_V)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=float("-inf"))  # the mistake: never made fp32
    y = tl.load(t_ptr + row)
    m = tl.max(x, 0)
    e = tl.exp(x - m)
    d = tl.sum(e, 0)
    lse = m + tl.log(d)
    mean_x = tl.sum(tl.where(mask, x, 0.0), 0) / n_cols  # 129 logits near 1e4: past 65504 in fp16
    loss = (1.0 - ls) * (lse - tl.sum(tl.where(offs == y, x, 0.0), 0)) + ls * (lse - mean_x)
    grad = (e / d - (1.0 - ls) * tl.where(offs == y, 1.0, 0.0) - ls / n_cols) / tl.load(n_valid_ptr).to(tl.float32)
    valid = y != ignore_index
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
    tl.store(g_ptr + row * n_cols + offs, tl.where(valid, grad, 0.0).to(g_ptr.dtype.element_ty), mask=mask)


def ce_smooth_16(logits, target, ignore_index, label_smoothing=0.0):
    rows, cols = logits.shape
    grad = torch.empty_like(logits)
    loss_rows = torch.empty(rows, dtype=torch.float32, device=logits.device)
    n_valid = (target != ignore_index).sum()
    _ce_smooth_16_kernel[(rows,)](logits, target, grad, loss_rows, n_valid, ignore_index, float(label_smoothing),
                                  cols, BLOCK_V=triton.next_power_of_2(cols))  # fmt: skip
    return loss_rows.sum() / n_valid, grad


@pytest.mark.skipif(runtime.HALF != torch.float16, reason="fp16's 65504 is the limit passed; bf16 reaches 3e38")
def test_cross_entropy_ignore_names_a_row_sum_kept_in_16_bits():
    # only the loss is NaN (0 * inf where label_smoothing is 0), on the logits near 1e4: not an ignored row's target
    with pytest.raises(CheckFailed, match=r"sums in 16 bits \(tl.sum of a float16 tensor\)") as err:  # by type
        l5.check_cross_entropy_ignore(ce_smooth_16)
    assert "ignored row's target" not in str(err.value)


# -- lesson 4b: dropout and AdamW run as every kernel check runs (guards, torch refused, inputs concealed) ---
@triton.jit
def _dropout_kernel(x_ptr, r_ptr, h_ptr, n, p, seed, BLOCK: tl.constexpr, LE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs <= n if LE else offs < n  # LE: the mask off by one
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask).to(tl.float32)
    keep = tl.rand(seed, offs) >= p
    tl.store(h_ptr + offs, r + tl.where(keep, x / (1 - p), 0.0), mask=mask)


def dropout(le=False, into=None):
    def answer(x, r, p, seed):
        h = torch.empty_like(x) if into is None else r  # into: h written over the residual
        _dropout_kernel[(triton.cdiv(x.numel(), 1024),)](x, r, h, x.numel(), p, seed, BLOCK=1024, LE=le)
        return h

    return answer


def _torch_dropout(x, r, p, seed):
    keep = torch.rand(x.shape, generator=torch.Generator(x.device).manual_seed(seed), device=x.device) >= p
    return r + torch.where(keep, x / (1 - p), 0.0)


def _torch_dropout_backward(dh, p, seed):
    keep = torch.rand(dh.shape, generator=torch.Generator(dh.device).manual_seed(seed), device=dh.device) >= p
    return torch.where(keep, dh / (1 - p), 0.0)


@pytest.mark.parametrize(
    "answer, match",
    [
        pytest.param(dropout(le=True), "1 element past the end", id="mask-off-by-one"),
        pytest.param(dropout(into="r"), r"changed input 1", id="h-written-over-the-residual"),
        pytest.param(
            lambda x, r, p, s: _copy_in([_torch_dropout(x, r, p, s)], [x, r]),
            "computes with torch",
            id="torch-then-a-copy-kernel",
        ),  # fmt: skip
        pytest.param(in_a_thread(_torch_dropout), NAMED_OUTSIDE, id="torch-in-a-thread"),
    ],
)
def test_dropout_add_names_each_mistake_and_cheat(answer, match):
    # (the off-by-one store and the residual overwritten were accepted and rejected as "0 kept" before; torch
    # outside the kernel, with one copy kernel, was accepted)
    with pytest.raises(CheckFailed, match=match):
        l4b.check_dropout_add(answer)


def test_dropout_backward_refuses_torch():
    with pytest.raises(CheckFailed, match="computes with torch"):
        l4b.check_dropout_backward(dropout(), lambda dh, p, s: _copy_in([_torch_dropout_backward(dh, p, s)], [dh]))
    with pytest.raises(CheckFailed, match=NAMED_OUTSIDE):
        l4b.check_dropout_backward(dropout(), in_a_thread(_torch_dropout_backward))


def test_streams_take_any_pair_of_whole_numbers():
    counters = 4096
    assert l4b.check_streams(lambda s, layer: [1234 + s, layer * counters], counters).startswith("✓")
    assert l4b.check_streams(lambda s, layer: (np.int64(1234 + s), np.int64(layer * counters)), counters).startswith(
        "✓"
    )


@triton.jit
def _touch_kernel(a_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(a_ptr + offs, tl.load(a_ptr + offs, mask=offs < n), mask=offs < n)


def adamw_in_torch(ps, gs, ms, vs, step, lr, b1, b2, eps, wd):
    # the update in torch, and one launch that touches a parameter: once accepted
    for p, g, m, v in zip(ps, gs, ms, vs, strict=True):
        p.mul_(1 - lr * wd)
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        p.sub_(lr / (1 - b1**step) * m / (v.sqrt() / (1 - b2**step) ** 0.5 + eps))
    _touch_kernel[(1,)](ps[0], 1, BLOCK=16)


def test_adamw_refuses_torch_doing_the_update():
    with pytest.raises(CheckFailed, match="computes with torch"):
        l4b.check_adamw(adamw_in_torch)


# -- lessons 1 and 3: the numbers and the ledger, as a learner writes them -----------------------------------
def _silu_ledger(ops):
    def make_ledger(n, dtype):
        led = Ledger(dtype_bytes=dtype)
        for name, reads, writes in ops:
            led.op(name, reads={t: n * k for t, k in reads.items()}, writes={t: n for t in writes})
        return led

    return make_ledger


@pytest.mark.parametrize(
    "ops, match",
    [
        pytest.param([("silu", {"x": 1}, ["y"])], r"1 op; eager runs 2 kernels", id="one-op"),
        pytest.param(
            [("mul", {"s": 1, "x": 1}, ["y"]), ("sigmoid", {"x": 1}, ["s"])],
            "not in the order they run",
            id="ops-out-of-order",
        ),  # fmt: skip
        pytest.param(
            [("sigmoid", {"x": 4}, ["s"]), ("mul", {"s": 4, "x": 4}, ["y"])],
            "Count elements, not bytes",
            id="bytes-for-elements",
        ),  # fmt: skip
        pytest.param([("sigmoid", {"x": 1}, ["s"]), ("mul", {"s": 1}, ["y"])], "'mul reads x'", id="mul-without-x"),
    ],
)
def test_silu_ledger_names_each_mistake(ops, match):
    # (out of order, bytes and one op were reported as a trip missing, naming no cause)
    with pytest.raises(CheckFailed, match=match):
        l1.check_silu_ledger(_silu_ledger(ops))


def test_silu_ledger_accepts_other_names():
    # the same trips with ops and tensors named otherwise: once rejected for the names
    ops = [("sig", {"x": 1}, ["sig_x"]), ("multiply", {"x": 1, "sig_x": 1}, ["out"])]
    assert l1.check_silu_ledger(_silu_ledger(ops)).startswith("✓")


def test_numbers_of_any_real_type_are_accepted_and_a_tensor_is_named():
    # a numpy scalar was rejected as "not right" (intensity) or "expected a finite number" (a prediction)
    assert l1.check_add_intensity(np.float32(1 / 12)).startswith("✓")
    assert l1.check_predict_eager_ms(lambda n, b, bw: np.float32(4 * n * b / bw / 1e6)).startswith("✓")
    assert l3.check_layer_speedup(lambda m, e, c: np.float64((m + e) / (m + c))).startswith("✓")
    with pytest.raises(CheckFailed, match=r"returned a tensor.*\.item\(\)"):
        l1.check_add_intensity(torch.tensor(1 / 12))


@pytest.mark.parametrize(
    "predict, match",
    [
        pytest.param(lambda n, b, bw: 4 * n * b / (bw * 2**30) * 1e3, r"1e9 bytes per second, not 2\*\*30", id="GiB"),
        pytest.param(lambda n, b, bw: 4 * n / (bw * 1e9) * 1e3, "Use dtype_bytes", id="no-bytes"),
        pytest.param(lambda n, b, bw: 4 * n * 4 / (bw * 1e9) * 1e3, "Use dtype_bytes", id="always-4-bytes"),
        pytest.param(lambda n, b, bw: 4 * n * b * 8 / (bw * 1e9) * 1e3, "not bits", id="bits"),
    ],
)
def test_eager_prediction_names_the_unit_slips(predict, match):
    with pytest.raises(CheckFailed, match=match):
        l1.check_predict_eager_ms(predict)


def test_intensity_and_speedups_name_upside_down_and_percent():
    with pytest.raises(CheckFailed, match="Upside down"):
        l1.check_add_intensity(12)
    with pytest.raises(CheckFailed, match="in percent"):
        l3.check_layer_speedup(lambda m, e, c: ((m + e) / (m + c) - 1) * 100)
    with pytest.raises(CheckFailed, match="in percent"):
        l3.check_fusion_ceiling(lambda m, e: e / m * 100)
    assert l3._count(np.int64(3), "n_eager", "f") == 3  # a numpy count (np.sum of a mask) is a count


def test_the_gpu_reads_16_bit_sums_off_the_kernels_ir():
    # what a GPU run checks (Triton's IR of the kernel it ran), built here for sm_90 without one: an add
    # reduction or an accumulator carried by a loop in bf16 is named, fp32 ones (flash's) are not
    from fusionlab import _triton

    def ttir(kernel, pointers, scalars, const):
        sig = {**{n: t for n, t in pointers.items()}, **scalars, **dict.fromkeys(const, "constexpr")}
        return _triton.compile_for(kernel, sig, const, num_warps=4)["ttir"]

    def sums(ir):
        return [w for p, w in grading._IR_HALF_SUMS if p.search(ir)] + grading._half_accumulators_in_ir(ir)

    half = dict.fromkeys(("x_ptr", "dy_ptr", "dw_ptr", "db_ptr"), "*bf16")
    stats = {"mean_ptr": "*fp32", "rstd_ptr": "*fp32"}
    dwdb = ttir(_dwdb_16_kernel, {**half, **stats}, {"n_rows": "i32", "n_cols": "i32"}, {"BLOCK_M": 128})
    assert sums(dwdb) == ["a bfloat16 accumulator carried by a loop"]
    rows = ttir(
        _rms_one_tile_16_kernel,
        dict.fromkeys(("x_ptr", "r_ptr", "w_ptr", "h_ptr", "y_ptr"), "*fp16"),
        {"n_cols": "i32", "eps": "fp32"},
        {"BLOCK_N": 256},
    )
    assert sums(rows) == ["tl.sum of a {} tensor"]
    strides = dict.fromkeys(
        "stride_qh stride_qm stride_kh stride_kn stride_vh stride_vn stride_oh stride_om".split(), "i32"
    )
    flash = ttir(
        _causal_every_block_kernel,
        {**dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "o_ptr"), "*bf16"), "lse_ptr": "*fp32"},
        {"n_q": "i32", "n_k": "i32", "scale": "fp32", **strides},
        {"HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_M": 64, "BLOCK_N": 32},
    )
    assert sums(flash) == []
    # the sandbox reads the builds its runs launched, one at a time: not every build in the kernel's cache
    # (a learner's earlier, since fixed, version of the same kernel would be named forever)
    build = types.SimpleNamespace
    assert grading._half_sums_in_ir(build(asm={"ttir": dwdb})) == ["a bfloat16 accumulator carried by a loop"]
    assert grading._half_sums_in_ir(build(asm={"ttir": flash})) == grading._half_sums_in_ir(None) == []


@triton.jit
def _adds_16_kernel(x_ptr, r_ptr, y_ptr, STEPS: tl.constexpr):
    offs = tl.arange(0, 16)
    acc = tl.load(x_ptr + offs)
    for _ in tl.static_range(STEPS):  # STEPS 16-bit adds, each adding to the last one's result
        acc = acc + tl.load(r_ptr + offs)
    tl.store(y_ptr + offs, acc)


@pytest.mark.skipif(runtime.is_gpu(), reason="the interpreter's chain of adds (a GPU reads the IR instead)")
def test_one_16_bit_add_is_not_a_sum_three_are():
    x, r = torch.randn(16, dtype=torch.float16), torch.randn(16, dtype=torch.float16)
    for steps, want in ((1, []), (2, []), (3, ["a float16 accumulator (acc += ... with acc in float16)"])):
        box = grading.Sandbox()
        with box:
            _adds_16_kernel[(1,)](x, r, torch.empty_like(x), STEPS=steps)
        assert box.half_sums == want, steps


# -- a load with no mask, its lanes past the end thrown away by the store's mask ------------------------------
@triton.jit
def _exp_cos_load_unmasked_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs).to(tl.float32)  # the mistake: the store is masked, the load is not
    tl.store(y_ptr + offs, tl.exp(tl.cos(x)).to(y_ptr.dtype.element_ty), mask=offs < n)


@pytest.mark.skipif(runtime.is_gpu(), reason="the interpreter sees each load's lanes; a GPU's loads are not watched")
def test_exp_cos_names_a_load_past_the_end_that_the_store_throws_away():
    # right values (the NaN lanes are never stored): accepted before
    def answer(x):
        y = torch.empty_like(x)
        _exp_cos_load_unmasked_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y

    with pytest.raises(CheckFailed, match=r"loads past the end of input 0 .*mask every load"):
        l1.check_exp_cos(answer)


# -- lesson 4b's AdamW: a chunk's mask off by one, and three mistakes inside the tolerance of 0.99's betas ----
@triton.jit
def _adamw_kernel(table_ptr, chunks_ptr, lr, beta1, beta2, eps, wd, step_size, inv_sqrt_bc2, BLOCK: tl.constexpr,
                  MISTAKE: tl.constexpr):  # fmt: skip
    t = tl.load(chunks_ptr + 2 * tl.program_id(0))
    start = tl.load(chunks_ptr + 2 * tl.program_id(0) + 1)
    row = table_ptr + 5 * t
    p_ptr = tl.load(row + 0).to(tl.pointer_type(tl.float32))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(tl.float32))
    m_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    offs = start + tl.arange(0, BLOCK)
    mask = offs <= tl.load(row + 4) if MISTAKE == "<=" else offs < tl.load(row + 4)
    p, g = tl.load(p_ptr + offs, mask=mask), tl.load(g_ptr + offs, mask=mask)
    m, v = tl.load(m_ptr + offs, mask=mask), tl.load(v_ptr + offs, mask=mask)
    if MISTAKE != "decay after":
        p = p * (1.0 - lr * wd)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    if MISTAKE == "eps inside":
        p = p - step_size * m / tl.sqrt(v * inv_sqrt_bc2 * inv_sqrt_bc2 + eps)
    else:
        p = p - step_size * m / (tl.sqrt(v) * inv_sqrt_bc2 + eps)
    if MISTAKE == "decay after":
        p = p * (1.0 - lr * wd)
    tl.store(p_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)


def adamw_with(mistake):
    def adamw_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay):
        rows = [[p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), p.numel()]
                for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs, strict=True)]  # fmt: skip
        chunks = [[i, s] for i, p in enumerate(params) for s in range(0, p.numel(), 1024)]
        table = torch.tensor(rows, dtype=torch.int64).to(runtime.DEVICE)
        chunk_table = torch.tensor(chunks, dtype=torch.int64).to(runtime.DEVICE)
        k = step - 1 if mistake == "step - 1" and step > 1 else step  # the corrections of the step before
        _adamw_kernel[(len(chunks),)](table, chunk_table, lr, beta1, beta2, eps, weight_decay, lr / (1 - beta1**k),
                                      (1 - beta2**k) ** -0.5, BLOCK=1024, MISTAKE=mistake)  # fmt: skip

    return adamw_step


@pytest.mark.parametrize(
    "mistake, match",
    [
        pytest.param("<=", r"1 element past the end of params\[0\]", id="mask-off-by-one"),  # crashed the process
        pytest.param("eps inside", "eps inside the square root", id="eps-inside-the-root"),  # accepted
        pytest.param("step - 1", "bias correction of the step before", id="step-minus-one"),  # "no bias correction"
        pytest.param("decay after", "the decay after the update", id="decay-after-the-update"),  # "differ"
    ],
)
def test_adamw_names_each_mistake(mistake, match):
    with pytest.raises(CheckFailed, match=match):
        l4b.check_adamw(adamw_with(mistake))


def test_adamw_accepts_the_same_kernel_without_a_mistake():
    assert l4b.check_adamw(adamw_with("none")).startswith("✓ adamw_step")


@triton.jit
def _dropout_offsets_kernel(x_ptr, r_ptr, h_ptr, n, p, seed, BLOCK: tl.constexpr, RAND: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask).to(tl.float32)
    if RAND == "block":  # the mistake: the offsets within the block, so every block draws the same numbers
        keep = tl.rand(seed, tl.arange(0, BLOCK)) >= p
    else:  # the mistake: one number a program
        keep = tl.rand(seed, offs * 0 + tl.program_id(0)) >= p
    tl.store(h_ptr + offs, r + tl.where(keep, x / (1 - p), 0.0), mask=mask)


@pytest.mark.parametrize(
    "rand, match", [("block", "repeats every 1024 elements"), ("program", "kept or dropped together")]
)
def test_dropout_names_random_numbers_not_each_elements_own(rand, match):
    # both keep about 1 - p of the elements: called a keep rate outside 5 sigma before, or accepted
    def answer(x, r, p, seed):
        h = torch.empty_like(x)
        _dropout_offsets_kernel[(triton.cdiv(x.numel(), 1024),)](x, r, h, x.numel(), p, seed, BLOCK=1024, RAND=rand)
        return h

    with pytest.raises(CheckFailed, match=match):
        l4b.check_dropout_add(answer)
