"""Lesson 9's layer: what its forward keeps for the backward, and the most its backward holds at once.

Counted on whatever device runs the tests (on the CPU the interpreter runs the kernels): every tensor
the layer's autograd saves (``saved_tensors_hooks``), and every tensor any op allocates while forward
and backward run (a ``TorchDispatchMode`` that counts each new storage until it is freed). A GPU's peak
(``torch.cuda.max_memory_allocated``, ``benchmarks/bench_layer.py``) is the same count in the
caching allocator's blocks.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from fusionlab import runtime
from fusionlab.model import LlamaLayer, LlamaLayerReference, llama_layer_saved

# the 8B layer's proportions: QKV 1.5 x hidden wide (H_kv = H / 4), FFN 3.5 x hidden
CFG = dict(hidden=64, n_heads=4, n_kv_heads=1, ffn=224, max_positions=128)
B, N = 2, 64

DEV = runtime.DEVICE
DTYPE = torch.bfloat16 if runtime.is_gpu() else torch.float32  # attention takes 16-bit inputs on a GPU


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages ops allocate while the mode is on, as they are freed: ``peak`` is the most
    alive at once. A storage an op returns that one of its inputs has (a view, an in-place op) is not
    new. The interpreter's launches leave reference cycles that hold tensors until the collector runs (a
    GPU launch leaves none): before a count would set a new peak, the collector runs first."""

    def __init__(self):
        super().__init__()
        self.live, self.now, self.peak = {}, 0, 0

    def _free(self, key):
        self.now -= self.live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        old = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key, n = st._cdata, st.nbytes()
            if key in self.live or key in old or n == 0:
                continue
            if self.now + n > self.peak:
                gc.collect()
            self.live[key] = n
            self.now += n
            self.peak = max(self.peak, self.now)
            weakref.finalize(st, self._free, key)
        return out


def _layers(seed=0):
    torch.manual_seed(seed)
    ref = LlamaLayerReference(**CFG)
    lay = LlamaLayer(**CFG).load_reference_state_dict(ref.state_dict())
    return ref.to(DEV, DTYPE), lay.to(DEV, DTYPE)


def _saved_bytes(module, x):
    """Bytes of the distinct storages the forward saves for the backward, the module's own parameters
    and buffers (and views of them) left out."""
    own = {t.untyped_storage()._cdata for t in (*module.parameters(), *module.buffers())}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st._cdata not in own:
            seen[st._cdata] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = module(x)
    return sum(seen.values()), y


def test_the_forward_saves_what_the_ledger_lists():
    ref, lay = _layers()
    x = torch.randn(B, N, CFG["hidden"], device=DEV, dtype=DTYPE, requires_grad=True)
    got, _ = _saved_bytes(lay, x)
    want = llama_layer_saved(B, N, **CFG, dtype=x.dtype)
    assert got == sum(want.values()), (got, want)
    eager, _ = _saved_bytes(ref, x)
    assert got < 0.75 * eager  # eager keeps both norms' outputs, silu(g), silu(g) u, RoPE's halves


def _peak(module, x, dy):
    xg = x.clone().requires_grad_()
    mode = LiveBytes()
    gc.collect()
    gc.freeze()  # what lives now is not garbage: the collections in the mode skip it
    try:
        with mode:
            module(xg).backward(dy)
            del xg
    finally:
        gc.unfreeze()
    return mode.peak


def test_backward_peak_is_the_saved_tensors_and_a_few_activations():
    """The peak of forward + backward: the saved tensors, the weights' gradients, the output, and at
    most one (tokens x FFN) and three (tokens x hidden) tensors more. SwiGLU's backward writing dg and
    du into fresh tensors and concatenating them (four (tokens x FFN) tensors more) fails it."""
    ref, lay = _layers()
    x = torch.randn(B, N, CFG["hidden"], device=DEV, dtype=DTYPE)
    dy = torch.randn_like(x)
    _peak(lay, x, dy)  # the first call compiles nothing on the CPU, but warms the launchers' caches
    got = _peak(lay, x, dy)
    es, T = x.element_size(), B * N
    saved = sum(llama_layer_saved(B, N, **CFG, dtype=x.dtype).values())
    grads = sum(p.numel() for p in lay.parameters()) * es
    bound = saved + grads + T * (CFG["ffn"] + 4 * CFG["hidden"]) * es
    eager = _peak(ref, x, dy)
    assert got <= bound, (got, bound, eager)
    assert got < 0.7 * eager, (got, eager)


def test_a_second_backward_through_the_graph_is_refused():
    """The MLP's backward writes gu's gradient over gu: a second backward would read gradients as
    activations, so autograd's version check refuses it."""
    _, lay = _layers()
    x = torch.randn(B, 8, CFG["hidden"], device=DEV, dtype=DTYPE, requires_grad=True)
    y = lay(x).sum()
    y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified inplace|modified by an inplace operation"):
        y.backward()
