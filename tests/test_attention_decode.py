"""Flash-decoding: a few queries against a KV cache, keys split across programs and the partials combined."""

from __future__ import annotations

import pytest
import torch
from conftest import gpu_only, refusal

from fusionlab import runtime
from fusionlab.instrument import LaunchCounter
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.attention_decode import (
    attention_decode,
    attention_decode_config,
    attention_decode_eager,
    attention_decode_flops,
    attention_decode_ledger,
    attention_decode_reference,
)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's inf - inf in masked interpreter lanes
DEV = runtime.DEVICE
DTYPES = [pytest.param(torch.float16, 2e-3, id="fp16")]
if runtime.is_gpu():
    DTYPES.append(pytest.param(torch.bfloat16, 1.6e-2, id="bf16"))
else:
    DTYPES.insert(0, pytest.param(torch.float32, 1e-4, id="fp32"))  # the GPU kernel takes 16-bit inputs only

# (B, H_q, H_kv, N_q, N_k, D): each comment names the path it exercises
SHAPES = [
    (1, 1, 1, 1, 1, 16),  # one key, one query: one program, one masked tile
    (2, 8, 2, 1, 100, 32),  # GQA 4:1, keys not a multiple of the tile
    (3, 6, 2, 2, 40, 24),  # two queries per row (causal), a head dim that is not a power of two
    (1, 4, 4, 3, 70, 16),  # multi-head (G = 1), three queries
    (2, 32, 8, 1, 70, 128),  # Llama-3-8B's heads: 4 query heads per KV head, D 128
]


def _qkv(B, H, H_kv, N_q, N_k, D, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N_q, D, generator=gen)
    k = torch.randn(B, H_kv, N_k, D, generator=gen)
    v = torch.randn(B, H_kv, N_k, D, generator=gen)
    return [t.to(DEV, dtype) for t in (q, k, v)]


def _want(q, k, v, cache_len=None, causal=True):
    return attention_decode_reference(q.double(), k.double(), v.double(), cache_len, causal)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(
    "splits", [None, 1, 3, (3, False)], ids=["default", "one split", "three splits", "three splits, combine kernel"]
)
def test_matches_float64(shape, splits, dtype, tol):
    q, k, v = _qkv(*shape, dtype)
    cfg = None if splits is None else {"SPLITS": splits}
    if isinstance(splits, tuple):  # the combine in a kernel of its own, not in each KV head's last split
        cfg = {"SPLITS": splits[0], "LAST_COMBINES": splits[1]}
    got = attention_decode(q, k, v, config=cfg)
    torch.testing.assert_close(got.double(), _want(q, k, v), atol=tol, rtol=tol)


@pytest.mark.parametrize("causal", [True, False])
def test_cache_lengths_per_row(causal):
    """Each row's own length, including 0 (no key: O = 0) and the whole cache; splits past a row's
    length see no key and must not disturb the combine."""
    # one dtype each (the dtypes' own paths run in test_matches_float64): fp16 causal, the other not
    dtype, tol = (
        (torch.float16, 2e-3) if causal else ((torch.bfloat16, 1.6e-2) if runtime.is_gpu() else (torch.float32, 1e-4))
    )
    B, H, H_kv, N_q, N_k, D = 5, 8, 2, 2, 97, 32
    q, k, v = _qkv(B, H, H_kv, N_q, N_k, D, dtype, seed=1)
    lens = torch.tensor([0, 1, 33, 64, 97], device=DEV)
    for cfg in ({"SPLITS": 1}, {"SPLITS": 4, "LAST_COMBINES": False}, {"SPLITS": 4}):
        got = attention_decode(q, k, v, lens, causal, config=cfg)
        want = _want(q, k, v, lens, causal)
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    assert got[0].abs().max() == 0  # the empty row
    # keys past a row's length are never read: poisoning them changes nothing
    k2, v2 = k.clone(), v.clone()
    k2[2, :, 33:] = float("nan")
    v2[2, :, 33:] = float("inf")
    torch.testing.assert_close(attention_decode(q, k2, v2, lens, causal, config={"SPLITS": 4}), got, atol=0, rtol=0)


def test_matches_sdpa_and_the_prefill_attention():
    """The eager baseline is SDPA with GQA; the last query of a causal prefill is a decode step."""
    B, H, H_kv, N, D = 2, 8, 2, 50, 32
    dtype = torch.float16 if runtime.is_gpu() else torch.float32
    q, k, v = _qkv(B, H, H_kv, N, N, D, dtype, seed=2)
    got = attention_decode(q[:, :, -3:], k, v)  # the last three tokens, bottom-right causal
    want = _want(q, k, v)[:, :, -3:]
    torch.testing.assert_close(got.double(), want, atol=2e-3, rtol=2e-3)
    eager = attention_decode_eager(q[:, :, -3:], k, v)
    torch.testing.assert_close(eager.double(), want, atol=2e-3, rtol=2e-3)


def test_a_transposed_cache_is_read_in_place():
    """A cache kept as (B, N_k, H_kv, D) is passed transposed: no copy, the same answer."""
    B, H, H_kv, N_k, D = 2, 4, 2, 300, 16  # two splits of whole key tiles in the interpreter and on a GPU
    dtype = torch.float16 if runtime.is_gpu() else torch.float32
    q, k, v = _qkv(B, H, H_kv, 1, N_k, D, dtype, seed=3)
    kt, vt = k.transpose(1, 2).contiguous().transpose(1, 2), v.transpose(1, 2).contiguous().transpose(1, 2)
    with LaunchCounter() as counter:
        got = attention_decode(q, kt, vt, config={"SPLITS": 2})
    assert counter.names == ["_decode_split_kernel"] and counter.passes == [], "the last split combines"
    torch.testing.assert_close(got.double(), _want(q, k, v), atol=1e-3, rtol=1e-3)
    with LaunchCounter() as counter:
        again = attention_decode(q, kt, vt, config={"SPLITS": 2, "LAST_COMBINES": False})
    assert counter.names == ["_decode_split_kernel", "_decode_combine_kernel"] and counter.passes == []
    torch.testing.assert_close(again, got, atol=0, rtol=0)  # one merge, in one order, either way
    with LaunchCounter() as counter:
        attention_decode(q, kt, vt, config={"SPLITS": 1})
    assert counter.names == ["_decode_split_kernel"], "one split writes O itself"


def test_refusals():
    q, k, v = _qkv(2, 4, 2, 1, 10, 16, torch.float16)
    with pytest.raises(KernelInputError, match="at most"):
        attention_decode(torch.randn(2, 4, 17, 16, device=DEV, dtype=torch.float16), k, v)
    with pytest.raises(KernelInputError, match=r"shape \(B,\)"):
        attention_decode(q, k, v, torch.tensor([1, 2, 3], device=DEV))
    with pytest.raises(KernelInputError, match="int32/int64"):
        attention_decode(q, k, v, torch.tensor([1.0, 2.0], device=DEV))
    if not runtime.is_gpu():  # free to read in the interpreter; a GPU clamps instead of syncing
        with pytest.raises(KernelInputError, match=r"\[0, N_k=10\]"):
            attention_decode(q, k, v, torch.tensor([1, 11]))
    with pytest.raises(KernelInputError, match="multiple of H_kv"):
        attention_decode(q[:, :3], k, v)
    with pytest.raises(KernelInputError, match="SPLITS"):
        attention_decode(q, k, v, config={"SPLITS": 0})


def test_config_ledger_and_flops():
    cfg = attention_decode_config(1, 32, 8, 1, 4096, 128)
    assert cfg["BLOCK_M"] == 16 and cfg["BLOCK_D"] == 128  # 4 query heads per KV head, padded to tl.dot's 16
    if runtime.is_gpu():  # B x H_kv = 8 programs per split: split until the GPU is full
        assert cfg["SPLITS"] > 1
    led = attention_decode_ledger(1, 32, 8, 1, 4096, 128, torch.bfloat16, splits=16)
    kv = 8 * 4096 * 128
    rows = 32
    assert led.fused_bytes == 2 * (rows * 128 + 2 * kv + rows * 128) + 4 * 2 * rows * 16 * 130
    one = attention_decode_ledger(1, 32, 8, 1, 4096, 128, torch.bfloat16, splits=16, last_combines=True)
    assert one.fused_bytes == led.fused_bytes and {s[0] for s in one.schedule} == {"split + combine"}
    assert led.unfused_bytes > 4 * led.fused_bytes  # eager repeats K and V to 32 heads and writes the scores
    assert attention_decode_flops(1, 32, 1, 4096, 128) == 4 * 32 * 4096 * 128


@gpu_only
@pytest.mark.gpu
def test_a_captured_call_takes_the_combine_kernel():
    """In a CUDA graph launches cost the host nothing, and the combine kernel's one program a row is the
    faster merge: a captured call launches it (whether or not its stream has counters), each graph
    replays to the launched call's answer (within bf16's rounding: the merge runs in another kernel), in
    any order, and launched calls after the replays still combine in their last split, bit for bit."""
    cases = [_qkv(1, 32, 8, 1, 4096, 128, torch.bfloat16, seed=7), _qkv(4, 32, 8, 1, 1024, 128, torch.bfloat16, seed=8)]
    lens = [torch.tensor([4000], device=DEV), None]
    want = [attention_decode(q, k, v, n) for (q, k, v), n in zip(cases, lens, strict=True)]
    warmed = torch.cuda.Stream()
    warmed.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmed):  # this stream's counters are made here
        attention_decode(*cases[0], lens[0])
    torch.cuda.current_stream().wait_stream(warmed)
    graphs, outs = [], []
    for (q, k, v), n, stream in zip(cases, lens, (warmed, torch.cuda.Stream()), strict=True):
        g = torch.cuda.CUDAGraph()
        with LaunchCounter() as counter, torch.cuda.graph(g, stream=stream):
            outs.append(attention_decode(q, k, v, n))
        assert counter.names == ["_decode_split_kernel", "_decode_combine_kernel"]
        graphs.append(g)
    for _ in range(2):
        for g in reversed(graphs):
            g.replay()
    torch.cuda.synchronize()
    for got, w in zip(outs, want, strict=True):
        torch.testing.assert_close(got, w)
    for (q, k, v), n, w in zip(cases, lens, want, strict=True):
        torch.testing.assert_close(attention_decode(q, k, v, n), w, atol=0, rtol=0)


# -- plans by call signature -------------------------------------------------------------------------
# A call whose signature (q's, k's, v's and the lengths' type, device, dtype, shape, strides, negation
# flag, requires_grad and 16-byte alignment; the grad mode; causal and scale) equals that of a call that
# passed every check skips the checks and launches the kept plan; the lengths' values, where they are read
# on the host, are checked on every call. Any other call is checked in full, as on a fresh start.
@pytest.mark.parametrize("has_len", [True, False], ids=["lengths", "full-cache"])
def test_a_repeated_call_launches_its_kept_plan_without_the_checks(has_len, monkeypatch):
    import fusionlab.kernels.attention_decode as AD

    q, k, v = _qkv(2, 8, 2, 1, 100, 32, torch.float16, seed=20)  # two splits: the last one combines
    lens = torch.tensor([37, 100], device=DEV) if has_len else None
    AD._PLANS.clear()
    first = attention_decode(q, k, v, lens)
    assert len(AD._PLANS) == 1
    calls = []
    for name in ("check_inputs", "_decode_plan", "_check_len"):
        fn = getattr(AD, name)
        monkeypatch.setattr(AD, name, lambda *a, fn=fn, **kw: calls.append(a) or fn(*a, **kw))
    q2, k2, v2 = _qkv(2, 8, 2, 1, 100, 32, torch.float16, seed=21)
    lens2 = torch.tensor([5, 64], device=DEV) if has_len else None  # other values, the same signature
    again, other = attention_decode(q, k, v, lens), attention_decode(q2, k2, v2, lens2)
    assert not calls
    assert torch.equal(again, first)
    torch.testing.assert_close(other.double(), _want(q2, k2, v2, lens2), atol=2e-3, rtol=2e-3)
    monkeypatch.undo()
    AD._PLANS.clear()
    assert torch.equal(other, attention_decode(q2, k2, v2, lens2))  # the full path's bits


@pytest.mark.skipif(runtime.is_gpu(), reason="a GPU never reads the lengths back (the kernel clamps them)")
def test_lengths_in_host_memory_are_checked_on_every_call_of_a_kept_plan():
    import fusionlab.kernels.attention_decode as AD

    q, k, v = _qkv(2, 4, 2, 1, 10, 16, torch.float16, seed=22)
    for bad in ([1, 11], [-1, 0]):
        AD._PLANS.clear()
        fresh = refusal(lambda bad=bad: attention_decode(q, k, v, torch.tensor(bad)))
        for _ in range(2):
            attention_decode(q, k, v, torch.tensor([1, 3]))
        assert len(AD._PLANS) == 1
        assert refusal(lambda bad=bad: attention_decode(q, k, v, torch.tensor(bad))) == fresh


def _decode_bad_after_good():
    """(name, the bad call's arguments from a good call's) differing from it in one field of the signature
    or one option."""
    return [
        ("negated q", lambda a: {**a, "q": torch._neg_view(a["q"])}),
        ("negated k", lambda a: {**a, "k": torch._neg_view(a["k"])}),
        ("v of another dtype", lambda a: {**a, "v": a["v"].long()}),
        ("k's last dimension strided", lambda a: {**a, "k": torch.randn(2, 2, 10, 32, device=DEV).half()[..., ::2]}),
        ("q on another device", lambda a: {**a, "q": a["q"].to("meta")}),
        ("q requires grad", lambda a: {**a, "q": a["q"].detach().requires_grad_()}),
        ("lengths of a float dtype", lambda a: {**a, "cache_len": a["cache_len"].float()}),
        ("lengths not contiguous", lambda a: {**a, "cache_len": torch.tensor([1, 9, 3, 9], device=DEV)[::2]}),
        ("lengths on another device", lambda a: {**a, "cache_len": a["cache_len"].to("meta")}),
        ("lengths of another shape", lambda a: {**a, "cache_len": torch.tensor([1, 3, 2], device=DEV)}),
        ("lengths not a tensor", lambda a: {**a, "cache_len": [1, 3]}),
        ("causal 1", lambda a: {**a, "causal": 1}),
        ("scale nan", lambda a: {**a, "scale": float("nan")}),
        ("scale True", lambda a: {**a, "scale": True}),
        ("a config of 0 splits", lambda a: {**a, "config": {"SPLITS": 0}}),
    ]


@pytest.mark.parametrize("bad", [c[1] for c in _decode_bad_after_good()], ids=[c[0] for c in _decode_bad_after_good()])
def test_a_bad_call_after_good_ones_of_the_same_shape_still_raises(bad):
    import fusionlab.kernels.attention_decode as AD

    q, k, v = _qkv(2, 4, 2, 1, 10, 16, torch.float16, seed=23)
    good = dict(q=q, k=k, v=v, cache_len=torch.tensor([1, 3], device=DEV))
    args = bad(good)
    AD._PLANS.clear()
    fresh = refusal(lambda: attention_decode(**args))
    for _ in range(2):  # the second good call launches the kept plan (grad on, as the bad call runs)
        attention_decode(**good)
        attention_decode(**good, scale=1.0)  # (scale True must not find this one: True == 1.0)
    assert len(AD._PLANS) == 2
    assert refusal(lambda: attention_decode(**args)) == fresh
