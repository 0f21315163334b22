"""Multi-tensor AdamW (fusionlab/kernels/adamw.py, fusionlab/optim.py): torch's AdamW after 100 steps,
state dicts both ways, one launch a step, the capturable step count, master weights."""

from __future__ import annotations

import copy

import pytest
import torch

from fusionlab import _triton, runtime
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.adamw import adamw_ledger, adamw_reference, multi_tensor_adamw
from fusionlab.lessons.l4b import suite as l4b_suite
from fusionlab.optim import AdamW

DEV = runtime.DEVICE
SHAPES = [(7, 13), (5,), (33, 40)]  # the last spans two interpreter chunks
HP = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


def _params(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(DEV, dtype)) for s in SHAPES]


def _train(opt, ps, steps, seed=2):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).to(DEV, p.dtype)
        opt.step()


def test_matches_torch_adamw_after_100_steps():
    ours, theirs = _params(), _params()
    _train(AdamW(ours, **HP), ours, 100)
    _train(torch.optim.AdamW(theirs, **HP), theirs, 100)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)  # fp32 rounding over 100 steps


def test_one_step_matches_float64_and_maximize():
    for maximize in (False, True):
        ps = _params()
        grads = [torch.randn_like(p) for p in ps]
        ms = [torch.randn_like(p) for p in ps]
        vs = [torch.rand_like(p) for p in ps]
        want = [adamw_reference(p, g, m, v, step=3, lr=0.01, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1,
                                maximize=maximize) for p, g, m, v in zip(ps, grads, ms, vs, strict=True)]  # fmt: skip
        with torch.no_grad():
            multi_tensor_adamw(ps, grads, ms, vs, step=3, lr=0.01, beta1=0.9, beta2=0.99, eps=1e-8,
                               weight_decay=0.1, maximize=maximize)  # fmt: skip
        for p, m, v, (wp, wm, wv) in zip(ps, ms, vs, want, strict=True):
            for got, w in ((p, wp), (m, wm), (v, wv)):
                torch.testing.assert_close(got.detach().double(), w, atol=1e-6, rtol=1e-5)


def test_bias_correction_and_decoupled_decay_matter():
    """The reference is not a strawman: dropping either changes the answer this test asserts."""
    p, g, m, v = (torch.full((4,), x) for x in (1.0, 0.5, 0.0, 0.0))
    kw = dict(lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.5)
    step1, _, _ = adamw_reference(p, g, m, v, step=1, **kw)
    torch.testing.assert_close(step1, torch.full((4,), 1 - 0.1 * 0.5 - 0.1, dtype=torch.float64))  # |update| = lr


def test_state_dict_round_trips_with_torch():
    ours, theirs = _params(), _params()
    o, t = AdamW(ours, **HP), torch.optim.AdamW(theirs, **HP)
    _train(o, ours, 3)
    _train(t, theirs, 3)
    # ours -> torch, torch -> ours: both continue as if nothing happened
    t2_params = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    t2 = torch.optim.AdamW(t2_params, lr=1.0)
    t2.load_state_dict(copy.deepcopy(o.state_dict()))  # torch's load keeps the tensors it is given
    o2_params = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    o2 = AdamW(o2_params, lr=1.0)
    o2.load_state_dict(copy.deepcopy(t.state_dict()))
    assert o2.param_groups[0]["lr"] == HP["lr"] and t2.param_groups[0]["betas"] == HP["betas"]
    assert float(o2.state[o2_params[0]]["step"]) == 3.0
    _train(t2, t2_params, 2, seed=5)
    _train(o2, o2_params, 2, seed=5)
    _train(o, ours, 2, seed=5)
    for a, b, c in zip(ours, t2_params, o2_params, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(c, a, atol=1e-6, rtol=1e-5)
    assert set(o.state_dict()["param_groups"][0]) >= set(t.state_dict()["param_groups"][0])


def test_one_launch_a_step():
    ps = _params()
    opt = AdamW(ps, **HP)
    _train(opt, ps, 1)
    names = []
    with _triton.launch_hook(lambda launch: names.append(launch.name)):
        _train(opt, ps, 2)
    assert names == ["_adamw_kernel", "_adamw_kernel"], names


def test_capturable_keeps_the_step_on_the_device():
    ours, theirs = _params(), _params()
    o = AdamW(ours, capturable=True, **HP)
    _train(o, ours, 12)
    _train(torch.optim.AdamW(theirs, **HP), theirs, 12)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    steps = [o.state[p]["step"] for p in ours]
    assert all(s.device == ours[0].device and float(s) == 12.0 for s in steps)


@pytest.mark.skipif(not runtime.is_gpu(), reason="bf16 needs a GPU (Triton's interpreter has no bfloat16)")
def test_master_weights_bf16():
    ours = _params(torch.bfloat16)
    ref = [torch.nn.Parameter(p.detach().float()) for p in ours]
    o = AdamW(ours, master_weights=True, **HP)
    t = torch.optim.AdamW(ref, **HP)
    g = torch.Generator().manual_seed(2)
    for _ in range(20):
        for a, b in zip(ours, ref, strict=True):
            b.grad = torch.randn(b.shape, generator=g).to(DEV).bfloat16().float()
            a.grad = b.grad.bfloat16()
        o.step()
        t.step()
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(o.state[a]["master"], b.detach(), atol=1e-6, rtol=1e-5)
        assert torch.equal(a.detach(), b.detach().bfloat16())


def test_bad_arguments_are_refused():
    ps = _params()
    with pytest.raises(KernelInputError):
        multi_tensor_adamw(ps, [torch.zeros(1)], [], [], step=1)
    with pytest.raises(KernelInputError, match="step"):
        with torch.no_grad():
            multi_tensor_adamw(ps[:1], [torch.zeros_like(ps[0])], [torch.zeros_like(ps[0])],
                               [torch.zeros_like(ps[0])], step=0)  # fmt: skip
    with pytest.raises(KernelInputError, match="amsgrad"):
        AdamW(ps).load_state_dict({"state": {}, "param_groups": [{**HP, "amsgrad": True, "params": [0, 1, 2]}]})


def test_ledger_counts_seven_trips_fused():
    led = adamw_ledger([1000, 24])
    assert led.fused_bytes == 7 * 1024 * 4
    assert led.unfused_bytes > 2.5 * led.fused_bytes  # the loop's temporaries and re-reads


def test_fast_path_leaves_and_rejoins_with_the_right_count():
    """After the first step a group's step skips the per-tensor work; a param without a gradient sends
    it back to the checked path, whose bias correction must still see every step taken."""
    ours, theirs = _params(), _params()
    o, t = AdamW(ours, **HP), torch.optim.AdamW(theirs, **HP)
    g = torch.Generator().manual_seed(4)
    for i in range(6):
        for a, b in zip(ours, theirs, strict=True):
            grad = torch.randn(a.shape, generator=g).to(DEV)
            a.grad, b.grad = grad.clone(), grad.clone()
        if i == 3:  # no gradient for one tensor this step: both skip it
            ours[1].grad = theirs[1].grad = None
        o.step()
        t.step()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert float(o.state_dict()["state"][0]["step"]) == 6.0 and float(o.state_dict()["state"][1]["step"]) == 5.0


def test_the_lessons_suite_builds_its_adamw_cases():
    # the suite's models are shape lists made on demand (a 1B list is gigabytes): built and stepped here on
    # a tiny one, so a GPU recording is not where a broken case is first found
    cases = l4b_suite.adamw_cases(None, runtime.DEVICE, models={"tiny": lambda: [(4, 3), (5,)]})
    assert [c.name for c in cases] == ["adamw tiny ours", "adamw tiny torch kernel", "adamw tiny foreach"]
    for c in cases:
        c.fn()


def test_the_suite_leaves_out_a_list_the_memory_cannot_hold(capsys):
    # a smaller GPU than the recording's (the 1B list holds ~40 GB): that list is left out with a line, and
    # the run goes on, rather than stopping out of memory; the bars then skip it
    tiny = {"tiny": lambda: [(4, 3), (5,)]}
    need = l4b_suite.adamw_bytes([(4, 3), (5,)], 3)
    assert need == 4 * 8 * 17
    assert l4b_suite.adamw_cases(None, runtime.DEVICE, models=tiny, free_bytes=need - 1) == []
    assert "adamw tiny: left out" in capsys.readouterr().out
    assert len(l4b_suite.adamw_cases(None, runtime.DEVICE, models=tiny, free_bytes=need)) == 3
    big = l4b_suite.adamw_bytes(l4b_suite.llama_1b_shapes(), 3)
    assert 35e9 < big < 45e9  # the docstring's "about 40 GB"


@pytest.mark.skipif(not runtime.is_gpu(), reason="CUDA graphs need a GPU")
def test_capturable_step_replays_in_a_cuda_graph():
    """The capturable step recorded once in a CUDA graph and replayed: each replay is a step (the count
    advanced on the device, bias correction from it), the same weights as torch's AdamW step by step."""
    ours, theirs = _params(), _params()
    o, t = AdamW(ours, capturable=True, **HP), torch.optim.AdamW(theirs, **HP)
    g = torch.Generator().manual_seed(6)
    grads = [[torch.randn(p.shape, generator=g).to(DEV) for p in ours] for _ in range(7)]
    for p in ours:
        p.grad = torch.zeros_like(p)  # the graph reads these buffers: each step copies into them

    def load(i):
        for p, gr in zip(ours, grads[i], strict=True):
            p.grad.copy_(gr)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # steps 1 and 2 outside the graph (state made, kernels compiled)
        for i in range(2):
            load(i)
            o.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o.step()  # recorded, not run
    for i in range(2, 7):
        load(i)
        graph.replay()
    for i in range(7):
        for p, gr in zip(theirs, grads[i], strict=True):
            p.grad = gr.clone()
        t.step()
    torch.cuda.synchronize()
    assert [float(o.state[p]["step"]) for p in ours] == [7.0] * len(ours)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
