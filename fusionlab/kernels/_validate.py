"""Input checks shared by every launcher: bad input gets a clear error, never a wrong answer.

Triton kernels index raw pointers, so a tensor on the wrong device, of the wrong dtype, or with
strides the kernel does not expect would be read as garbage (and the interpreter never fires
``tl.device_assert``). The launcher checks on the host, before the launch.
"""

from __future__ import annotations

import torch

from .. import runtime


class KernelInputError(ValueError):
    """A launcher was given a tensor its kernel cannot take."""


def _dtype_name(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def check_tensor(x, name: str, *, op: str, dtypes=None, ndim=None, device=None) -> torch.Tensor:
    """Validate one kernel argument and return it unchanged."""
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}.")
    want = torch.device(device) if device is not None else runtime.DEVICE
    if x.device.type != want.type:
        raise KernelInputError(
            f"{op}: {name} is on {x.device}, but in {runtime.MODE} mode the kernels run on {want}. "
            f"Move it with {name}.to(fusionlab.runtime.DEVICE)."
        )
    dtypes = tuple(dtypes) if dtypes is not None else runtime.DTYPES
    if x.dtype not in dtypes:
        hint = " (Triton's interpreter does not support bfloat16)" if x.dtype == torch.bfloat16 else ""
        raise KernelInputError(
            f"{op}: {name} has dtype {_dtype_name(x.dtype)}; supported here: "
            f"{', '.join(map(_dtype_name, dtypes))}{hint}."
        )
    if ndim is not None and x.dim() not in ((ndim,) if isinstance(ndim, int) else tuple(ndim)):
        raise KernelInputError(f"{op}: {name} must have {ndim} dimension(s), got shape {tuple(x.shape)}.")
    if not x.is_contiguous():
        raise KernelInputError(
            f"{op}: {name} is not contiguous (strides {x.stride()} for shape {tuple(x.shape)}); the kernel "
            f"walks memory in order. Pass {name}.contiguous()."
        )
    if x.numel() >= 2**31:
        raise KernelInputError(
            f"{op}: {name} has {x.numel()} elements; the kernel's int32 offsets take fewer than 2**31."
        )
    return x


def check_same(a: torch.Tensor, b: torch.Tensor, names: str, *, op: str, shape: bool = True) -> None:
    if a.dtype != b.dtype:
        raise KernelInputError(
            f"{op}: {names} must share a dtype, got {_dtype_name(a.dtype)} and {_dtype_name(b.dtype)}."
        )
    if shape and a.shape != b.shape:
        raise KernelInputError(f"{op}: {names} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}.")
