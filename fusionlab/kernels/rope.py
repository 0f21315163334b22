"""Lesson 9: rotary position embeddings (RoPE) on q and k, in one kernel forward and one backward.

RoPE (Su et al., "RoFormer", 2021) rotates pairs of a head's features by an angle that grows with the
token's position ``p``: pair ``j`` (of ``D / 2``) turns by ``p * theta_j``, ``theta_j = base ** (-2j / D)``.
For a pair ``(x1, x2)`` and its ``c = cos(p theta_j)``, ``s = sin(p theta_j)``:

    y1 = x1 c - x2 s,        y2 = x2 c + x1 s.

Which features pair up is the convention, and the two are not interchangeable (a checkpoint trained
with one gives garbage with the other):

- **rotate-half** (Llama, GPT-NeoX, Hugging Face's ``rotate_half``; the default): feature ``j`` pairs
  with feature ``j + D/2``. Hugging Face writes it ``x * cos + rotate_half(x) * sin`` with
  ``rotate_half(x) = cat(-x[D/2:], x[:D/2])`` and the angles duplicated to ``D`` columns;
- **interleaved** (GPT-J, the RoFormer paper, Meta's original Llama code through complex numbers):
  feature ``2j`` pairs with ``2j + 1``. ``interleaved=True``; the kernel only walks other offsets.

Eager (:func:`rope_eager`, Hugging Face's code) runs five kernels per tensor: ``-x2`` (the negation),
``cat``, ``x * cos``, ``rotate_half(x) * sin``, and the add: 10 trips of x's size plus the two table
reads (:func:`rope_ledger`). The fused kernel reads x and the tables once and writes y: 2 trips of x,
for q and k in one launch. The backward is the rotation by ``-p theta_j`` (a rotation's transpose is its
inverse), the same kernel with the sine negated: it saves nothing but the tables it was given.

Positions: token ``n`` of batch row ``b`` sits at ``offset + n``; ``offset`` is an int (a prefill from
0, or every row at the same decoding step) or an integer tensor of shape ``(B,)`` (each row's cache
length when decoding a batch of different lengths: no host sync, and a CUDA graph can replay it with
new values). Tables: ``cos`` and ``sin`` of shape ``(P, D/2)``, any float dtype and strides, built by
:func:`rope_tables` (or by a model's own scaling rule: Llama 3's frequency scaling changes the tables,
not the kernel). A position past ``P - 1`` is refused on the host where that is free (an int offset,
or the interpreter); on a GPU a tensor of offsets is not read back (it would sync), and such a row's
output is NaN.

Decoding writes each new token's k and v into a KV cache: :func:`rope_cache_write` rotates k straight
into the cache's rows at the tokens' positions and copies v into its cache in the same launch, where
eager runs RoPE's kernels and then two indexed copies (and the rotated k makes a round trip through HBM).

All arithmetic is fp32 whatever the storage (fp16/bf16 rounded once, on the store). Hugging Face's
Llama casts the tables to x's dtype first (:func:`rope_eager` does too), so in bf16 it rounds c and s
to 8 bits before multiplying; the kernel and :func:`rope_reference` do not.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import runtime
from ..ledger import Ledger
from ._launch import (
    KernelInputError,
    Launcher,
    Plans,
    cdiv,
    check_choice,
    check_tensor,
    host_range,
    launch_kwargs,
    next_pow2,
    signature,
)
from ._tensors import check_writable, upstream_grad

OP = "rope"
#: where the sequence and head dimensions sit in q and k: (B, H, N, D) or (B, N, H, D)
LAYOUTS = {"bhnd": (1, 2), "bnhd": (2, 1)}  # layout -> (head dim index, token dim index)
_OFFSET_DTYPES = (torch.int32, torch.int64)


# -- spec, eager, ledger, flops, tables -------------------------------------------------------------
def rope_tables(n_pos: int, head_dim: int, base: float = 10000.0, *, device=None, dtype=torch.float32):
    """``(cos, sin)``, each ``(n_pos, head_dim // 2)``: ``cos(p theta_j)`` and ``sin(p theta_j)`` with
    ``theta_j = base ** (-2j / head_dim)``, computed in float64 and rounded once to ``dtype``."""
    if head_dim < 2 or head_dim % 2:
        raise KernelInputError(f"{OP}: head_dim must be even and at least 2, got {head_dim}.")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    device = runtime.DEVICE if device is None else device
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def _positions(offset, B: int, N: int, device) -> torch.Tensor:
    """(B, N) int64 positions: ``offset + n``."""
    n = torch.arange(N, device=device)
    if isinstance(offset, torch.Tensor):
        return offset.to(device=device, dtype=torch.int64)[:, None] + n[None, :]
    return (int(offset) + n)[None, :].expand(B, N)


def _pairs(x: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if interleaved:
        return x[..., 0::2], x[..., 1::2]
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def _rotate(x, c, s, interleaved: bool):
    x1, x2 = _pairs(x, interleaved)
    y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
    if interleaved:
        return torch.stack((y1, y2), dim=-1).flatten(-2)
    return torch.cat((y1, y2), dim=-1)


def _gathered(t, pos, layout: str, wide):
    """The table's rows at ``pos`` (B, N), shaped to broadcast over q or k in ``layout``."""
    rows = t.to(wide)[pos]  # (B, N, D/2)
    return rows[:, None] if layout == "bhnd" else rows[:, :, None]


def rope_reference(q, k, cos, sin, offset=0, layout: str = "bhnd", interleaved: bool = False):
    """The spec: ``(q, k)`` rotated, computed in fp32 (float64 for float64 inputs), each returned in its
    own dtype. Arguments as :func:`rope`'s."""
    out = []
    for x in (q, k):
        wide = torch.float64 if x.dtype == torch.float64 else torch.float32
        B, N = x.shape[0], x.shape[LAYOUTS[layout][1]]
        pos = _positions(offset, B, N, cos.device)
        c, s = _gathered(cos, pos, layout, wide), _gathered(sin, pos, layout, wide)
        out.append(_rotate(x.to(wide), c, s, interleaved).to(x.dtype))
    return tuple(out)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_eager(q, k, cos, sin, offset=0, layout: str = "bhnd"):
    """What Hugging Face's Llama runs (``apply_rotary_pos_emb``, rotate-half): the tables gathered at
    the positions, duplicated to D columns and cast to x's dtype, then ``x * cos + rotate_half(x) * sin``
    for q and for k: five kernels each (``neg``, ``cat``, two ``mul``, ``add``)."""
    B, N = q.shape[0], q.shape[LAYOUTS[layout][1]]
    pos = _positions(offset, B, N, q.device)
    c = torch.cat((cos[pos], cos[pos]), dim=-1).to(q.dtype)
    s = torch.cat((sin[pos], sin[pos]), dim=-1).to(q.dtype)
    c, s = (c[:, None], s[:, None]) if layout == "bhnd" else (c[:, :, None], s[:, :, None])
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s


def rope_ledger(n_q: int, n_k: int, n_table: int, dtype, *, backward: bool = False) -> Ledger:
    """Trips of RoPE on ``n_q`` elements of q and ``n_k`` of k, as :func:`rope_eager` runs it and fused.
    ``n_table``: elements of one table as eager reads it (positions x D, the halves duplicated); the
    kernel reads the (positions x D/2) table, half of that, once for q and k together.

    Per tensor x of n elements, eager: ``neg`` reads x2 (n/2), writes n/2; ``cat`` reads n, writes n
    (rotate_half(x)); ``x * cos`` reads n and the table, writes n; ``r * sin`` likewise; ``add`` reads 2n,
    writes n: 10n trips and two table reads. Fused: x read once, y written once (2n). The backward is
    the same count with dy in place of x (autograd's eager backward of these five ops moves about as
    much)."""
    x, y = ("dy", "dx") if backward else ("x", "y")
    led = Ledger(dtype_bytes=dtype, outputs=(f"{y}_q", f"{y}_k"))
    for t, n in (("q", n_q), ("k", n_k)):
        led.op(f"neg ({t})", reads={f"{x}_{t}": n // 2}, writes={f"neg_{t}": n // 2})
        led.op(f"cat ({t})", reads={f"{x}_{t}": n // 2, f"neg_{t}": n // 2}, writes={f"rot_{t}": n})
        led.op(f"mul cos ({t})", reads={f"{x}_{t}": n, "cos": n_table}, writes={f"xc_{t}": n})
        led.op(f"mul sin ({t})", reads={f"rot_{t}": n, "sin": n_table}, writes={f"rs_{t}": n})
        led.op(f"add ({t})", reads={f"xc_{t}": n, f"rs_{t}": n}, writes={f"{y}_{t}": n})
    half = n_table // 2
    led.fused(
        "rope", reads={f"{x}_q": n_q, f"{x}_k": n_k, "cos": half, "sin": half}, writes={f"{y}_q": n_q, f"{y}_k": n_k}
    )
    return led


def rope_flops(n_q: int, n_k: int) -> int:
    """Nominal FLOPs: per pair two multiplies and an add for each output, 6 per pair = 3 per element."""
    return 3 * (n_q + n_k)


def rope_config(n_tok: int, head_dim: int, dtype: torch.dtype, gpu: bool | None = None) -> dict:
    """``{"BLOCK_T", "BLOCK_HALF", "num_warps"}``: a program rotates ``BLOCK_T`` tokens of one head.

    On a GPU about 2048 pairs a program (16 of Llama's 64-pair heads), 4 warps: 16 bytes per thread per
    load for 2-byte types. In the interpreter a program costs milliseconds of Python whatever its size,
    so it takes up to 16 Ki pairs."""
    gpu = runtime.is_gpu() if gpu is None else gpu
    block_half = max(1, next_pow2(head_dim // 2))
    pairs = 2048 if gpu else 16384
    block_t = max(1, min(next_pow2(max(n_tok, 1)), pairs // block_half))
    return {"BLOCK_T": block_t, "BLOCK_HALF": block_half, "num_warps": 4}


# -- kernels ------------------------------------------------------------------------------------------
@triton.jit
def _rotate_head(
    x_ptr, y_ptr, b, h, offs_t, out_t, j, mask, out_mask, c, s,
    stride_xb, stride_xh, stride_xn, stride_xd, stride_yb, stride_yh, stride_yn,
    HALF: tl.constexpr, INTERLEAVED: tl.constexpr, ROTATE: tl.constexpr,
):  # fmt: skip
    # reads rows offs_t of head h of x, writes rows out_t of head h of y (a cache's rows: the positions)
    if INTERLEAVED:  # pairs (2j, 2j + 1)
        d1 = 2 * j
        d2 = 2 * j + 1
    else:  # rotate-half: pairs (j, j + D/2)
        d1 = j
        d2 = j + HALF
    rows = x_ptr + b.to(tl.int64) * stride_xb + h.to(tl.int64) * stride_xh + offs_t.to(tl.int64)[:, None] * stride_xn
    x1 = tl.load(rows + d1[None, :] * stride_xd, mask=mask, other=0.0)
    x2 = tl.load(rows + d2[None, :] * stride_xd, mask=mask, other=0.0)
    out = y_ptr + b.to(tl.int64) * stride_yb + h.to(tl.int64) * stride_yh + out_t.to(tl.int64)[:, None] * stride_yn
    if ROTATE:
        x1 = x1.to(tl.float32)
        x2 = x2.to(tl.float32)
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
    else:  # v into its cache: a copy, bit for bit
        y1 = x1
        y2 = x2
    tl.store(out + d1[None, :], y1.to(y_ptr.dtype.element_ty), mask=out_mask)
    tl.store(out + d2[None, :], y2.to(y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, v_ptr, qo_ptr, ko_ptr, vo_ptr, cos_ptr, sin_ptr, off_ptr,
    offset, n_tok, n_heads_q, n_heads_k, n_pos, n_cache,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_qob, stride_qoh, stride_qon,
    stride_kob, stride_koh, stride_kon,
    stride_vob, stride_voh, stride_von,
    stride_cp, stride_cj, stride_sp, stride_sj,
    SIGN: tl.constexpr, HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr, HAS_OFFSETS: tl.constexpr, CACHE: tl.constexpr,
):  # fmt: skip
    # grid: (token tiles, B, H_q + H_k (+ H_k with CACHE)); a program rotates BLOCK_T tokens of one head
    # of q or of k (or, with CACHE, copies them of one head of v)
    pid_t = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.arange(0, BLOCK_HALF)
    mask = (offs_t < n_tok)[:, None] & (j < HALF)[None, :]
    if HAS_OFFSETS:  # each batch row's own start (its KV cache length)
        pos = tl.load(off_ptr + b).to(tl.int64) + offs_t
    else:  # an int (Triton may have made it a constant: no method calls on it)
        pos = (offs_t + offset).to(tl.int64)
    in_table = mask & ((pos >= 0) & (pos < n_pos))[:, None]
    # a position past the table (only reachable through an offsets tensor on a GPU) rotates by NaN
    c = tl.load(cos_ptr + pos[:, None] * stride_cp + j[None, :] * stride_cj, mask=in_table, other=float("nan"))
    s = tl.load(sin_ptr + pos[:, None] * stride_sp + j[None, :] * stride_sj, mask=in_table, other=float("nan"))
    c = c.to(tl.float32)
    s = s.to(tl.float32) * SIGN  # the backward rotates by -angle
    if CACHE:  # k and v land in the caches' rows at their positions; never past a cache's end
        kv_rows = pos
        kv_mask = mask & ((pos >= 0) & (pos < n_cache))[:, None]
    else:
        kv_rows = offs_t
        kv_mask = mask
    if h < n_heads_q:
        _rotate_head(q_ptr, qo_ptr, b, h, offs_t, offs_t, j, mask, mask, c, s,
                     stride_qb, stride_qh, stride_qn, stride_qd, stride_qob, stride_qoh, stride_qon,
                     HALF, INTERLEAVED, True)  # fmt: skip
    elif h < n_heads_q + n_heads_k:
        _rotate_head(k_ptr, ko_ptr, b, h - n_heads_q, offs_t, kv_rows, j, mask, kv_mask, c, s,
                     stride_kb, stride_kh, stride_kn, stride_kd, stride_kob, stride_koh, stride_kon,
                     HALF, INTERLEAVED, True)  # fmt: skip
    else:
        _rotate_head(v_ptr, vo_ptr, b, h - n_heads_q - n_heads_k, offs_t, kv_rows, j, mask, kv_mask, c, s,
                     stride_vb, stride_vh, stride_vn, stride_vd, stride_vob, stride_voh, stride_von,
                     HALF, INTERLEAVED, False)  # fmt: skip


# -- launchers ------------------------------------------------------------------------------------------
_launch = Launcher(_rope_kernel)


def _bhn(x: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """(stride_b, stride_h, stride_n, stride_d) of a 4-D tensor in ``layout``."""
    sb, s1, s2, sd = x.stride()
    return (sb, s1, s2, sd) if layout == "bhnd" else (sb, s2, s1, sd)


@functools.lru_cache(maxsize=1024)
def _plan(q_shape, k_shape, dtype, layout: str, interleaved: bool, has_offsets: bool, sign: int, cache: bool):
    """(grid, constexprs and launch options, output strides of q and k): derived once per shape. With
    ``cache`` the k and v outputs are caches the caller passes (their strides are theirs)."""
    h_dim, n_dim = LAYOUTS[layout]
    B, N, D = q_shape[0], q_shape[n_dim], q_shape[3]
    H_q, H_k = q_shape[h_dim], k_shape[h_dim]
    cfg = rope_config(N, D, dtype)

    def out_strides(shape):  # the output is contiguous in the input's own layout
        st = torch.empty(shape, device="meta").stride()
        return (st[0], st[h_dim], st[n_dim])

    meta = dict(SIGN=sign, HALF=D // 2, BLOCK_T=cfg["BLOCK_T"], BLOCK_HALF=cfg["BLOCK_HALF"],
                INTERLEAVED=interleaved, HAS_OFFSETS=has_offsets, CACHE=cache,
                **launch_kwargs(cfg["num_warps"]))  # fmt: skip
    grid = (cdiv(N, cfg["BLOCK_T"]), B, H_q + H_k * (2 if cache else 1))
    return grid, meta, out_strides(q_shape) + out_strides(k_shape)


def _parts(q, k, cos, sin, offset, layout, interleaved, sign, v, ko, vo, cache):
    """``(grid, constexprs and launch options, v as the kernel reads it, the offsets' pointer, the
    arguments from the int offset on, the launcher's key)`` of a launch writing k into ``ko`` and v into
    ``vo`` (without ``cache``: ``vo`` is ``ko`` and v is not read)."""
    has_offsets = isinstance(offset, torch.Tensor)
    grid, meta, o_strides = _plan(q.shape, k.shape, q.dtype, layout, interleaved, has_offsets, sign, cache)
    off_ptr = offset if has_offsets else cos  # an unused pointer when the offset is an int
    off_int = 0 if has_offsets else offset
    if cache:  # the caches are (B, H_kv, N_max, D): their own (b, h, n) strides
        kv_out = (*ko.stride()[:3], *vo.stride()[:3])
        v_in, n_cache = _bhn(v, layout), ko.shape[2]
    else:  # no v: its pointers and strides are k's, never used
        kv_out = o_strides[3:] + o_strides[3:]
        v, v_in, n_cache = k, _bhn(k, layout), 0
    # everything Triton specialises this launch on, cheaper than the launcher working it out from 47
    # arguments: the plan's inputs, the strides (the ints), the dtypes, the inputs' 16-byte alignment
    # (fresh outputs come from the caching allocator, always aligned) and the int offset's 1 / 16 classes
    key = (q.shape, q.stride(), k.shape, k.stride(), cos.shape, cos.stride(), sin.stride(), q.dtype, cos.dtype,
           sin.dtype, off_ptr.dtype, layout, interleaved, sign, off_int == 1, off_int & 15, off_int >= 2**31,
           q.data_ptr() & 15, k.data_ptr() & 15, cos.data_ptr() & 15, sin.data_ptr() & 15, off_ptr.data_ptr() & 15,
           cache, v.stride(), kv_out, n_cache, v.data_ptr() & 15, vo.data_ptr() & 15, ko.data_ptr() & 15)  # fmt: skip
    ints = (off_int, q.shape[LAYOUTS[layout][1]], q.shape[LAYOUTS[layout][0]], k.shape[LAYOUTS[layout][0]],
            cos.shape[0], n_cache, *_bhn(q, layout), *_bhn(k, layout), *v_in, *o_strides[:3], *kv_out,
            *cos.stride(), *sin.stride())  # fmt: skip
    return grid, meta, v, off_ptr, ints, key


def _apply(q, k, cos, sin, offset, layout, interleaved, sign, v=None, k_cache=None, v_cache=None):
    """Rotate q and k by ``sign`` times their angles: one launch. Without caches: two fresh outputs. With
    them (decoding): k rotated into ``k_cache`` and v copied into ``v_cache`` at their positions; returns
    q rotated and the caches."""
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    cache = k_cache is not None
    ko = k_cache if cache else torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if qo.numel() + k.numel() == 0:
        return qo, ko
    vo = v_cache if cache else ko
    grid, meta, v, off_ptr, ints, key = _parts(q, k, cos, sin, offset, layout, interleaved, sign, v, ko, vo, cache)
    _launch.launch(grid, (q, k, v, qo, ko, vo, cos, sin, off_ptr, *ints), meta, key)
    return qo, ko


class RoPEFunction(torch.autograd.Function):
    """Forward: q and k rotated by their positions' angles. Backward: dq and dk rotated back (the same
    kernel, sine negated); nothing saved but the tables and offsets it was given."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, offset, layout, interleaved):
        qo, ko = _apply(q, k, cos, sin, offset, layout, interleaved, 1)
        if isinstance(offset, torch.Tensor):
            ctx.save_for_backward(cos, sin, offset)
        else:
            ctx.save_for_backward(cos, sin)
        ctx.offset = None if isinstance(offset, torch.Tensor) else offset  # a tensor goes through save_for_backward
        ctx.layout, ctx.interleaved = layout, interleaved
        ctx.dtypes = (q.dtype, k.dtype)
        return qo, ko

    @staticmethod
    def backward(ctx, dqo, dko):
        saved = ctx.saved_tensors
        cos, sin = saved[0], saved[1]
        offset = saved[2] if len(saved) == 3 else ctx.offset
        # autograd's gradients: a negated view resolved; any strides are read in place (the kernel takes
        # a stride on the last dimension too)
        dqo = upstream_grad(dqo, ctx.dtypes[0], unit_last=False)
        dko = upstream_grad(dko, ctx.dtypes[1], unit_last=False)
        dq, dk = _apply(dqo, dko, cos, sin, offset, ctx.layout, ctx.interleaved, -1)
        return dq, dk, None, None, None, None, None


def _check(q, k, cos, sin, offset, layout, interleaved, grad: bool) -> int | None:
    """Refuse what the kernel cannot take. Returns the largest offset where it was read (an int, or a
    tensor in host memory), else None: :func:`rope_cache_write` checks its cache against it without
    reading the offsets again."""
    check_choice(layout, tuple(LAYOUTS), "layout", op=OP)
    if not isinstance(interleaved, bool):
        raise KernelInputError(f"{OP}: interleaved must be True or False, got {interleaved!r}.")
    for name, t in (("q", q), ("k", k)):
        check_tensor(t, name, op=OP, ndim=4, contiguous=False, grad=grad, max_numel=None)
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(t, name, op=OP, ndim=2, contiguous=False, max_numel=None)
    if q.dtype != k.dtype:
        raise KernelInputError(f"{OP}: q and k must share a dtype, got {q.dtype} and {k.dtype}.")
    h_dim, n_dim = LAYOUTS[layout]
    B, N, D = q.shape[0], q.shape[n_dim], q.shape[3]
    names = "(B, H, N, D)" if layout == "bhnd" else "(B, N, H, D)"
    if k.shape[0] != B or k.shape[n_dim] != N or k.shape[3] != D:
        raise KernelInputError(
            f"{OP}: q is {tuple(q.shape)} and k is {tuple(k.shape)}; in layout {layout!r} both are {names} "
            "with the same B, N and D (the head counts may differ)."
        )
    if D % 2:
        raise KernelInputError(f"{OP}: the head dim must be even (features rotate in pairs), got {D}.")
    if cos.shape != sin.shape or cos.shape[1] != D // 2:
        raise KernelInputError(
            f"{OP}: cos and sin must both be (P, D/2) = (P, {D // 2}), got {tuple(cos.shape)} and {tuple(sin.shape)}."
        )
    if B > 65535 or q.shape[h_dim] + k.shape[h_dim] > 65535:
        raise KernelInputError(f"{OP}: B={B} and H_q + H_k must each be at most 65535 (the grid's limit).")
    n_pos = cos.shape[0]
    if isinstance(offset, torch.Tensor):
        if offset.dtype not in _OFFSET_DTYPES or offset.shape != (B,) or offset.device != q.device:
            raise KernelInputError(
                f"{OP}: offset as a tensor must be int32 or int64 of shape (B,) = ({B},) on {q.device}, got "
                f"{offset.dtype} of shape {tuple(offset.shape)} on {offset.device}."
            )
        if not offset.is_contiguous():
            raise KernelInputError(f"{OP}: offset must be contiguous. Pass offset.contiguous().")
        if not _reads_offsets(offset, B, N):
            return None  # reading the offsets back would sync: out-of-table rows give NaN (module docstring)
        lo, hi = host_range(offset)
    elif isinstance(offset, int) and not isinstance(offset, bool):
        lo = hi = offset
    else:
        raise KernelInputError(f"{OP}: offset must be an int or an integer tensor of shape (B,), got {offset!r}.")
    return _check_positions(lo, hi, N, n_pos)


def _reads_offsets(offset: torch.Tensor, B: int, N: int) -> bool:
    """Whether the checks read a tensor of offsets' values: in host memory and with tokens to place (a
    GPU's would sync)."""
    return not (offset.is_cuda or N == 0 or B == 0)


def _check_positions(lo: int, hi: int, N: int, n_pos: int) -> int:
    """Positions ``lo .. hi + N - 1`` must lie in the tables' ``n_pos`` rows; returns ``hi``."""
    if N and (lo < 0 or hi + N > n_pos):
        raise KernelInputError(
            f"{OP}: positions {lo}..{hi + N - 1} are outside the tables' {n_pos} rows (cos and sin are "
            "(P, D/2)); build longer tables."
        )
    return hi


def _check_cache_room(hi: int | None, N: int, n_max: int) -> None:
    """The cache write's positions up to ``hi + N - 1`` must fit a cache of ``n_max`` (``hi``: the largest
    length where it was read, None where it was not)."""
    if hi is not None and N and hi + N > n_max:
        raise KernelInputError(f"{OP}: positions up to {hi + N - 1} do not fit a cache of N_max={n_max}.")


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    offset: int | torch.Tensor = 0,
    layout: str = "bhnd",
    interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated by their positions (RoPE), in one launch; differentiable in q and k.

    ``q``: (B, H_q, N, D) and ``k``: (B, H_k, N, D) with ``layout="bhnd"``, or (B, N, H, D) each with
    ``layout="bnhd"`` (the QKV projection's output viewed by heads: no transpose needed); any strides,
    fp32/fp16/bf16 (fp32/fp16 in the interpreter). ``cos``, ``sin``: (P, D/2) tables
    (:func:`rope_tables`). ``offset``: the position of token 0, an int or an int32/int64 tensor (B,) —
    each row's KV-cache length when decoding. ``interleaved``: pairs (2j, 2j+1) (GPT-J) instead of
    Llama's rotate-half (j, j + D/2). Returns new tensors, contiguous in q's and k's layout. Reference:
    :func:`rope_reference`; eager: :func:`rope_eager`.
    """
    grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k))
    _check(q, k, cos, sin, offset, layout, interleaved, grad)
    if grad:
        return RoPEFunction.apply(q, k, cos, sin, offset, layout, interleaved)
    return _apply(q, k, cos, sin, offset, layout, interleaved, 1)


def rope_cache_write_reference(q, k, v, cos, sin, k_cache, v_cache, cache_len, layout: str = "bnhd",
                               interleaved: bool = False):  # fmt: skip
    """The spec of :func:`rope_cache_write`, on copies: ``(q rotated, k_cache, v_cache)`` with row b's
    rotated k and its v written at positions ``cache_len[b] + n`` (a position past the cache dropped)."""
    qo, ko = rope_reference(q, k, cos, sin, cache_len, layout, interleaved)
    kc, vc = k_cache.clone(), v_cache.clone()
    if layout == "bhnd":
        ko, v = ko.transpose(1, 2), v.transpose(1, 2)
    B, N = k.shape[0], ko.shape[1]
    pos = _positions(cache_len, B, N, k.device)
    keep = pos < kc.shape[2]
    rows = torch.arange(B, device=k.device)[:, None].expand(B, N)
    kc.transpose(1, 2)[rows[keep], pos[keep]] = ko[keep].to(kc.dtype)
    vc.transpose(1, 2)[rows[keep], pos[keep]] = v[keep].to(vc.dtype)
    return qo, kc, vc


def rope_cache_write(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_len: int | torch.Tensor,
    layout: str = "bnhd",
    interleaved: bool = False,
) -> torch.Tensor:
    """Decoding's RoPE with the KV-cache write fused in: one launch rotates q (returned, a new tensor),
    rotates k into ``k_cache`` and copies v into ``v_cache`` (in place), row b's tokens at positions
    ``cache_len[b] + n`` — where eager runs RoPE's kernels and then two indexed copies.

    ``q``, ``k``, ``v``: the new tokens, as :func:`rope` takes them (``v`` shaped like k). ``k_cache``,
    ``v_cache``: (B, H_kv, N_max, D), q's dtype, the last dimension contiguous, no two elements sharing
    memory (a (B, N_max, H_kv, D) cache transposed is written in place). ``cache_len``: an int or an
    int32/int64 tensor (B,), each row's length before this step (the caller advances it). A position
    past N_max is refused where that is free (an int, or the interpreter); on a GPU such a token is not
    written (the kernel masks it). Not differentiable (decoding). Reference:
    :func:`rope_cache_write_reference`.
    """
    key = device = None
    if type(layout) is str and type(interleaved) is bool and isinstance(cache_len, torch.Tensor):
        sig = signature(q, k, v, cos, sin, k_cache, v_cache, cache_len)
        if sig is not None:
            key, device = (sig, layout, interleaved), sig[1]
            kept = _PLANS.get(key)
            if kept is not None:  # a call of this signature passed every check but those of the lengths' values
                return _cache_write_kept(kept, q, k, v, cos, sin, k_cache, v_cache, cache_len, device)
    hi = _check(q, k, cos, sin, cache_len, layout, interleaved, False)
    check_tensor(v, "v", op=OP, ndim=4, contiguous=False, grad=False, max_numel=None)
    if v.shape != k.shape or v.dtype != k.dtype:
        raise KernelInputError(f"{OP}: v must be shaped like k ({tuple(k.shape)}, {k.dtype}), got {tuple(v.shape)}.")
    h_dim, n_dim = LAYOUTS[layout]
    B, N, H_k, D = k.shape[0], k.shape[n_dim], k.shape[h_dim], k.shape[3]
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(c, name, op=OP, ndim=4, contiguous=False, max_numel=None)
        check_writable(c, name, op=OP)
        if c.dtype != k.dtype or c.shape[0] != B or c.shape[1] != H_k or c.shape[3] != D:
            raise KernelInputError(
                f"{OP}: {name} must be (B, H_kv, N_max, D) = ({B}, {H_k}, N_max, {D}) in {k.dtype}, got "
                f"{tuple(c.shape)} in {c.dtype}."
            )
    if k_cache.shape != v_cache.shape:
        raise KernelInputError(f"{OP}: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ.")
    n_max = k_cache.shape[2]
    # hi: the largest length, as _check read it (None on a GPU: reading it back would sync)
    _check_cache_room(hi, N, n_max)
    if key is not None:
        _PLANS.put(key, _cache_write_plan(q, k, v, cos, sin, k_cache, v_cache, cache_len, layout, interleaved))
    qo, _ = _apply(q, k, cos, sin, cache_len, layout, interleaved, 1, v, k_cache, v_cache)
    return qo


def _cache_write_plan(q, k, v, cos, sin, k_cache, v_cache, cache_len, layout, interleaved) -> tuple:
    """What a checked cache write with a tensor of lengths launches with again for a call of the same
    signature: q's shape (a plain tuple), dtype and device; whether the lengths' values are checked
    (:func:`_reads_offsets`) with the token count, table rows and cache length they are checked against;
    and, unless there is nothing to write, the grid, constexprs, int arguments and interned key."""
    n_dim = LAYOUTS[layout][1]
    B, N = q.shape[0], q.shape[n_dim]
    head = (tuple(q.shape), q.dtype, q.device, _reads_offsets(cache_len, B, N), N, cos.shape[0], k_cache.shape[2])
    if q.numel() + k.numel() == 0:
        return (*head, None, None, None, None)
    grid, meta, _, _, ints, key = _parts(q, k, cos, sin, cache_len, layout, interleaved, 1, v, k_cache, v_cache, True)
    return (*head, grid, meta, ints, _launch.intern(key))


def _cache_write_kept(kept, q, k, v, cos, sin, k_cache, v_cache, cache_len, device):
    """:func:`rope_cache_write` for a call of a kept signature: the lengths' values checked where they are
    read (the only checks a kept signature does not settle), then the launch."""
    shape, dtype, dev, reads, N, n_pos, n_max, grid, meta, ints, key = kept
    if reads:
        lo, hi = host_range(cache_len)
        _check_cache_room(_check_positions(lo, hi, N, n_pos), N, n_max)
    qo = torch.empty(size=shape, dtype=dtype, device=dev)
    if grid is not None:
        _launch.launch(grid, (q, k, v, qo, k_cache, v_cache, cos, sin, cache_len, *ints), meta, key, device)
    return qo


#: rope_cache_write's plans by call signature (a decode step writes the cache with the same signature at
#: every token; benchmarks/notes_lesson9.md, 2026-11-27, plans by signature)
_PLANS = Plans()
