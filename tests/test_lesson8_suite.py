"""Lesson 8's benchmark suite, on the CPU: its cases are built and run at a tiny size through the
interpreter (the same code the GPU times), and what the lesson reads back from a run — the peaks, the
determinism probe, the bars — survives the trip through a recording. The timings themselves are the
GPU's (``python -m fusionlab.record --suites lesson8``); the GPU test below runs one shape of the suite
there and checks its gradients against float64.
"""

from __future__ import annotations

import json

import pytest
import torch

from fusionlab import bench, runtime
from fusionlab.lessons import SUITES, suite_module
from fusionlab.lessons.l8 import suite as s

pytestmark = pytest.mark.lesson8


@pytest.fixture
def tiny(monkeypatch):
    """The suite at a size the interpreter runs in seconds, fp16 (the interpreter has no bf16)."""
    monkeypatch.setattr(s, "DTYPE", torch.float16)
    monkeypatch.setattr(s, "HEADS", 2)
    monkeypatch.setattr(s, "TOKEN_HEADS", 64 * 2)
    monkeypatch.setattr(s, "BITS_SHAPE", (16, 64, False))
    monkeypatch.setattr(s, "BITS_RUNS", 3)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)


def test_registered():
    assert "lesson8" in SUITES and suite_module("lesson8") is s


@pytest.mark.skipif(runtime.is_gpu(), reason="the tiny interpreter run; the GPU test below runs the real size")
def test_timing_cases_run_and_predict(tiny):
    cases = s.timing_cases(3000.0, 700.0, device="cpu", dims=(16,), ns=(64,))
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    # ours in both schedules and SDPA's flash backend (cuDNN and eager are absent on a CPU / at this N)
    for impl in ("ours", "atomic", "flash"):
        assert s.case_name(16, 64, True, impl) in names
    ours = next(c for c in cases if c.name == s.case_name(16, 64, False, "ours"))
    # B = TOKEN_HEADS // (N * HEADS) = 1
    assert ours.flops == s.attention_backward_flops(1, 2, 64, 64, 16) and ours.predicted_ms > 0
    dq, dk, dv = ours.fn()  # the backward alone, twice from one forward (the graph is kept)
    again = ours.fn()
    assert all(torch.equal(a, b) for a, b in zip((dq, dk, dv), again, strict=True))


@pytest.mark.skipif(runtime.is_gpu(), reason="the tiny interpreter run")
def test_determinism_probe_round_trips_through_a_recording(tiny, tmp_path):
    cases = s.bits_cases(device="cpu")
    results = [bench.Result(c.name, 1.0, c.nbytes, c.flops, c.group) for c in cases]
    rec = bench.Recorded({"device": "cpu", "date": "2026-01-01"}, bench.Ceilings(1.0, 1.0), {"lesson8": results})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rec.to_json()))
    back = s.bits_from(bench.recorded(path).results("lesson8"))
    # the interpreter runs programs in order: both schedules repeat their bits here
    assert [(b.impl, b.distinct, sum(b.changed.values())) for b in back] == [("ours", 1, 0), ("atomic", 1, 0)]
    assert ("deterministic schedule bit-identical", True, "1 distinct of 3 runs") in s.bars(results)


def test_peaks_and_bars_read_back():
    fake = [
        bench.Result(s.peak_name("eager", 1024), 1.0, 3e8, 0, s.PEAK_GROUP),
        bench.Result(s.peak_name("ours", 1024), 1.0, 5e7, 0, s.PEAK_GROUP),
        bench.Result(s.oom_name(32768), 1.0, 0, 1, s.OOM_GROUP),
        bench.Result(s.peak_name("ours", 32768), 1.0, 2e9, 0, s.PEAK_GROUP),
    ]
    peaks = s.peaks_from(fake)
    assert [(p.variant, p.n, p.peak_bytes) for p in peaks] == [
        ("eager", 1024, 300000000),
        ("ours", 1024, 50000000),
        ("eager", 32768, None),
        ("ours", 32768, 2000000000),
    ]
    timed = [
        bench.Result(s.case_name(64, 1024, False, "ours"), 1.0),
        bench.Result(s.case_name(64, 1024, False, "flash"), 1.2),
        bench.Result(s.case_name(64, 1024, False, "cudnn"), 0.7),
    ]
    got = {bar: met for bar, met, _ in s.bars(timed)}
    assert got == {"backward >= 1.1x SDPA flash": True, "backward >= 0.8x SDPA cudnn": False}


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.is_gpu(), reason="needs a CUDA GPU that Triton supports")
def test_suite_shape_on_gpu_matches_float64():
    """One timing shape as the suite builds it: ours (both schedules) against float64 autograd."""
    from fusionlab.kernels.attention import attention_reference

    q, k, v, do = s.qkv_do(1, 4, 1000, 128, seed=3)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    o64, _ = attention_reference(*leaves, causal=True)
    want = torch.autograd.grad(o64, leaves, do.double())
    for impl in ("ours", "atomic"):
        got = s.backward_thunk(s._forwards()[impl], q, k, v, do, True)()
        for g, w in zip(got, want, strict=True):
            assert ((g.double() - w).norm() / w.norm()).item() < 2e-2, impl


def test_memory_bar_counts_what_the_schedule_adds():
    # O, dQ, dK, dV in bf16 and lse in fp32: 2 GiB of outputs at N = 131072, 16 heads of 128
    assert s.returned_bytes(131072) == 4 * 16 * 131072 * 128 * 2 + 16 * 131072 * 4
    peak = 2164260864  # both 2026-11-26 recordings: 2.016 GiB beyond q, k, v and dO
    within = [bench.Result(s.peak_name("ours", 131072), 1.0, peak, 0, s.PEAK_GROUP)]
    (bar, met, detail), *_ = s.bars(within)
    assert bar.startswith("N = 131072") and met and detail.startswith("8.0 MiB")
    over = [bench.Result(s.peak_name("ours", 131072), 1.0, s.returned_bytes(131072) + 3 * 2**30, 0, s.PEAK_GROUP)]
    assert not s.bars(over)[0][1]
    assert s.peaks_from(within)[0].workspace_bytes == 2**23


def test_live_cases_are_the_backward_timings_at_the_live_sizes(monkeypatch):
    seen = {}
    monkeypatch.setattr(s, "timing_cases", lambda *a, **k: seen.update(k) or [])
    assert s.cases(live=True) == []
    assert seen["ns"] == s.LIVE_NS and seen["dims"] == s.LIVE_DIMS and seen["fwd_bwd"] is False


def test_hopper_recordings_read_back(tmp_path):
    from fusionlab.lessons.l8 import hopper

    dev = {"kind": "device", "name": "GPU X", "torch": "2.11", "triton": "3.6", "date": "2026-11-27"}
    fp8 = [
        dev,
        {"kind": "gate", "o": 0.04, "lse": 0.02, "o_kernel": 0.015, "o_bf16": 0.003, "ok": True},
        {"kind": "gate", "o": 0.05, "lse": 0.03, "o_kernel": 0.02, "o_bf16": 0.004, "ok": True},
        {"kind": "time", "d": 128, "n": 4096, "causal": False, "speedup": 1.5, "speedup_with_quant": 1.1,
         "bf16_tflops": 500.0, "fp8_tflops": 750.0},
        {"kind": "time", "d": 128, "n": 8192, "causal": True, "error": "did not build"},
    ]  # fmt: skip
    ws = [
        dev,
        {"kind": "package", "d": 128, "n": 4096, "dtype": "bf16", "tflops": 500.0, "err": 1e-3, "nonfinite": 0},
        {"kind": "tutorial", "d": 128, "n": 4096, "dtype": "bf16", "block_n": 64, "stages": 3, "ws": False,
         "tflops": 450.0, "err": 1e-3, "nonfinite": 0},
        {"kind": "tutorial", "d": 128, "n": 4096, "dtype": "bf16", "block_n": 64, "stages": 3, "ws": True,
         "tflops": 550.0, "err": 1e-3, "nonfinite": 0},
        {"kind": "tutorial", "d": 128, "n": 4096, "dtype": "bf16", "block_n": 64, "stages": 4, "ws": True,
         "tflops": 900.0, "err": float("nan"), "nonfinite": 12},
        {"kind": "tutorial", "d": 128, "n": 4096, "dtype": "bf16", "block_n": 128, "stages": 4, "ws": True,
         "error": "OutOfResources"},
        {"kind": "fp8", "d": 128, "n": 4096, "dtype": "bf16", "tile": [128, 128, 8, 3], "ws": True, "tflops": 700.0},
        {"kind": "fp8", "d": 128, "n": 4096, "dtype": "bf16", "tile": [128, 128, 8, 3], "ws": False, "tflops": 650.0},
    ]  # fmt: skip
    (tmp_path / "fp8-gpu-x-2026-11-27.json").write_text(json.dumps(fp8))
    (tmp_path / "ws-gpu-x-2026-11-27.json").write_text(json.dumps(ws))
    (rec,) = hopper.recordings("fp8", tmp_path)
    assert rec.label() == "recorded 2026-11-27 on GPU X, torch 2.11, triton 3.6"
    s8 = hopper.fp8_summary(rec)
    assert [t["n"] for t in s8["times"]] == [4096] and s8["gate_passed"]
    assert s8["gate"] == {"o": 0.05, "lse": 0.03, "o_kernel": 0.02, "o_bf16": 0.004}
    (w,) = hopper.ws_summary(hopper.recordings("ws", tmp_path)[0])
    # the fast configuration with non-finite values is never the best: it is listed as bad, with the one
    # that did not compile
    assert w["ws"]["tflops"] == 550.0 and w["plain"]["tflops"] == 450.0 and w["package"]["tflops"] == 500.0
    assert len(w["bad"]) == 2
    (f8,) = hopper.ws_fp8(hopper.recordings("ws", tmp_path)[0])
    assert f8["tile"] == (128, 128, 8, 3) and f8["ws"]["tflops"] == 700.0 and f8["plain"]["tflops"] == 650.0


def test_fp8_bar_reads_the_forward_pairs():
    res = []
    for n in s.FP8_ATTN_NS:
        for causal in (False, True):
            res.append(bench.Result(s.fp8_attention_name(n, causal, "bf16"), 1.5, 1, 1, s.FP8_ATTN_GROUP))
            res.append(bench.Result(s.fp8_attention_name(n, causal, "fp8"), 1.0 if n > 4096 else 1.2, 1, 1, "x"))
    (bar, met, detail), *_ = s.bars(res)
    assert bar.startswith("FP8 forward >= 1.4x") and not met
    assert detail == "2 of 4 shapes; worst 1.25x at D=128 N=4096 full"
