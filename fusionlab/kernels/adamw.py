"""Lesson 4b: AdamW over every tensor of a model in one launch.

One optimizer step updates every parameter tensor (GPT-2 small has about 150, a Llama-style 1B model
about 200) with the same few element-wise lines (Loshchilov & Hutter, "Decoupled Weight Decay
Regularization", 2019; torch's ``AdamW``)::

    p ← p (1 − lr λ)                       # decoupled weight decay: not added to the gradient
    m ← β1 m + (1 − β1) g;   v ← β2 v + (1 − β2) g²
    p ← p − (lr / (1 − β1^t)) m / (√v / √(1 − β2^t) + ε)      # bias correction for step t

reading p, g, m, v and writing p, m, v: 7 trips an element (fp32: 28 bytes). Launched tensor by tensor
(a Python loop of torch ops: about a dozen kernels a tensor) a step is thousands of launches, most of
them on small tensors: lesson 1's launch-bound regime. torch's ``foreach`` path groups the ops across
tensors (one launch per op per group of tensors); ``fused=True`` is one CUDA kernel per group of
tensors. Here: **one Triton launch for all tensors**. The host writes a table — one row per tensor of
its data pointers (p, g, m, v) as int64 — and a chunk map — one row per program of (tensor, first
element). A program reads its row, casts the integers back to pointers
(``.to(tl.pointer_type(tl.float32))``) and updates up to ``CHUNK`` elements. The table is cached by
the tensors' addresses and uploaded only when they change (gradients freed and reallocated by
``zero_grad`` usually come back at the same addresses from torch's caching allocator).

**The step count.** With ``capturable=False`` the host knows the step t and passes ``lr / (1 − β1^t)``
and ``1 / √(1 − β2^t)`` as scalars. ``capturable=True`` keeps t on the device (a float32 a tensor), so
the step can be recorded in a CUDA graph and replayed: each program reads t, computes t + 1 and the
corrections itself, and counts itself done on an int32 ticket (``tl.atomic_add``, acquire-release);
the last program to finish writes t + 1 and resets the ticket — still one launch, with no race on t.

**Master weights.** With bf16 (or fp16) parameters, ``master_weights=True`` keeps an fp32 copy of each
parameter in the state ("master"): the kernel updates the fp32 master and writes the parameter as its
rounding (reads p32, g, m, v; writes p32, p, m, v). Without it a bf16 parameter accumulates the update
in bf16, which loses small updates.

Hyper-parameters, state (``step``, ``exp_avg``, ``exp_avg_sq``) and the state dict are torch's: a
state dict saved by one loads into the other. Reference: :func:`adamw_reference` (float64).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import runtime
from ..ledger import Ledger
from ._launch import KernelInputError, Launcher, check_tensor, launch_kwargs

OP = "multi_tensor_adamw"


# -- spec, ledger -----------------------------------------------------------------------------------------
def adamw_reference(p, g, m, v, *, step: int, lr, beta1, beta2, eps, weight_decay, maximize=False):
    """One AdamW step in float64 on copies: returns ``(p, m, v)`` (step is the count after this step)."""
    p, g, m, v = (t.double() for t in (p, g, m, v))
    if maximize:
        g = -g
    p = p * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    bc1 = 1 - beta1**step
    bc2 = 1 - beta2**step
    p = p - (lr / bc1) * m / (v.sqrt() / math.sqrt(bc2) + eps)
    return p, m, v


def adamw_ledger(sizes, dtype=torch.float32, *, master_weights: bool = False) -> Ledger:
    """Trips of one AdamW step over tensors of ``sizes`` (elements), fused: read p, g, m, v and write p,
    m, v (with master weights: read and write the fp32 master too, p in ``dtype``). The eager column
    is a per-tensor Python loop counted as torch's single-tensor AdamW runs it (mul_, lerp_, mul_,
    addcmul_, sqrt, div_, add_, addcdiv_: eight kernels a tensor, their temporaries included)."""
    n = int(sum(int(s) for s in sizes))
    sizes_ = {"m": 4, "v": 4, "p32": 4, "denom": 4}
    led = Ledger(dtype_bytes=dtype, sizes=sizes_, outputs=("p", "m", "v", "p32") if master_weights else ("p", "m", "v"))
    pw = "p32" if master_weights else "p"
    led.op("decay", reads={pw: n}, writes={pw: n})
    led.op("lerp m", reads={"m": n, "g": n}, writes={"m": n})
    led.op("v*b2", reads={"v": n}, writes={"v": n})
    led.op("addcmul v", reads={"v": n, "g": n}, writes={"v": n})
    led.op("sqrt", reads={"v": n}, writes={"denom": n})
    led.op("div", reads={"denom": n}, writes={"denom": n})
    led.op("add eps", reads={"denom": n}, writes={"denom": n})
    led.op("addcdiv", reads={pw: n, "m": n, "denom": n}, writes={pw: n})
    led.fused(
        "adamw",
        reads={pw: n, "g": n, "m": n, "v": n},
        writes={pw: n, "m": n, "v": n, **({"p": n} if master_weights else {})},
    )
    return led


# -- configuration ----------------------------------------------------------------------------------------
#: elements a program updates (a chunk of one tensor) and its tile; the interpreter's programs are few
#: and large (each costs milliseconds of Python)
GPU_CONFIG = {"CHUNK": 32768, "BLOCK": 2048, "num_warps": 8}
INTERPRETER_CONFIG = {"CHUNK": 4096, "BLOCK": 4096, "num_warps": 4}


def adamw_config(gpu: bool | None = None) -> dict:
    gpu = runtime.is_gpu() if gpu is None else gpu
    return dict(GPU_CONFIG if gpu else INTERPRETER_CONFIG)


# -- kernel -----------------------------------------------------------------------------------------------
@triton.jit
def _adamw_kernel(
    table_ptr, chunks_ptr, steps_ptr, ticket_ptr,
    lr, beta1, beta2, eps, weight_decay, step_size, inv_sqrt_bc2,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, COLS: tl.constexpr, MASTER: tl.constexpr,
    CAPTURABLE: tl.constexpr, MAXIMIZE: tl.constexpr, P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    t = tl.load(chunks_ptr + 2 * pid)  # (tensor, first element) of this program's chunk
    start = tl.load(chunks_ptr + 2 * pid + 1)
    row = table_ptr + t * COLS  # p, g, m, v (, p32), numel
    p_ptr = tl.load(row).to(tl.pointer_type(P_DTYPE))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(G_DTYPE))
    m_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    numel = tl.load(row + COLS - 1)
    if MASTER:
        w_ptr = tl.load(row + 4).to(tl.pointer_type(tl.float32))
    else:
        w_ptr = p_ptr
    if CAPTURABLE:  # t on the device: this step is t + 1; the corrections computed here
        step = tl.load(steps_ptr + t) + 1.0
        step_size = lr / (1.0 - tl.exp2(step * tl.log2(beta1)))
        inv_sqrt_bc2 = 1.0 / tl.sqrt(1.0 - tl.exp2(step * tl.log2(beta2)))
    decay = 1.0 - lr * weight_decay
    for off in range(0, CHUNK, BLOCK):
        offs = start + off + tl.arange(0, BLOCK)
        mask = offs < numel
        w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask)
        v = tl.load(v_ptr + offs, mask=mask)
        if MAXIMIZE:
            g = -g
        w = w * decay
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        w = w - step_size * (m / (tl.sqrt(v) * inv_sqrt_bc2 + eps))
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        tl.store(w_ptr + offs, w.to(w_ptr.dtype.element_ty), mask=mask)
        if MASTER:
            tl.store(p_ptr + offs, w.to(P_DTYPE), mask=mask)
    if CAPTURABLE:
        # the last program to finish advances every tensor's t (all programs have read it by then)
        done = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
        if done == tl.num_programs(0) - 1:
            n_tensors = tl.load(ticket_ptr + 1)
            for i in range(0, n_tensors):
                tl.store(steps_ptr + i, tl.load(steps_ptr + i) + 1.0)
            tl.store(ticket_ptr, 0)


_launch = Launcher(_adamw_kernel)
_TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


class _Plan:
    """The device tables of one list of tensors: pointers (int64, one row a tensor) and chunks."""

    def __init__(self, rows: list[list[int]], sizes: list[int], chunk: int, device):
        cols = len(rows[0]) + 1
        flat = [x for r, n in zip(rows, sizes, strict=True) for x in (*r, n)]
        chunks = [x for t, n in enumerate(sizes) for s in range(0, n, chunk) for x in (t, s)]
        self.cols = cols
        self.table = torch.tensor(flat, dtype=torch.int64).to(device)
        self.chunks = torch.tensor(chunks, dtype=torch.int64).to(device)
        self.n_programs = len(chunks) // 2


_PLANS: dict = {}


def _plan(ptr_rows, sizes, chunk, device) -> _Plan:
    key = (tuple(map(tuple, ptr_rows)), chunk, str(device))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) > 64:  # addresses that keep changing: keep the cache small
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(ptr_rows, sizes, chunk, device)
    return plan


def _check_lists(params, grads, exp_avgs, exp_avg_sqs, masters, op):
    n = len(params)
    if not (len(grads) == len(exp_avgs) == len(exp_avg_sqs) == n) or (masters is not None and len(masters) != n):
        raise KernelInputError(f"{op}: params, grads, exp_avgs, exp_avg_sqs (and masters) must be lists of one length.")
    for i in range(n):
        p, g, m, v = params[i], grads[i], exp_avgs[i], exp_avg_sqs[i]
        check_tensor(p, f"params[{i}]", op=op, max_numel=None)
        dt = params[0].dtype
        check_tensor(g, f"grads[{i}]", op=op, max_numel=None)
        check_tensor(m, f"exp_avgs[{i}]", op=op, dtypes=(torch.float32,), max_numel=None)
        check_tensor(v, f"exp_avg_sqs[{i}]", op=op, dtypes=(torch.float32,), max_numel=None)
        if p.dtype != dt or g.dtype != dt:
            raise KernelInputError(f"{op}: every param and grad must share one dtype (params[0]: {dt}); tensor {i} has "
                                   f"{p.dtype} and {g.dtype}. Group tensors by dtype.")  # fmt: skip
        if not (p.shape == g.shape == m.shape == v.shape):
            raise KernelInputError(f"{op}: tensor {i}: p, g, m, v must share a shape.")
        if masters is not None:
            check_tensor(masters[i], f"masters[{i}]", op=op, dtypes=(torch.float32,), max_numel=None)
            if masters[i].shape != p.shape:
                raise KernelInputError(f"{op}: masters[{i}] must have params[{i}]'s shape.")
        if len({t.untyped_storage().data_ptr() for t in (p, g, m, v)}) < 4:
            raise KernelInputError(f"{op}: tensor {i}: p, g, m and v must not share memory.")


def _check_float(v, name, op, lo=0.0, hi=math.inf, lo_open=False, hi_open=False):
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    ok = ok and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        raise KernelInputError(f"{op}: {name}={v!r} is out of range.")
    return float(v)


def multi_tensor_adamw(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    *,
    step,
    lr: float = 1e-3,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    maximize: bool = False,
    masters=None,
    ticket: torch.Tensor | None = None,
) -> None:
    """One AdamW step for every tensor of the lists, in place, in one launch.

    ``params``, ``grads``: contiguous, one dtype (fp32, or fp16/bf16 with ``masters``, fp32 copies of
    the params that the update goes to); ``exp_avgs``, ``exp_avg_sqs``: fp32. ``step``: the step count
    *after* this step (an int: the host computes the corrections) or, for a capturable step, a float32
    device tensor of each tensor's count *before* this step, which the kernel advances by one (with
    ``ticket``, a zeroed int32 tensor of 2 — see the module docstring; made here when None).
    """
    op = OP
    if not isinstance(params, (list, tuple)):
        raise KernelInputError(f"{op}: params must be a list of tensors.")
    _check_lists(params, grads, exp_avgs, exp_avg_sqs, masters, op)
    lr = _check_float(lr, "lr", op)
    beta1 = _check_float(beta1, "beta1", op, hi=1.0, hi_open=True)
    beta2 = _check_float(beta2, "beta2", op, hi=1.0, hi_open=True)
    eps = _check_float(eps, "eps", op)
    weight_decay = _check_float(weight_decay, "weight_decay", op)
    live = [i for i, p in enumerate(params) if p.numel()]
    if not live:
        return
    capturable = isinstance(step, torch.Tensor)
    if capturable:
        check_tensor(step, "step", op=op, dtypes=(torch.float32,), ndim=1, max_numel=None)
        if step.numel() != len(params):
            raise KernelInputError(f"{op}: a step tensor needs one count a tensor ({len(params)}).")
        if len(live) != len(params):
            raise KernelInputError(f"{op}: a capturable step takes no empty tensors.")
        if ticket is None:
            ticket = torch.tensor([0, len(params)], dtype=torch.int32, device=params[0].device)
        step_size, inv_sqrt_bc2 = 0.0, 1.0
    else:
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise KernelInputError(f"{op}: step={step!r} must be a whole number >= 1 (the count after this step).")
        step_size = lr / (1 - beta1**step)
        inv_sqrt_bc2 = 1 / math.sqrt(1 - beta2**step)
    plan = make_plan(
        [params[i] for i in live], [grads[i] for i in live], [exp_avgs[i] for i in live],
        [exp_avg_sqs[i] for i in live], [masters[i] for i in live] if masters is not None else None,
    )  # fmt: skip
    run_plan(plan, step if capturable else None, ticket, lr, beta1, beta2, eps, weight_decay, maximize,
             step_size, inv_sqrt_bc2)  # fmt: skip


def make_plan(params, grads, exp_avgs, exp_avg_sqs, masters=None) -> _Plan:
    """The device tables for these (checked, non-empty) tensors, cached by their addresses."""
    cfg = adamw_config()
    rows = []
    for i in range(len(params)):
        r = [params[i].data_ptr(), grads[i].data_ptr(), exp_avgs[i].data_ptr(), exp_avg_sqs[i].data_ptr()]
        if masters is not None:
            r.append(masters[i].data_ptr())
        rows.append(r)
    plan = _plan(rows, [p.numel() for p in params], cfg["CHUNK"], params[0].device)
    plan.p_dtype, plan.g_dtype, plan.master = _TL[params[0].dtype], _TL[grads[0].dtype], masters is not None
    return plan


def run_plan(plan, steps, ticket, lr, beta1, beta2, eps, weight_decay, maximize, step_size, inv_sqrt_bc2) -> None:
    """The one launch: ``steps`` (capturable: the device counts, with ``ticket``) or None (the host's
    corrections ``step_size`` and ``inv_sqrt_bc2``)."""
    cfg = adamw_config()
    dummy = plan.table
    capturable = steps is not None
    _launch(
        (plan.n_programs,),
        plan.table, plan.chunks, steps if capturable else dummy, ticket if capturable else dummy,
        lr, beta1, beta2, eps, weight_decay, step_size, inv_sqrt_bc2,
        CHUNK=cfg["CHUNK"], BLOCK=min(cfg["BLOCK"], cfg["CHUNK"]), COLS=plan.cols, MASTER=plan.master,
        CAPTURABLE=capturable, MAXIMIZE=bool(maximize), P_DTYPE=plan.p_dtype, G_DTYPE=plan.g_dtype,
        **launch_kwargs(cfg["num_warps"]),
    )  # fmt: skip
