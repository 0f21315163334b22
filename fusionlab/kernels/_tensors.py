"""What every launcher and every backward does to a tensor before a kernel reads or writes its memory.

A Triton kernel sees a pointer and the strides it is given, nothing else. Three things torch keeps
*outside* the memory would then be silently lost, so they are settled here, once, for every op:

- **a lazily negated or conjugated view** (``torch._neg_view``, ``.conj()`` of a complex tensor): the
  sign is a flag, the memory holds the values before the flip. A forward input is refused by
  :func:`fusionlab.kernels._launch.check_tensor` (the learner made it and can resolve it); a gradient
  handed over by autograd is resolved by :func:`upstream_grad` (autograd makes such views itself, e.g.
  the backward of ``-y``, and the learner never sees them). ``.conj()`` of a real tensor is the tensor.
- **overlapping layouts** (``expand``: stride 0; ``as_strided`` with rows that share memory): fine to
  read, never to write. Launchers allocate outputs and gradients fresh and contiguous
  (``torch.empty(shape)``, never ``empty_strided`` with an input's strides); one that wants an input's
  row stride takes :func:`output_like` (those strides only where they do not overlap), and an op that
  writes over an input refuses an overlapping one (:func:`check_writable`).
- **layouts a kernel cannot walk** (a gradient transposed, or with a stride on its last dimension):
  copied to a contiguous tensor by :func:`upstream_grad` — one copy, on an unusual path only.

Cross-entropy's targets are checked here too (:func:`check_targets`). Everything but that check is
attribute reads on the common path (a contiguous tensor with no flags): a launcher is on the hot path
of small tensors, where host time per call is the whole cost. ``tests/test_entry_points.py`` runs every
public entry point and every backward through each of these layouts.
"""

from __future__ import annotations

import torch

from ._launch import KernelInputError


def resolved(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a lazily negated or conjugated view made real (a copy only when it is one)."""
    if t.is_neg() or t.is_conj():
        return t.resolve_neg().resolve_conj()
    return t


def overlaps(t: torch.Tensor) -> bool:
    """Whether two different indices of ``t`` may name one memory location: a stride 0 (``expand``)
    over a dimension of more than one element, or strides that interleave (``as_strided``). Exact for
    every layout torch's views make: sorted by stride, each dimension must step past the whole extent
    of the ones below it. A contiguous tensor answers at once (the common case costs one call)."""
    if t.is_contiguous():
        return False
    dims = sorted((t.stride(i), t.shape[i]) for i in range(t.dim()) if t.shape[i] > 1)
    extent = 1  # elements spanned by the dimensions seen so far
    for stride, size in dims:
        if stride < extent:
            return True
        extent = stride * (size - 1) + extent
    return False


def output_like(t: torch.Tensor) -> torch.Tensor:
    """An output with ``t``'s strides, so both split rows at the same 16-byte boundaries — unless ``t``'s
    elements overlap (an expanded tensor: every row would write one row), then contiguous."""
    if overlaps(t):
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def check_writable(t: torch.Tensor, name: str, *, op: str) -> torch.Tensor:
    """Refuse to write a kernel's output over ``t`` when its elements share memory."""
    if overlaps(t):
        raise KernelInputError(
            f"{op}: {name} has elements that share memory (shape {tuple(t.shape)}, strides {t.stride()}, "
            f"e.g. from expand()), so it cannot be written in place. Pass {name}.contiguous()."
        )
    return t


def upstream_grad(g: torch.Tensor, dtype: torch.dtype, *, unit_last: bool = True) -> torch.Tensor:
    """A gradient autograd hands to a backward, as a kernel can read it: in ``dtype`` (the output's),
    a negated or conjugated view made real, and — with ``unit_last`` — copied to a contiguous tensor
    when its last dimension is not contiguous (a transposed view). A stride-0 (expanded) gradient with
    a contiguous last dimension is kept: reading it is safe, and a kernel may use the stride 0
    (cross-entropy's shared grad_output). Autograd has already checked its shape and device. A
    backward runs this on every call: attribute reads only, a copy only for those layouts."""
    if g.dtype != dtype:
        g = g.to(dtype)
    if g.is_neg() or g.is_conj():
        g = g.resolve_neg().resolve_conj()
    if unit_last and g.dim() and g.stride(-1) != 1 and g.shape[-1] > 1:
        g = g.contiguous()
    return g


class TargetOutOfRange(KernelInputError, IndexError):
    """A class index outside ``[0, V)`` that is not ``ignore_index`` (an ``IndexError`` too, as torch's
    own ``F.cross_entropy`` raises on the CPU)."""


def check_targets(target: torch.Tensor, n_classes: int, ignore_index: int, *, op: str, check: bool | None) -> None:
    """Refuse a target outside ``[0, n_classes)`` that is not ``ignore_index``.

    ``check=None`` checks where it is free: in the interpreter the targets are in host memory and are
    read there (with numpy: a host read, no torch op and no launch, so a fused call still counts as its
    kernels alone). On a GPU a verdict needs the device's answer back on the host — a sync that would
    stall every call's queue — so ``None`` leaves it to the kernel, which gives such a row a NaN loss
    and a NaN gradient (it never reads out of bounds); ``check=True`` pays the sync there too, and
    ``check=False`` skips the check everywhere (NaN rows)."""
    if check is None:
        check = not target.is_cuda
    elif not isinstance(check, bool):
        raise KernelInputError(f"{op}: check_target must be True, False or None, got {check!r}.")
    if not check or target.numel() == 0:
        return
    if target.is_cuda:
        bad = ((target < 0) | (target >= n_classes)) & (target != ignore_index)
        if not bool(bad.any()):  # the one host sync, asked for
            return
        t = target.cpu().numpy()
    else:
        t = target.numpy()
    bad = ((t < 0) | (t >= n_classes)) & (t != ignore_index)
    if bad.any():
        i = int(bad.argmax())
        raise TargetOutOfRange(
            f"{op}: target[{i}] = {int(t[i])} is out of range for {n_classes} classes: a class index is in "
            f"[0, {n_classes - 1}], or ignore_index={ignore_index} for a row to skip. (check_target=False "
            "gives such rows a NaN loss instead.)"
        )


__all__ = [
    "TargetOutOfRange",
    "check_targets",
    "check_writable",
    "output_like",
    "overlaps",
    "resolved",
    "upstream_grad",
]
