"""The grading machinery: each class of wrong answer is rejected with a short, useful message, and a
right answer is accepted. The wrong answers here are our own; a held-out set is run elsewhere."""

import sys

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from fusionlab import grading, runtime
from fusionlab.grading import CheckFailed
from fusionlab.kernels.cos import cos_cos, cos_cos_reference

pytestmark = pytest.mark.lesson1


def make_x(n, dtype, gen):
    return (grading.with_room_after(grading.randn(n, dtype, gen=gen)),)


def run(student, **kw):
    kw.setdefault("sizes", (1, 1000, 4097))
    kw.setdefault("many", 70_001)  # many programs at the block sizes below, cheap in the interpreter
    return grading.check_function(student, cos_cos_reference, make_x, name="cos_cos", **kw)


@triton.jit
def _cc(x_ptr, y_ptr, n, BLOCK: tl.constexpr, WHAT: tl.constexpr = 2):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.cos(x)
    if WHAT == 2:
        y = tl.cos(y)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def launch(x, y, block=1024, grid=None, what=2):
    _cc[grid or (triton.cdiv(x.numel(), block),)](x, y, x.numel(), BLOCK=block, WHAT=what)
    return y


def good(x):
    return launch(x, torch.empty_like(x))


def test_right_answer_passes_and_prints_once(capsys):
    res = run(good)
    assert res.startswith("✓ cos_cos") and res.checks == 3 * 2 + 2
    assert capsys.readouterr().out.count("✓") == 1
    assert res._ipython_display_() is None  # as a cell's last value it shows nothing more


# -- each class of wrong answer ---------------------------------------------------------------------
def two_kernels(x):
    t = launch(x, torch.empty_like(x), what=1)
    return launch(t, torch.empty_like(x), what=1)


def computes_in_torch(x):
    return x.float().cos().cos().to(x.dtype)


def upcast_first(x):  # casts the input in torch, then one kernel: an extra pass
    xf = x.float()
    return launch(xf, torch.empty_like(xf)).to(x.dtype)


def scratch_cast_back(x):  # fp32 scratch buffer cast back with .to: an extra pass
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    return launch(x, y).to(x.dtype)


def writes_its_input(x):
    launch(x, x)
    return x.clone()


def writes_its_input_quietly(x):
    y = launch(x, torch.empty_like(x))
    launch(x, x, grid=(1,), block=16)  # and scribbles on the first elements of x
    return y


def fixed_grid(x):  # a dozen programs, the interpreter's largest block
    return launch(x, torch.empty_like(x), block=4096, grid=(12,))


_CACHE = {}


def caches_by_shape(x):
    # one launch per call, so the count is right, but the first answer for a shape is returned again
    key = (tuple(x.shape), x.dtype)
    y = launch(x, torch.empty_like(x))
    return _CACHE.setdefault(key, y)


def numpy_then_copy(x):
    host = x.detach().cpu().numpy()
    r = torch.from_numpy(np.cos(np.cos(host.astype(np.float32))).astype(host.dtype)).to(x.device)
    return _copy(r, x)


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def _copy(r, x):
    y = torch.empty_like(x)
    _copy_kernel[(triton.cdiv(x.numel(), 1024),)](r, y, x.numel(), BLOCK=1024)
    return y


def no_dispatch_then_copy(x):
    with torch._C._DisableTorchDispatch():
        r = x.float().cos().cos().to(x.dtype)
    return _copy(r, x)


def one_past_the_end(x):
    y = torch.empty_like(x)
    n = x.numel()
    _cc[(triton.cdiv(n + 1, 1024),)](x, y, n + 1, BLOCK=1024)  # writes element n as well
    return y


def unmasked_tail(x):
    y = torch.empty_like(x)
    n = (x.numel() // 1024) * 1024
    _cc[(max(1, n // 1024),)](x, y, n, BLOCK=1024)  # full blocks only: the tail is never written
    return y


def raises(x):
    return 1 / 0


@pytest.mark.parametrize(
    "wrong, message",
    [
        (two_kernels, r"expected 1 Triton kernel launch, saw 2 .*fuse them"),
        (computes_in_torch, r"computes with torch \(cos\)"),
        (upcast_first, r"moves tensor data with torch \(_to_copy\)"),
        (scratch_cast_back, r"moves tensor data with torch \(_to_copy\)"),
        (writes_its_input, r"changed input 0"),
        (writes_its_input_quietly, r"changed input 0"),
        (fixed_grid, r"never written"),
        (caches_by_shape, r"the tensor you return is not passed to your kernel|elements differ"),
        (numpy_then_copy, r"input 0 is not passed to your kernel|moves tensor data with torch"),
        (no_dispatch_then_copy, r"torch computes with dispatch switched off \(cos\)"),
        (one_past_the_end, r"wrote 1 element past the end .*right after the end"),
        (unmasked_tail, r"never written"),
        (lambda x: cos_cos(x), r"fusionlab's own kernel \(_cos_kernel\)"),
        (lambda x: cos_cos_reference(x), r"answer keys"),
        (raises, r"your code raised ZeroDivisionError: division by zero\n  at test_grading.py"),
        (lambda x: launch(x, torch.empty_like(x), what=1), r"elements differ"),
    ],
    ids=lambda v: getattr(v, "__name__", None) if callable(v) else "",
)
def test_each_class_of_wrong_answer_is_rejected(wrong, message):
    _CACHE.clear()
    with pytest.raises(CheckFailed, match=message) as err:
        run(wrong)
    text = str(err.value)
    assert "seed" in text or "answer keys" in text or "own kernel" in text
    assert len(text.splitlines()) <= 5  # short: what is wrong, where to look, the seed


@triton.autotune(configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n"])
@triton.jit
def _autotuned(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, tl.cos(tl.cos(x)).to(y_ptr.dtype.element_ty), mask=mask)


@pytest.mark.skipif(not runtime.is_gpu(), reason="Triton's autotuner needs a GPU driver (the interpreter has none)")
def test_an_autotuned_answer_counts_as_one_launch():
    # the autotuner launches every config while it benchmarks: those launches are not the answer's
    def autotuned(x):
        y = torch.empty_like(x)
        n = x.numel()
        _autotuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
        return y

    assert run(autotuned).startswith("✓ cos_cos")


def test_not_implemented_is_reported_as_such():
    def stub(x):
        raise NotImplementedError("Exercise: write the kernel")

    with pytest.raises(CheckFailed, match="not done yet"):
        run(stub)


def test_a_failure_replays_with_its_seed():
    seen = []

    def record(x):
        seen.append(x.tolist())
        return launch(x, torch.empty_like(x), what=1)  # wrong: one cosine

    with pytest.raises(CheckFailed) as err:
        run(record)
    seed = int(str(err.value).split("seed ")[1].split(":")[0])
    first = seen[0]
    seen.clear()
    with grading.replay(seed), pytest.raises(CheckFailed):
        run(record)
    assert seen[0] == first


def test_inputs_are_fresh_each_check():
    seen = []

    def recording(n, dtype, gen):
        (x,) = make_x(n, dtype, gen)
        seen.append(x.tolist())
        return (x,)

    for _ in range(2):
        grading.check_function(
            good, cos_cos_reference, recording, name="cos_cos", sizes=(64,), many=None, dtypes=(torch.float32,)
        )
    assert seen[0] != seen[2]  # two checks: fresh values (each check also repeats its last size)
    assert seen[0] != seen[1]  # ... and the repeat within one check draws fresh values too


# -- the machinery itself ---------------------------------------------------------------------------
def test_odd_sizes_are_not_block_multiples():
    assert all(n % 64 for n in grading.ODD_SIZES)
    assert grading.MANY_PROGRAMS > 12 * 65536  # a fixed grid of a dozen interpreter blocks cannot cover it


#: every dtype an answer might allocate scratch in: the poison must fit each (int8's and uint8's
#: ranges hold no -12345; an 8-bit float has one NaN or none with a payload)
ANY_DTYPES = [
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.complex64,
]


@pytest.mark.parametrize("dtype", ANY_DTYPES, ids=str)
def test_every_allocation_path_is_poisoned(dtype):
    with grading.Sandbox():
        made = [
            torch.empty(10, dtype=dtype, device=runtime.DEVICE),
            torch.empty_like(torch.ones(3, 4, dtype=dtype)),
            torch.ones(2, dtype=dtype).new_empty((7,)),
            torch.empty_strided((3, 2), (1, 3), dtype=dtype, device=runtime.DEVICE),
        ]
    for t in made:
        assert grading.poisoned(t).all()
    after = torch.empty(10, dtype=dtype)  # outside the sandbox: plain torch again
    assert after.shape == (10,)


def test_an_answer_may_allocate_scratch_in_any_dtype():
    made = []

    def allocates(x):  # a right answer that also allocates (and never writes) scratch in every dtype
        made.extend(torch.empty(5, dtype=d, device=x.device) for d in ANY_DTYPES)
        return good(x)

    assert run(allocates, sizes=(7, 1000, 4097), many=None).startswith("✓ cos_cos")
    assert {t.dtype for t in made} == set(ANY_DTYPES)
    assert all(grading.poisoned(t).all() for t in made)  # poisoned, and told from written values
    written = [t.fill_(1) if t.is_floating_point() or t.is_complex() else t.zero_() for t in made[: len(ANY_DTYPES)]]
    assert not any(grading.poisoned(t).any() for t in written)


def test_a_computed_nan_is_not_mistaken_for_the_poison():
    with grading.Sandbox():
        y = torch.empty(4)
    y[1] = float("nan")
    assert grading.poisoned(y).tolist() == [True, False, True, True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tolerance_fits_dtype(dtype):
    atol, rtol = grading.tolerance(dtype)
    assert rtol >= torch.finfo(dtype).eps  # a one-ulp difference passes
    assert rtol <= 128 * torch.finfo(dtype).eps  # ... and a wrong rounding order of many ulps does not


def test_ledgers_are_compared_trip_by_trip():
    from fusionlab.ledger import Ledger

    want = (
        Ledger(dtype_bytes=4)
        .op("a", reads={"x": 10}, writes={"t": 10})
        .op("b", reads={"t": 10, "x": 10}, writes={"y": 10})
    )
    # the right totals from the wrong trips: b reads t twice instead of x
    wrong = Ledger(dtype_bytes=4).op("a", reads={"x": 10}, writes={"t": 10}).op("b", reads={"t": 20}, writes={"y": 10})
    with pytest.raises(
        CheckFailed, match=r"unfused, the trip 'b reads t' \(10 elements\) is missing; you have 'b reads t' \(20\)"
    ):
        grading.compare_ledgers(wrong, want, "ledger")
    grading.compare_ledgers(want, want, "ledger")


# -- held out: cheats and mistakes the checks were once blind to ---------------------------------------
def _torch_cos_cos(args):
    # a heuristics function runs inside the launch, before the kernel: torch does the work there
    x, y = args["x_ptr"], args["y_ptr"]
    y.copy_(x.float().cos().cos().to(y.dtype))
    return 0


@triton.heuristics({"UNUSED": _torch_cos_cos})
@triton.jit
def _does_nothing(x_ptr, y_ptr, n, BLOCK: tl.constexpr, UNUSED: tl.constexpr):
    pass


def torch_inside_the_launch(x):
    y = torch.empty_like(x)
    _does_nothing[(1,)](x, y, x.numel(), BLOCK=16)
    return y


def reads_the_expected_values(x):
    """Looks for the reference on the checker's frames and copies it in with one kernel."""
    f = sys._getframe(1)
    while f is not None:
        for v in list(f.f_locals.values()):
            if isinstance(v, torch.Tensor) and v.shape == x.shape and v.data_ptr() != x.data_ptr():
                y = torch.empty_like(x)
                _copy_kernel[(triton.cdiv(x.numel(), 1024),)](v, y, x.numel(), BLOCK=1024)
                return y
        f = f.f_back
    return launch(x, torch.empty_like(x), what=1)  # found nothing: a wrong answer


def knows_the_sizes(x):
    """Right on the sizes a fixed list would use, wrong anywhere else."""
    return launch(x, torch.empty_like(x), what=2 if x.numel() in (1, 1000, 4097, 70_001) else 1)


_SEEN = {}


def cached_without_launch(x):
    key = (tuple(x.shape), x.dtype)
    if key not in _SEEN:
        _SEEN[key] = launch(x, torch.empty_like(x))
    return _SEEN[key]


@pytest.mark.parametrize(
    "wrong, message",
    [
        (torch_inside_the_launch, r"computes with torch \(.*cos"),
        (reads_the_expected_values, r"elements differ"),
        (knows_the_sizes, r"elements differ"),
        (cached_without_launch, r"returned without launching a kernel in this call.*kept from an earlier call"),
    ],
    ids=lambda v: getattr(v, "__name__", None) if callable(v) else "",
)
def test_held_out_wrong_answers_are_rejected(wrong, message):
    _SEEN.clear()
    with pytest.raises(CheckFailed, match=message):
        with grading.replay(20261126):  # the drawn sizes of this seed: none of the fixed ones
            run(wrong)


def test_a_patched_comparison_changes_nothing(monkeypatch):
    # the answer rebinds torch's comparisons as it runs: the checks keep the ones bound at import
    def patches_then_wrong(x):
        monkeypatch.setattr(torch, "isclose", lambda a, b, **k: torch.ones_like(a, dtype=torch.bool))
        monkeypatch.setattr(torch, "equal", lambda a, b: True)
        return launch(x, torch.empty_like(x), what=1)

    with pytest.raises(CheckFailed, match="elements differ"):
        run(patches_then_wrong)


def test_inputs_are_padded_with_poison_floats_and_zero_integers():
    x = grading.with_room_after(torch.ones(5))
    room = x.untyped_storage().nbytes() // 4
    behind = torch.empty(0).set_(x.untyped_storage(), 5, (room - 5,))
    assert torch.isnan(behind).all() and not grading.poisoned(behind).any() and (x == 1).all()
    t = grading.with_room_after(torch.arange(5))
    assert (torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 5, (10,)) == 0).all()


def test_a_different_function_inside_the_fp16_tolerance_is_told_apart():
    import torch.nn.functional as F

    v = torch.linspace(-4, 4, 4001, dtype=torch.float64)
    exact, tanh = F.gelu(v), F.gelu(v, approximate="tanh")
    assert grading.nearer_to(tanh.half(), exact, tanh)  # the tanh GELU, rounded to fp16
    assert not grading.nearer_to(exact.half(), exact, tanh)  # the exact one
    atol, rtol = grading.tolerance(torch.float16)
    assert torch.allclose(tanh.half().double(), exact, atol=atol, rtol=rtol)  # why a tolerance cannot


def test_a_store_past_the_end_is_caught_on_this_device():
    # on a GPU too (runtime.DEVICE): the answer's output is the front of a poisoned buffer, its tail a guard
    def sixteen_past(x):
        y = torch.empty_like(x)
        n = x.numel()
        _cc[(triton.cdiv(n + 16, 1024),)](x, y, n + 16, BLOCK=1024)
        return y

    with pytest.raises(CheckFailed, match=r"wrote 16 elements past the end"):
        run(sixteen_past)


def test_messages_count_in_the_singular():
    assert grading.plural(1, "kernel") == "1 kernel" and grading.plural(2, "kernel") == "2 kernels"
    assert grading.plural(1, "launch", "launches") == "1 launch"


@triton.jit
def _hooked_nothing(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass


def test_torch_in_a_pre_run_hook_is_counted():
    if not hasattr(_hooked_nothing, "add_pre_run_hook"):
        pytest.skip("this Triton has no pre-run hooks")

    def hook(x_ptr, y_ptr, n, *rest, **kw):  # runs inside the launch, before the kernel
        y_ptr.copy_(x_ptr.float().cos().cos().to(y_ptr.dtype))

    _hooked_nothing.add_pre_run_hook(hook)

    def torch_in_the_hook(x):
        y = torch.empty_like(x)
        _hooked_nothing[(1,)](x, y, x.numel(), BLOCK=16)
        return y

    try:
        # refused before anything is counted: a pre-run hook runs inside the kernel's run, where the inputs are real
        with pytest.raises(CheckFailed, match=r"runs code of yours inside its launch \(a pre-run hook"):
            run(torch_in_the_hook)
    finally:
        _hooked_nothing.pre_run_hooks.clear()
