"""The launchers' shared machinery: checks, configurations, and the direct launch path."""

import pytest
import torch
from conftest import gpu_only

from fusionlab import runtime
from fusionlab.instrument import LaunchCounter
from fusionlab.kernels import _launch
from fusionlab.kernels.bias_gelu import _launch as bias_gelu_launcher
from fusionlab.kernels.bias_gelu import bias_gelu, bias_gelu_reference
from fusionlab.kernels.cos import cos_cos, cos_cos_reference

DEV = runtime.DEVICE


def _tritons_specialisation(arg):
    """What the installed Triton specialises a kernel argument on: ``(type, key)`` from its own
    specialiser (C++ from Triton 3.5, ``create_specialize_impl`` in Python before), as its launch path
    calls it for a plain parameter."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime import jit

    native = getattr(jit, "native_specialize_impl", None)
    if native is not None:
        return native(BaseBackend, arg, False, True, True)

    def extra(a, kind, align=True):
        spec = BaseBackend.get_int_specialization if kind == "int" else BaseBackend.get_tensor_specialization
        return spec(a, align=align)

    return jit.create_specialize_impl(extra)(arg, False, True, True)


def _arguments():
    """Kernel arguments on either side of every line Triton draws: ints 1, multiples of 16, the 32-,
    63- and 64-bit bounds; floats and bools; tensors of several dtypes at every 16-byte alignment."""
    ints = [0, 1, 2, 3, 15, 16, 17, 32, 48, -1, -16, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, -(2**31), -(2**31) - 16]
    ints += [2**62, 2**63 - 16, 2**63, 2**63 + 16, 2**64 - 16]
    base = torch.zeros(256, dtype=torch.float32)  # CPU memory: only data_ptr and dtype are read
    tensors = [base[i:] for i in (0, 1, 2, 3, 4)] + [base.half()[i:] for i in (0, 1, 8)]
    tensors += [base.to(torch.int64)[i:] for i in (0, 1, 2)] + [base.bool(), base.to(torch.int8)[3:]]
    return ints + [0.5, 1.0, 2.0, True, False, None] + tensors


def test_key_is_never_coarser_than_tritons_specialisation():
    # The Launcher reuses a compiled kernel for every call whose key matches: two arguments that
    # Triton compiles differently must never share a key, or the wrong kernel runs silently (a
    # multiple-of-16 hint on an odd stride, an int32 offset on a 64-bit value, a dtype's loads).
    # Checked against the installed Triton's own specialiser (3.6 on the GPUs, 3.9 here).
    args = _arguments()
    ours = {i: _launch._key((a,)) for i, a in enumerate(args)}
    theirs = {i: _tritons_specialisation(a) for i, a in enumerate(args)}
    clashes = [
        (args[i], args[j], theirs[i], theirs[j])
        for i in ours
        for j in ours
        if i < j and ours[i] == ours[j] and theirs[i] != theirs[j]
    ]
    assert not clashes, clashes[:5]
    # argument lists, not only single arguments: kinds side by side must not run together into one key
    few = [1, 16, 17, 2**31, 1.0, True, None, args[-9], args[-8]]
    pairs = [(a, b) for a in few for b in few]
    ours = [_launch._key(p) for p in pairs]
    theirs = [tuple(_tritons_specialisation(x) for x in p) for p in pairs]
    clashes = [
        (pairs[i], pairs[j])
        for i in range(len(pairs))
        for j in range(i)
        if ours[i] == ours[j] and theirs[i] != theirs[j]
    ]
    assert not clashes, clashes[:5]
    # and the key is not trivially fine: values Triton treats alike share a key here too
    assert _launch._key((16,)) == _launch._key((48,)) and _launch._key((3,)) != _launch._key((16,))


def test_key_tells_apart_what_triton_specialises_on():
    x = torch.zeros(64, device=DEV)
    assert _launch._key((x, 16)) == _launch._key((torch.ones(64, device=DEV), 32))  # both multiples of 16
    assert _launch._key((x, 16)) != _launch._key((x, 17))
    assert _launch._key((x, 1)) != _launch._key((x, 3))  # 1 is specialised
    assert _launch._key((x, 16)) != _launch._key((x[1:], 16))  # 16-byte alignment
    assert _launch._key((x, 16)) != _launch._key((x.half(), 16))  # dtype
    assert _launch._key((x, 2**31)) != _launch._key((x, 16))  # 64-bit ints


@pytest.mark.parametrize("n", [1, 7, 1000, 4097])
def test_row_config_holds_the_row_or_tiles_it(n):
    cfg = _launch.row_config(n, torch.float32, max_block=1024)
    assert cfg["BLOCK_N"] >= min(n, 1024) and cfg["SINGLE_TILE"] == (n <= 1024)
    assert cfg["BLOCK_N"] & (cfg["BLOCK_N"] - 1) == 0


def test_a_watched_launch_takes_tritons_own_path():
    x = torch.randn(37, 129, device=DEV)
    b = torch.randn(129, device=DEV)
    bias_gelu(x, b)
    with LaunchCounter() as c:  # the counter hooks Triton's own run(): the direct path must step aside
        bias_gelu(x, b)
    assert c.names == ["_bias_gelu_kernel"]


@gpu_only
def test_the_direct_path_is_right_on_repeats_and_realignments():
    for shape in [(8, 4096), (37, 129), (1024, 4096)]:
        for _ in range(3):
            base = torch.randn(shape[0] * shape[1] + 8, device=DEV, dtype=torch.bfloat16)
            b = torch.randn(shape[1], device=DEV, dtype=torch.bfloat16)
            for offset in (0, 1, 8):  # 16-byte aligned, misaligned, aligned again
                x = base[offset : offset + shape[0] * shape[1]].view(shape)
                for approximate in ("none", "tanh"):
                    torch.testing.assert_close(
                        bias_gelu(x, b, approximate), bias_gelu_reference(x, b, approximate), atol=2e-2, rtol=2e-2
                    )
                torch.testing.assert_close(cos_cos(x), cos_cos_reference(x), atol=2e-2, rtol=2e-2)
    assert bias_gelu_launcher._compiled  # the direct path was used and cached


@pytest.mark.parametrize(
    "gpu,capability,want", [(False, None, False), (True, (8, 0), False), (True, (8, 9), False), (True, (9, 0), True)]
)
def test_dependent_launch_only_where_the_gpu_has_it(monkeypatch, gpu, capability, want):
    # griddepcontrol is sm_90's: an A100 or L4 launch must not ask for it, the interpreter takes no options
    monkeypatch.setattr(runtime, "is_gpu", lambda: gpu)
    monkeypatch.setattr(runtime, "CAPABILITY", capability)
    assert _launch.pdl_supported() is want
    assert _launch.launch_kwargs(4, pdl=True).get("launch_pdl", False) is want
    assert "launch_pdl" not in _launch.launch_kwargs(4)


@gpu_only
def test_the_drivers_bandwidth_agrees_with_the_table_of_named_gpus():
    # configurations choose by DRAM bandwidth (the driver's memory clock x bus width); a lesson on a
    # CPU asks by name (DRAM_GBPS): on the GPUs both know, they must make the same choice
    from fusionlab.kernels.cross_entropy import ROWS_MIN_DRAM_GBPS

    name = torch.cuda.get_device_name()
    if not any(k in name for k in _launch.DRAM_GBPS):
        pytest.skip(f"{name} is not in DRAM_GBPS: nothing to compare with")
    measured, table = _launch.dram_gbps(), _launch.dram_gbps(name)
    assert abs(measured - table) < 0.1 * table, (name, measured, table)
    assert (measured >= ROWS_MIN_DRAM_GBPS) == (table >= ROWS_MIN_DRAM_GBPS), (name, measured, table)


@pytest.mark.parametrize("n", [1, 3, 64, 65, 300])
def test_host_range_reads_min_and_max_either_way(n):
    # up to 64 values through a list, more through numpy's reductions: the same answer
    t = torch.randint(-(2**40), 2**40, (n,), generator=torch.Generator().manual_seed(n))
    lo, hi = _launch.host_range(t)
    assert (lo, hi) == (int(t.min()), int(t.max())) and type(lo) is int and type(hi) is int
    assert _launch.host_range(t.to(torch.int32).clamp(-5, 5)) == (int(t.clamp(-5, 5).min()), int(t.clamp(-5, 5).max()))


def test_check_tensor_refuses_a_strided_last_dimension_even_when_empty():
    # an empty tensor is "contiguous" to torch whatever its strides: the row check reads the stride itself
    t = torch.empty(0, 10, device=DEV)[:, ::2]
    assert t.is_contiguous()
    with pytest.raises(_launch.KernelInputError, match="last dimension has stride 2"):
        _launch.check_tensor(t, "x", op="t", contiguous=False)
    _launch.check_tensor(torch.empty(3, 10, device=DEV)[:, :4], "x", op="t", contiguous=False)  # rows: fine


# -- call signatures and plans ---------------------------------------------------------------------------
def _variants(x):
    """x changed in one field of what check_tensor (and a configuration) reads, each: the signature must
    tell every one apart from x and from each other."""
    buf = torch.randn(x.numel() + 8, device=DEV)
    return {
        "x": x,
        "another dtype": x.half(),
        "another shape": x.view(4, 6),
        "other strides": x.t().contiguous().t(),
        "negated": torch._neg_view(x),
        "requires grad": x.detach().requires_grad_(),
        "another 16-byte alignment": buf[1 : 1 + x.numel()].view(x.shape),
        "another device": x.to("meta"),
        "a subclass": torch.nn.Parameter(x, requires_grad=False),
        "complex": torch.randn(x.shape, dtype=torch.complex64, device=DEV),
        "complex, conjugated": torch.randn(x.shape, dtype=torch.complex64, device=DEV).conj(),
    }


def test_signature_tells_apart_every_field_a_check_reads():
    x = torch.randn(6, 4, device=DEV)
    sigs = {name: _launch.signature(t) for name, t in _variants(x).items()}
    assert len(set(sigs.values())) == len(sigs), sigs
    # the same metadata in another tensor (other memory, other values): the same signature
    assert _launch.signature(torch.zeros(6, 4, device=DEV)) == sigs["x"]
    with torch.no_grad():
        assert _launch.signature(x) != sigs["x"]  # the grad mode is part of it
    # an absent tensor is not a tensor; anything else that is not a tensor has no signature
    assert _launch.signature(x, None) != _launch.signature(None, x)
    assert _launch.signature(x, [1.0]) is None and _launch.signature(3) is None


def test_plain_choices_keep_out_what_compares_equal_to_another_kind():
    assert _launch.plain_choices(None, "gelu")
    assert not _launch.plain_choices(True) and not _launch.plain_choices(1) and not _launch.plain_choices([])

    class S(str):
        pass

    assert not _launch.plain_choices(S("gelu"))


def test_plans_start_again_when_full():
    plans = _launch.Plans(maxsize=3)
    for i in range(3):
        plans.put(i, str(i))
    assert len(plans) == 3 and plans.get(2) == "2"
    plans.put(3, "3")
    assert len(plans) == 1 and plans.get(3) == "3" and plans.get(0) is None


def test_call_passes_its_arguments_to_launch_and_intern_is_stable():
    # Launcher.launch is __call__ without the unpacking (the ops' plans call it): __call__ hands it the
    # same grid, arguments, constexprs, key and device
    seen = []

    class Recorder(_launch.Launcher):
        def launch(self, grid, args, kwargs, key=None, device=None):
            seen.append((grid, args, kwargs, key, device))

    Recorder(bias_gelu_launcher.kernel)((3,), 1, 2.0, key=7, device=0, APPROX=True)
    assert seen == [((3,), (1, 2.0), {"APPROX": True}, 7, 0)]
    la = _launch.Launcher(bias_gelu_launcher.kernel)
    assert la.intern(("a", 1)) == la.intern(("a", 1)) != la.intern(("a", 2))
    x = torch.zeros(64, device=DEV)
    # spec_key: equal for arguments Triton specialises alike, apart for those it does not
    assert la.spec_key((x, 16), {"B": 1}) == la.spec_key((torch.ones(64, device=DEV), 32), {"B": 1})
    assert la.spec_key((x, 16), {"B": 1}) != la.spec_key((x, 17), {"B": 1})
    assert la.spec_key((x, 16), {"B": 1}) != la.spec_key((x[1:], 16), {"B": 1})
    assert la.spec_key((x, 16), {"B": 1}) != la.spec_key((x, 16), {"B": 2})
