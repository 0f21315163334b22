"""The interpreter's trip count (fusionlab.measure.interpreter) against every ledger of lessons 1-5.

Each case counts the bytes every tl.load and tl.store of the fused kernels touches, tensor by tensor,
and asks for the ledger's fused schedule exactly. Where a kernel makes a logical load the ledger does
not count (a second load of bytes already on chip, or bookkeeping the ledger leaves out and says so),
the case names the extra bytes and why: an unexplained difference fails.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from fusionlab import _triton, runtime
from fusionlab.kernels.bias_gelu import bias_gelu, bias_gelu_ledger
from fusionlab.kernels.chain import chain, chain_ledger
from fusionlab.kernels.cos import cos, cos_cos, cos_cos_ledger
from fusionlab.kernels.cross_entropy import cross_entropy, cross_entropy_ledger
from fusionlab.kernels.fma_chain import fma_chain, fma_chain_ledger
from fusionlab.kernels.layernorm import layernorm, layernorm_ledger
from fusionlab.kernels.matmul import matmul, matmul_config, matmul_ledger
from fusionlab.kernels.rmsnorm import rmsnorm, rmsnorm_ledger
from fusionlab.kernels.softmax import softmax, softmax_ledger
from fusionlab.kernels.swiglu import swiglu, swiglu_ledger
from fusionlab.ledger import READ, WRITE, Ledger
from fusionlab.measure.compare import against_ledger
from fusionlab.measure.interpreter import UNKNOWN, InterpreterTrips, interpreter_trips

pytestmark = pytest.mark.skipif(runtime.is_gpu(), reason="counts Triton's interpreter; a GPU runs compiled kernels")

F32 = torch.float32
R, N = 64, 256  # rows x columns of the row-wise kernels: one tile a row, several rows a program


def _grad(fwd, inputs):
    """A thunk that runs the backward of ``fwd`` alone (the forward runs now, outside the count)."""
    out = fwd()
    outs = out if isinstance(out, tuple) else (out,)
    grads = [torch.randn_like(o) for o in outs]
    return lambda: torch.autograd.grad(outs, inputs, grads)


def _merge(d: dict, names, into: str) -> dict:
    """Add the trips of several ledger tensors into one (a kernel that writes two results into one buffer)."""
    out = {}
    for (t, direction), n in d.items():
        key = (into if t in names else t, direction)
        out[key] = out.get(key, 0) + n
    return out


def _cases():
    torch.manual_seed(0)
    n = 10_000  # not a multiple of the block: the last program's masked lanes must not count
    x = torch.randn(n)
    xb, bias = torch.randn(37, 129), torch.randn(129)
    xr, res, w, b = (
        torch.randn(R, N, requires_grad=True),
        torch.randn(R, N, requires_grad=True),
        torch.randn(N, requires_grad=True),
        torch.randn(N, requires_grad=True),
    )
    g, u = torch.randn(R, N, requires_grad=True), torch.randn(R, N, requires_grad=True)
    wide = torch.randn(4, 20_000)  # past the interpreter's one-tile width: read twice
    logits, target = torch.randn(16, 1000, requires_grad=True), torch.randint(0, 1000, (16,))
    T = 16
    a, bm = torch.randn(96, 64), torch.randn(64, 80)
    mm = matmul_config(96, 80, 64, F32)
    assert mm["BLOCK_M"] < 96 and mm["BLOCK_N"] < 80  # several tiles each way: the re-reads show
    shift = {("x", READ): R * 4}  # layernorm loads x[row, 0], its shift, besides the row (same cache line)
    no_grad = torch.no_grad
    # (id, thunk, ledger, kernel parameter -> ledger name, ledger tensors one buffer holds, extra bytes)
    return [
        ("l1 cos", lambda: cos(x), Ledger.chain(["cos"], n), {}, None, {}),
        ("l1 cos_cos", lambda: cos_cos(x), cos_cos_ledger(n), {}, None, {}),
        ("l1 cos_cos precise", lambda: cos_cos(x, second="precise"), cos_cos_ledger(n), {}, None, {}),
        ("l2 bias_gelu", lambda: bias_gelu(xb, bias), bias_gelu_ledger(37, 129, F32), {}, None, {}),
        ("l2 chain k=4", lambda: chain(x, 4), chain_ledger(4, n), {}, None, {}),
        ("l2 fma_chain", lambda: fma_chain(x, 16), fma_chain_ledger(n), {}, None, {}),
        (
            "l4 rmsnorm",
            lambda: rmsnorm(xr.detach(), w.detach()),
            rmsnorm_ledger(R, N, F32, residual=False),
            {},
            None,
            {},
        ),
        (
            "l4 residual rmsnorm",
            lambda: rmsnorm(xr.detach(), w.detach(), residual=res.detach()),
            rmsnorm_ledger(R, N, F32),
            {},
            None,
            {},
        ),
        (
            "l4 residual rmsnorm, training",
            lambda: rmsnorm(xr, w, residual=res),
            rmsnorm_ledger(R, N, F32, stats=True),
            {},
            None,
            {},
        ),
        (
            "l4 rmsnorm backward",
            _grad(lambda: rmsnorm(xr, w), (xr, w)),
            rmsnorm_ledger(R, N, F32, residual=False, backward=True, programs=1),
            {"h_ptr": "x", "dwp_ptr": "dw_partial", "part_ptr": "dw_partial", "out_ptr": "dw"},
            None,
            {},
        ),
        (
            "l4 residual rmsnorm backward",
            _grad(lambda: rmsnorm(xr, w, residual=res), (xr, res, w)),
            rmsnorm_ledger(R, N, F32, backward=True, programs=1),
            {"dh_ptr": "grad_h", "dwp_ptr": "dw_partial", "part_ptr": "dw_partial", "out_ptr": "dw"},
            None,
            {},
        ),
        ("l4 layernorm", lambda: no_grad()(layernorm)(xr, w, b), layernorm_ledger(R, N, F32), {}, None, shift),
        (
            "l4 layernorm, training",
            lambda: layernorm(xr, w, b),
            layernorm_ledger(R, N, F32, stats=True),
            {"dmean_ptr": "mean"},
            None,
            shift,
        ),
        (
            "l4 layernorm backward",
            _grad(lambda: layernorm(xr, w, b), (xr, w, b)),
            layernorm_ledger(R, N, F32, backward=True, programs=1),
            {"dmean_ptr": "mean", "part_ptr": "dwb_partial", "out_ptr": "dw+db"},
            ("dw", "db"),
            shift,
        ),
        ("l4 softmax", lambda: softmax(xr.detach()), softmax_ledger(R, N, F32), {}, None, {}),
        ("l4 softmax, wide rows read twice", lambda: softmax(wide), softmax_ledger(4, 20_000, F32), {}, None, {}),
        (
            "l4 softmax backward",
            _grad(lambda: softmax(xr), (xr,)),
            softmax_ledger(R, N, F32, backward=True),
            {},
            None,
            {},
        ),
        ("l5 swiglu", lambda: swiglu(g.detach(), u.detach()), swiglu_ledger(R * N, F32), {}, None, {}),
        (
            "l5 swiglu backward",
            _grad(lambda: swiglu(g, u), (g, u)),
            swiglu_ledger(R * N, F32, backward=True),
            {},
            None,
            {},
        ),
        # lesson 6, past the bar: the matmul's tile re-reads, A once per column of tiles, B once per row
        (
            "l6 matmul, tile re-reads",
            lambda: matmul(a, bm),
            matmul_ledger(96, 80, 64, mm["BLOCK_M"], mm["BLOCK_N"], F32),
            {"a_ptr": "A", "b_ptr": "B", "c_ptr": "C"},
            None,
            {},
        ),
        # the ledger leaves out the loss's bookkeeping and says so (cross_entropy_ledger's docstring): a
        # prologue reads the targets again to count the rows (and writes that count, read by every row and
        # the finish), each row writes its loss for the finish to sum, and the backward reads the incoming
        # scalar gradient once per row; each row also loads and rewrites its target's logit (x[y]) alone
        (
            "l5 cross_entropy forward + backward",
            lambda: cross_entropy(logits, target).backward(),
            cross_entropy_ledger(T, 1000, F32),
            {"x_ptr": "logits", "grad_ptr": "grad_logits", "target_ptr": "target", "out_ptr": "loss"},
            None,
            {
                ("target", READ): T * 8,
                ("sync", WRITE): 4,
                ("sync", READ): 4 * T + 4,
                ("loss_ptr", WRITE): 4 * T,
                ("loss_ptr", READ): 4 * T,
                ("logits", READ): 4 * T,
                ("grad_logits", WRITE): 4 * T,
                ("grad_out", READ): 4 * T,
            },
        ),
    ]


CASES = _cases() if not runtime.is_gpu() else []


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_interpreter_count_is_the_ledger(case):
    _, thunk, led, names, merged, extra = case
    with InterpreterTrips() as t:
        thunk()
    # the cross-entropy's per-row loss buffer is called loss_ptr, the ledger's loss is the one output
    names = {"loss_ptr": "loss_ptr", **names}
    checks = against_ledger(t.by_tensor(names), led)
    measured = {(c.tensor, c.direction): c.measured for c in checks}
    predicted = {(c.tensor, c.direction): c.predicted for c in checks}
    if merged:
        predicted = _merge(predicted, merged, "dw+db")
    for key, n in extra.items():
        predicted[key] = predicted.get(key, 0) + n
    assert {k: v for k, v in measured.items() if v} == {k: v for k, v in predicted.items() if v}
    assert all(UNKNOWN not in k.reads and UNKNOWN not in k.writes for k in t.kernels)


@triton.jit
def _masked_copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = (offs < n) & (offs % 2 == 0)  # every other element, and nothing past the end
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=keep), mask=keep)


def _launch_masked(x, y):
    _masked_copy[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
    return y


def test_masked_lanes_do_not_count_and_each_launch_is_its_own():
    x = torch.randn(101, dtype=torch.float64)
    y, out = torch.zeros_like(x), None
    with InterpreterTrips() as t:
        out = _launch_masked(x, y)
        _launch_masked(x[:50], y[:50])
    assert torch.equal(out[::2], x[::2])
    first, second = t.kernels
    assert first.name == "_masked_copy"
    assert first.reads == {"x_ptr": 51 * 8} and first.writes == {"y_ptr": 51 * 8}
    assert second.reads == {"x_ptr": 25 * 8} and t.nbytes == 2 * (51 + 25) * 8


def test_one_tensor_given_to_two_parameters_is_named_after_both():
    x = torch.randn(64, dtype=torch.float64)
    with InterpreterTrips() as t:
        _launch_masked(x, x)  # in place: x_ptr and y_ptr are one buffer, the addresses cannot tell which
    assert t.kernels[0].reads == {"x_ptr|y_ptr": 32 * 8} and t.kernels[0].writes == {"x_ptr|y_ptr": 32 * 8}
    assert t.by_tensor() == {("x|y", "read"): 256, ("x|y", "write"): 256}
    # beside a ledger, a group takes the name of its one member the ledger knows
    led = Ledger(dtype_bytes=8).op("copy", reads={"x": 32}, writes={"x": 32})
    assert [(c.tensor, c.predicted, c.measured) for c in against_ledger(t.by_tensor(), led)] == [
        ("x", 256, 256),
        ("x", 256, 256),
    ]


def test_of_several_runs_of_one_launchs_grid_the_last_counts():
    """An autotuner (where one runs in the interpreter: a machine with a GPU driver) runs each config's
    grid inside the one launch the caller made; the final run is the launch's trips."""
    import numpy as np

    x = torch.zeros(16)
    t = InterpreterTrips()
    t._on_launch(_triton.Launch("k", "m", [x], ["x_ptr"]))
    addrs = np.arange(x.data_ptr(), x.data_ptr() + 64, 4, dtype=np.uint64)
    for lanes in (16, 8):  # a benchmark run of one config, then the launch
        t._on_grid()
        t._on_access(READ, addrs[:lanes], 4)
    t._on_access(WRITE, np.array([1], dtype=np.uint64), 4)  # an address in no argument
    assert t.kernels[0].reads == {"x_ptr": 32} and t.kernels[0].writes == {UNKNOWN: 4}


def test_the_hook_is_reversible_even_after_an_error():
    from triton.runtime import interpreter as it

    before = {n: it.InterpreterBuilder.__dict__[n] for n in ("create_masked_load", "create_masked_store")}
    call = it.GridExecutor.__dict__["__call__"]
    with pytest.raises(RuntimeError), InterpreterTrips():
        raise RuntimeError("inside")
    assert {n: it.InterpreterBuilder.__dict__[n] for n in before} == before
    assert it.GridExecutor.__dict__["__call__"] is call and not _triton.watching()
    # nothing is counted outside the block
    x = torch.randn(64)
    _, t = interpreter_trips(cos, x)
    cos(x)
    assert len(t.kernels) == 1 and t.nbytes == 2 * 64 * 4


def test_on_a_gpu_the_count_refuses_rather_than_count_nothing(monkeypatch):
    monkeypatch.setattr(runtime, "is_gpu", lambda: True)
    with pytest.raises(RuntimeError, match="fusionlab.measure.ncu"), InterpreterTrips():
        pass
    assert not _triton.watching()
