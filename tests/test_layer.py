"""Lesson 9's layer: the package's kernels assembled into a Llama-style layer, against the plain-torch spec."""

from __future__ import annotations

import pytest
import torch
from conftest import gpu_only
from torch.utils._python_dispatch import TorchDispatchMode

from fusionlab import runtime
from fusionlab.instrument import LaunchCounter
from fusionlab.model import (
    LLAMA3_8B,
    LlamaLayer,
    LlamaLayerReference,
    TinyLlama,
    llama_layer_ledger,
    torch_fuses_rms_norm,
    weight_grad,
)

DEV = runtime.DEVICE
# tiny: hidden 64, 4 query heads and 2 KV heads of 16, FFN 96 (GQA 2:1, every kernel's masks in play)
CFG = dict(hidden=64, n_heads=4, n_kv_heads=2, ffn=96, max_positions=64)
DTYPE = torch.bfloat16 if runtime.is_gpu() else torch.float32  # attention takes 16-bit inputs on a GPU
TOL = 5e-2 if runtime.is_gpu() else 1e-4


def _pair(seed=0):
    """A reference layer with random weights, its float64 copy, and the package's layer loaded from it."""
    torch.manual_seed(seed)
    ref = LlamaLayerReference(**CFG)
    with torch.no_grad():
        for p in ref.parameters():  # norm weights away from 1, so a missing or doubled weight shows
            torch.nn.init.normal_(p, std=0.2) if p.dim() == 2 else torch.nn.init.uniform_(p, 0.5, 1.5)
    ref64 = LlamaLayerReference(**CFG).double()
    ref64.load_state_dict(ref.state_dict())
    lay = LlamaLayer(**CFG).load_reference_state_dict(ref.state_dict()).to(DEV, DTYPE)
    return ref64, lay


def _close(got, want, scale):
    torch.testing.assert_close(got.double().cpu(), want.detach(), atol=TOL * scale, rtol=TOL)


def test_parameter_names_are_hugging_faces():
    names = set(LlamaLayerReference(**CFG).state_dict())
    assert names == {
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    }


@pytest.mark.parametrize("offset", [0, 5])
def test_forward_matches_float64_reference(offset):
    ref64, lay = _pair()
    x = torch.randn(2, 9, 64)
    want = ref64(x.double(), offset)
    got = lay(x.to(DEV, DTYPE), offset)
    _close(got, want, want.abs().max().item())


def test_backward_matches_float64_reference():
    """dx and every weight's gradient: each of the package's backwards (RMSNorm, the matmuls, RoPE,
    attention, SwiGLU) and the layer's wiring between them."""
    ref64, lay = _pair(seed=1)
    x = torch.randn(2, 7, 64)
    xg = x.to(DEV, DTYPE, copy=True).requires_grad_()
    y = lay(xg, 2)
    dy = torch.randn(y.shape)
    y.backward(dy.to(DEV, DTYPE))
    xd = x.double().requires_grad_()
    ref64(xd, 2).backward(dy.double())
    a, m = ref64.self_attn, ref64.mlp
    pairs = {
        "x": (xg.grad, xd.grad),
        "attn_norm": (lay.attn_norm.grad, ref64.input_layernorm.weight.grad),
        "ffn_norm": (lay.ffn_norm.grad, ref64.post_attention_layernorm.weight.grad),
        "wqkv": (lay.wqkv.grad, torch.cat([a.q_proj.weight.grad, a.k_proj.weight.grad, a.v_proj.weight.grad])),
        "wo": (lay.wo.grad, a.o_proj.weight.grad),
        "w_gate_up": (lay.w_gate_up.grad, torch.cat([m.gate_proj.weight.grad, m.up_proj.weight.grad])),
        "w_down": (lay.w_down.grad, m.down_proj.weight.grad),
    }
    for name, (got, want) in pairs.items():
        assert got is not None, name
        torch.testing.assert_close(
            got.double().cpu(), want, atol=TOL * want.abs().max().item(), rtol=TOL, msg=lambda s, n=name: f"{n}: {s}"
        )


def test_rotary_tables_stay_fp32_when_the_layer_is_cast():
    lay = LlamaLayer(**CFG).to(DEV, torch.float16)
    assert lay.cos.dtype == lay.sin.dtype == torch.float32 and lay.wqkv.dtype == torch.float16
    assert lay.cos.device.type == DEV.type


def test_forward_runs_only_the_packages_kernels():
    _, lay = _pair()
    x = torch.randn(2, 5, 64, device=DEV, dtype=DTYPE)
    with torch.no_grad(), LaunchCounter() as counter:
        lay(x)
    assert counter.torch_ops == [], counter.torch_ops
    assert counter.names == [
        "_rmsnorm_kernel", "_matmul_kernel", "_rope_kernel", "_attention_kernel", "_matmul_kernel",
        "_rmsnorm_kernel", "_matmul_kernel", "_swiglu_kernel", "_matmul_kernel",
    ]  # fmt: skip
    assert counter.passes == ["clone"], "one copy: attention's O (B, H, N, D) to o_proj's (B, N, H D) rows"
    parts = llama_layer_ledger(2, 5, dtype=DTYPE, **CFG)
    assert sum(p.fused_kernels for p in parts) == len(counter.names) + len(counter.passes), "the ledger's launches"


def test_layer_ledger_at_llama3_8b():
    parts = {p.name: p for p in llama_layer_ledger(4, 4096, **LLAMA3_8B)}
    T, es = 4 * 4096, 2
    # the matmuls' FLOPs: 2 T K N each, the projections' widths from the heads
    assert parts["q, k, v projections"].flops == 2 * T * 4096 * (32 + 16) * 128
    assert parts["gate, up projections"].flops == 2 * T * 4096 * 2 * 14336
    # fused QKV reads x once, eager three times; weights and outputs alike
    qkv = parts["q, k, v projections"]
    assert qkv.eager_bytes - qkv.fused_bytes == 2 * T * 4096 * es
    # the residual in the epilogue: eager's add reads the matmul's output and r and writes y (3 trips of
    # T x hidden), the epilogue reads r (1): two trips saved
    down = parts["down_proj + residual"]
    assert down.eager_bytes - down.fused_bytes == 2 * T * 4096 * es
    assert all(p.fused_bytes <= p.eager_bytes for p in parts.values())
    assert parts["attention"].predict_ms(700, 3000) == parts["attention"].flops / 700e9


class _AtenOps(TorchDispatchMode):
    """The aten ops a call dispatches, by name, in order (each a kernel on the device)."""

    def __enter__(self):
        self.ops = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is not torch.ops.aten.detach.default:  # autograd's bookkeeping, no kernel
            self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def _rms_norm_ops(device):
    x = torch.randn(3, 64, device=device, dtype=torch.bfloat16)
    w = torch.rand(64, device=device, dtype=torch.bfloat16)
    with _AtenOps() as seen:
        torch.nn.functional.rms_norm(x, (64,), w, 1e-5)
    return seen.ops


@pytest.mark.parametrize("fused", [True, False])
def test_layer_ledger_counts_eager_rms_norm_as_torch_runs_it(fused):
    """The reference's ``F.rms_norm`` on a GPU: one kernel that reads x and w and writes y and each row's fp32
    rstd where torch fuses it, else ``rms_norm_composite``'s eight ops (fp32 between them), as many as torch
    dispatches where it decomposes (this CPU)."""
    T, hid, es = 4 * 4096, 4096, 2
    parts = {p.name: p for p in llama_layer_ledger(4, 4096, **LLAMA3_8B, fused_rms_norm=fused)}
    for name in ("attn_norm", "ffn_norm"):
        norm = parts[name]
        assert norm.fused_bytes == 2 * T * hid * es + hid * es  # the package's kernel in inference: no rstd
        if fused:
            assert (norm.eager_kernels, norm.eager_bytes) == (1, norm.fused_bytes + T * 4)
        else:  # per element: x to fp32 (2 + 4), pow (4 + 4), mean (4), times rstd (4 + 4), times w (4 + 4),
            # to bf16 (4 + 2); per row: mean's write, add eps in place, rsqrt, and rstd read back, 4 each
            assert norm.eager_kernels == len(_rms_norm_ops("cpu")) == 8
            assert norm.eager_bytes == 40 * T * hid + (1 + 2 + 2 + 1) * 4 * T + hid * es
    default = llama_layer_ledger(4, 4096, **LLAMA3_8B)
    want = llama_layer_ledger(4, 4096, **LLAMA3_8B, fused_rms_norm=torch_fuses_rms_norm())
    assert default == want


def test_cpu_rms_norm_is_the_composite_the_ledger_counts():
    """On a CPU ``F.rms_norm`` decomposes: the op-by-op count's steps are the ops torch dispatches."""
    assert _rms_norm_ops("cpu") == ["_to_copy", "pow", "mean", "add_", "rsqrt", "mul", "mul", "_to_copy"]


@gpu_only
@pytest.mark.gpu
def test_fused_rms_norm_rule_matches_the_gpus_dispatch():
    """:func:`torch_fuses_rms_norm` says what ``F.rms_norm`` runs on this GPU: the fused op alone, or the
    composite's ops."""
    ops = _rms_norm_ops("cuda")
    assert (ops == ["_fused_rms_norm"]) == torch_fuses_rms_norm(), ops


def test_decode_steps_match_the_prefill():
    """Tokens decoded one or two at a time through the KV cache give the prefill's outputs, and a batch
    whose rows sit at different cache lengths gives each row its own prefill's last token."""
    ref64, lay = _pair(seed=2)
    B, N, Hkv, D, n_max = 2, 8, 2, 16, 16
    x = torch.randn(B, N, 64).to(DEV, DTYPE)
    with torch.no_grad():
        full = lay(x)
        kc = torch.zeros(B, Hkv, n_max, D, device=DEV, dtype=DTYPE)
        vc = torch.zeros_like(kc)
        lens = torch.zeros(B, dtype=torch.int64, device=DEV)
        outs = []
        for start, stop in ((0, 2), (2, 3), (3, 5)):  # two tokens, one, two
            outs.append(lay.decode(x[:, start:stop], kc, vc, lens))
            lens = lens + (stop - start)
        torch.testing.assert_close(torch.cat(outs, 1), full[:, :5], atol=TOL * 4, rtol=TOL * 4)
        # rows at different lengths: row 0 has 3 tokens cached, row 1 has 5
        kc.zero_(), vc.zero_()
        lay.decode(x[0:1, :3], kc[0:1], vc[0:1], torch.zeros(1, dtype=torch.int64, device=DEV))
        lay.decode(x[1:2, :5], kc[1:2], vc[1:2], torch.zeros(1, dtype=torch.int64, device=DEV))
        lens = torch.tensor([3, 5], device=DEV)
        step = lay.decode(torch.stack([x[0, 3], x[1, 5]])[:, None], kc, vc, lens)
        want = torch.stack([lay(x[0:1, :4])[0, -1], lay(x[1:2, :6])[0, -1]])
        torch.testing.assert_close(step[:, 0], want, atol=TOL * 4, rtol=TOL * 4)
        ref_row1 = ref64(x[1:2, :6].double().cpu())[0, -1]
        _close(step[1, 0], ref_row1, ref_row1.abs().max().item())
        # the reference's own decode step, on float64 caches filled the same way
        kd = torch.zeros(B, Hkv, n_max, D, dtype=torch.float64)
        vd = torch.zeros_like(kd)
        xd = x.double().cpu()
        ref64.decode(xd[0:1, :3], kd[0:1], vd[0:1], torch.zeros(1, dtype=torch.int64))
        ref64.decode(xd[1:2, :5], kd[1:2], vd[1:2], torch.zeros(1, dtype=torch.int64))
        ref_step = ref64.decode(torch.stack([xd[0, 3], xd[1, 5]])[:, None], kd, vd, torch.tensor([3, 5]))
        _close(step, ref_step, ref_step.abs().max().item())


def test_a_tiny_model_trains_like_eager():
    """Three AdamW steps of a two-layer model, fused against eager from the same weights and batches:
    the losses agree at every step (every backward, and the wiring between them, is right)."""
    kw = dict(vocab=32, n_layers=2, hidden=32, n_heads=2, n_kv_heads=1, ffn=48, max_positions=16)
    torch.manual_seed(3)
    eager = TinyLlama(**kw, fused=False).to(DEV)
    fused = TinyLlama(**kw, fused=True).to(DEV).load_reference_state_dict(eager.state_dict())
    dtype = torch.bfloat16 if runtime.is_gpu() else None  # on a GPU attention takes 16-bit activations
    eager.compute_dtype = fused.compute_dtype = dtype
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, fused)]
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        tokens = torch.randint(0, 32, (2, 9), generator=gen).to(DEV)
        losses = []
        for model, opt in zip((eager, fused), opts, strict=True):
            opt.zero_grad()
            with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=dtype is not None and not model.fused):
                loss = model(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        # fp32: the curves agree to ~1e-7; a gradient 10% off in one tensor (RoPE's dq) moves them ~5e-5
        assert abs(losses[1] - losses[0]) <= (2e-2 if dtype else 2e-6) * abs(losses[0]), losses


@pytest.mark.parametrize("how", ["copy", "strided"])
def test_weight_grad_both_ways(how):
    dtype = torch.float16 if runtime.is_gpu() else torch.float32
    for n, k in ((24, 40), (40, 24)):  # dy the narrower, then x
        dy, x = torch.randn(33, n, device=DEV, dtype=dtype), torch.randn(33, k, device=DEV, dtype=dtype)
        got = weight_grad(dy, x, how)
        assert got.shape == (n, k) and got.is_contiguous()
        torch.testing.assert_close(got.double(), dy.double().t() @ x.double(), atol=TOL * 10, rtol=TOL)


def test_decode_step_ledger_counts_the_weights_and_the_cache():
    """One token per row against a 4k cache: the weights are read once per step whatever B, the cache
    once per row; the fused step has one kernel per part (attention: split and combine)."""
    parts = {p.name: p for p in llama_layer_ledger(1, 1, n_cache=4096, **LLAMA3_8B)}
    es, hid, ffn, kv = 2, 4096, 14336, 8 * 128
    weights = (hid * (hid + 2 * kv) + hid * hid + 2 * ffn * hid + ffn * hid) * es
    matmul_parts = ("q, k, v projections", "o_proj + residual", "gate, up projections", "down_proj + residual")
    assert sum(parts[n].fused_bytes for n in matmul_parts) >= weights
    assert sum(parts[n].fused_bytes for n in matmul_parts) < weights * 1.001  # the activations are noise
    cache = 2 * 4096 * kv * es
    att = parts["attention (KV cache)"]
    assert cache < att.fused_bytes < cache * 1.05 and att.eager_bytes >= cache
    rope_part = parts["rope + cache write"]
    assert rope_part.fused_kernels == 1 and rope_part.eager_kernels == 12  # RoPE's ten, two indexed copies
    assert "rope" not in parts and "attention" not in parts and "o to rows (copy)" not in parts


def test_decode_step_launches_what_the_ledger_counts():
    _, lay = _pair()
    x = torch.randn(2, 1, 64, device=DEV, dtype=DTYPE)
    kc, vc = torch.zeros(2, 2, 40, 16, device=DEV, dtype=DTYPE), torch.zeros(2, 2, 40, 16, device=DEV, dtype=DTYPE)
    lens = torch.tensor([3, 30], device=DEV)
    with LaunchCounter() as counter:
        lay.decode(x, kc, vc, lens)
    parts = llama_layer_ledger(2, 1, n_cache=40, dtype=DTYPE, **CFG)
    assert counter.passes == [] and counter.torch_ops == ["add"], (counter.passes, counter.torch_ops)  # len + N
    assert len(counter.names) == sum(p.fused_kernels for p in parts), counter.names


@gpu_only
@pytest.mark.gpu
def test_decode_step_replays_in_a_cuda_graph():
    """The decode step captures (no host sync, no allocation outside the graph's pool) and each replay
    gives the launched step's output and cache writes; the lengths are read on the device, so a replay
    after they move writes at the new positions."""
    _, lay = _pair(seed=5)
    B, n_max = 3, 48
    x = torch.randn(B, 1, 64, device=DEV, dtype=DTYPE)
    kc, vc = (torch.randn(B, 2, n_max, 16, device=DEV, dtype=DTYPE) for _ in range(2))
    lens = torch.tensor([3, 20, 40], device=DEV)
    k_want, v_want = kc.clone(), vc.clone()
    want = lay.decode(x, k_want, v_want, lens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        lay.decode(x, kc.clone(), vc.clone(), lens)  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = lay.decode(x, kc, vc, lens)
    graph.replay()
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    torch.testing.assert_close(kc, k_want, atol=0, rtol=0)
    torch.testing.assert_close(vc, v_want, atol=0, rtol=0)
    lens += 1  # the next step: new positions, the same graph
    lay.decode(x, k_want, v_want, lens)
    graph.replay()
    torch.testing.assert_close(kc, k_want, atol=0, rtol=0)
