"""Lesson 9's benchmark suite, on the CPU: the part thunks it times are built at a tiny size and run through
the interpreter (eager against the package's layer, part by part), and what the lesson reads back from a
run (the parts, the share of tiny ops, the bars) survives the trip through a recording. The timings
themselves are the GPU's (``python -m fusionlab.record --suites lesson9``)."""

from __future__ import annotations

import json

import pytest
import torch

from fusionlab import bench, runtime
from fusionlab.lessons import SUITES, suite_module
from fusionlab.lessons.l9 import suite as s
from fusionlab.model import LLAMA3_8B, llama_layer_ledger

pytestmark = pytest.mark.lesson9

TINY = dict(hidden=64, n_heads=4, n_kv_heads=2, ffn=96, eps=1e-5, rope_base=10000.0)


def test_registered():
    assert "lesson9" in SUITES and suite_module("lesson9") is s


@pytest.mark.skipif(runtime.is_gpu(), reason="the tiny interpreter run; the GPU records the real size")
def test_every_part_computes_the_same_eager_and_fused():
    ref, lay = s.make_layers(64, device="cpu", shapes=TINY, dtype=torch.float32)
    thunks = s.part_thunks(ref, lay, 2, 16, "cpu", dtype=torch.float32)
    names = [p.name for p in llama_layer_ledger(2, 16, **TINY)]
    assert list(thunks) == names  # one pair of thunks per part of the ledger, in its order
    with torch.no_grad():
        for part, pair in thunks.items():
            e, f = pair["eager"](), pair["fused"]()
            if part == "attention":
                f = f[0]  # the package's attention returns (O, lse)
            elif part == "rope":  # eager rotates (B, H, N, D) views, the kernel (B, N, H, D): the same numbers
                e = torch.cat([t.transpose(1, 2).flatten() for t in e])
                f = torch.cat([t.flatten() for t in f])
            elif part in ("q, k, v projections", "gate, up projections"):  # three (two) matmuls, one stacked
                e = torch.cat(e, dim=-1)
            assert torch.allclose(e.flatten(), f.flatten(), atol=1e-4, rtol=1e-4), part


@pytest.mark.skipif(runtime.is_gpu(), reason="the tiny interpreter run")
def test_decode_inputs_run_through_both_layers():
    ref, lay = s.make_layers(64, device="cpu", shapes=TINY, dtype=torch.float32)
    x, kc, vc, lens = s.decode_inputs(3, lay, "cpu", n_cache=40, dtype=torch.float32)
    assert ((lens >= 0) & (lens < 39)).all()
    with torch.no_grad():
        want = ref.decode(x, kc.clone(), vc.clone(), lens)
        got = lay.decode(x, kc.clone(), vc.clone(), lens)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def _fake_run(fused_factor=0.5):
    """A run's results as the recorder writes them: each part eager 1 ms (tiny ops) or 4 ms (matmuls),
    fused ``fused_factor`` of that for tiny ops and the same for matmuls; the layer and decode cases."""
    out = []
    for p in llama_layer_ledger(*s.PREFILL, **LLAMA3_8B):
        base = 1.0 if s.is_tiny(p.name) else 4.0
        for impl, k in (("eager", 1.0), ("fused", fused_factor if s.is_tiny(p.name) else 1.0)):
            out.append(bench.Result(s.part_name(p.name, impl), base * k, 1, p.flops, s.PARTS_GROUP, base * k / 2))
    for impl, ms in (("eager", 13.0), ("compile", 12.0), ("fused", 9.0)):
        out.append(bench.Result(s.layer_name("fwd", impl), ms, group="layer fwd"))
        out.append(bench.Result(s.layer_name("fwd+bwd", impl), 3 * ms, group="layer fwd+bwd"))
        out.append(bench.Result(s.peak_name(impl), 3 * ms, 2**30 * (3 if impl != "fused" else 2), group=s.PEAK_GROUP))
    for B in s.DECODE_BATCHES:
        for impl, ms in zip(s.DECODE_IMPLS, (1.4, 1.2, 0.2, 0.25), strict=True):
            out.append(bench.Result(s.decode_name(B, impl), ms, group=f"decode B={B}"))
    for B, n_k in s.SPLIT_SHAPES:
        for impl, ms in zip(s.SPLIT_IMPLS, (0.05, 0.2, 0.06), strict=True):
            out.append(bench.Result(s.split_name(B, n_k, impl), ms, group=s.SPLIT_GROUP))
    return out


def test_tiny_share_and_bars_read_a_recording(tmp_path):
    results = _fake_run()
    rec = bench.Recorded({"device": "cpu", "date": "2026-01-01"}, bench.Ceilings(1.0, 1.0), {"lesson9": results})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rec.to_json()))
    back = bench.recorded(path).results("lesson9")
    parts = s.parts_from(back)
    assert list(parts) == [p.name for p in llama_layer_ledger(*s.PREFILL, **LLAMA3_8B)]
    tiny = sum(s.is_tiny(p) for p in parts)
    share = s.tiny_share(back)
    big = len(parts) - tiny
    assert share["eager"] == pytest.approx(tiny / (tiny + 4 * big))
    assert share["fused"] == pytest.approx(0.5 * tiny / (0.5 * tiny + 4 * big))
    assert s.tiny_share(back, "predicted_ms")["eager"] == pytest.approx(share["eager"])
    bars = {bar: met for bar, met, _ in s.bars(back)}
    assert len(bars) == 7 and all(bars.values())
    # the package's layer as slow as eager: the forward bars are missed
    slow = [bench.Result(r.name, 13.0 if r.name == s.layer_name("fwd", "fused") else r.ms, r.nbytes) for r in back]
    assert not all(met for _, met, _ in s.bars(slow))


@pytest.mark.parametrize("fused_rms_norm", [True, False])
def test_the_trip_ledger_moves_the_parts_bytes(fused_rms_norm):
    from fusionlab.lessons.l9.ledger import layer_trip_ledger

    shapes = {k: LLAMA3_8B[k] for k in ("hidden", "n_heads", "n_kv_heads", "ffn")}
    led = layer_trip_ledger(*s.PREFILL, **shapes, fused_rms_norm=fused_rms_norm)
    parts = llama_layer_ledger(*s.PREFILL, **shapes, fused_rms_norm=fused_rms_norm)
    assert led.unfused_bytes == sum(p.eager_bytes for p in parts)
    assert led.fused_bytes == pytest.approx(sum(p.fused_bytes for p in parts), rel=1e-2)
    assert len(led.ops) == len(parts) and all(
        f"({p.eager_kernels} kernel" in o.name for p, o in zip(parts, led.ops, strict=True)
    )
    norm = led.ops[0]  # torch's fused norm writes rstd, nothing passes between kernels; op by op, fp32 does
    assert norm.name == ("attn_norm (1 kernel)" if fused_rms_norm else "attn_norm (8 kernels)")
    assert ("attn_norm: rstd" in norm.writes) == fused_rms_norm
    assert ("attn_norm: temporaries" in norm.writes) != fused_rms_norm


def test_the_cases_carry_the_ledgers_counts():
    """Every part, prefill forward and decode step the suite times is counted from the ledger, eager's bytes
    for eager and compile, the fused layer's for the package's."""
    counts = s.ledger_counts(3000.0, 700.0)
    parts = llama_layer_ledger(*s.PREFILL, **LLAMA3_8B)
    for p in parts:
        assert counts[s.part_name(p.name, "eager")] == (p.eager_bytes, p.flops, p.predict_ms(700.0, 3000.0, False))
        assert counts[s.part_name(p.name, "fused")][0] == p.fused_bytes
    assert counts[s.layer_name("fwd", "compile")][0] == sum(p.eager_bytes for p in parts)
    assert counts[s.layer_name("fwd", "fused")][2] == pytest.approx(sum(p.predict_ms(700.0, 3000.0) for p in parts))
    for B in s.DECODE_BATCHES:
        step = llama_layer_ledger(B, 1, **LLAMA3_8B, n_cache=s.N_CACHE)
        assert counts[s.decode_name(B, "fused graph")][0] == sum(p.fused_bytes for p in step)
    assert s.ledger_counts()[s.layer_name("fwd", "eager")][2] is None  # no ceilings, no prediction


@pytest.mark.skipif(runtime.is_gpu(), reason="on a GPU the lesson times live, counted as it times")
def test_a_recording_is_read_against_the_ledger_as_it_counts_now():
    """The recorded runs' counts are their ledger's of the day they ran (eager's RMSNorm op by op then):
    the lesson reads their times against today's count, the times untouched."""
    from fusionlab.lessons import l9

    rec = bench.recorded(suite="lesson9")
    stored = {r.name: r for r in rec.results("lesson9")}
    run = l9.measure()
    counts = s.ledger_counts(run.ceilings.copy_GBps, run.ceilings.matmul_TFLOPs)
    seen = 0
    for r in run.results:
        assert r.ms == stored[r.name].ms
        if r.name in counts:
            seen += 1
            assert (r.nbytes, r.flops, r.predicted_ms) == counts[r.name]
            assert r.GBps == pytest.approx(r.nbytes / r.ms / 1e6) and r.frac_copy == r.GBps / run.ceilings.copy_GBps
        else:
            assert r == stored[r.name]
    assert seen == len(counts)
    norm = run.get(s.part_name("attn_norm", "eager"))
    assert norm.frac_copy < 1, "a part faster than copy by the ledger's count is not the schedule it counts"


def test_the_training_recording_reads_back():
    from fusionlab.lessons.l9.training import training_runs

    runs = training_runs()
    assert runs, "no recorded training run in fusionlab/lessons/l9/"
    for run in runs:
        steps, eager = run.curve("eager")
        _, fused = run.curve("fused")
        assert steps == sorted(steps) and len(eager) == len(fused) > 10
        assert run.worst_rel_diff == pytest.approx(max(abs(f - e) / e for e, f in zip(eager, fused, strict=True)))
        assert run.meta["capability"] != "cpu" and "RECORDED on" in run.label()


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.is_gpu(), reason="needs a CUDA GPU that Triton supports")
def test_the_suites_thunks_on_the_gpu():
    """What the recording times computes what it says: each part fused against eager at the 8B layer's
    shapes (256 tokens), the decode step launched and replayed from its CUDA graph against eager's, and the
    three flash-decoding cases built (split, one split, SDPA)."""
    ref, lay = s.make_layers(s.N_CACHE)
    with torch.no_grad():
        for part, pair in s.part_thunks(ref, lay, 1, 256).items():
            e, f = pair["eager"](), pair["fused"]()
            if part == "attention":
                f = f[0]
            elif part == "rope":
                e = torch.cat([t.transpose(1, 2).flatten() for t in e])
                f = torch.cat([t.flatten() for t in f])
            elif part in ("q, k, v projections", "gate, up projections"):
                e = torch.cat(e, dim=-1)
            assert _rel(f.flatten(), e.flatten()) < 2e-2, part
        x, kc, vc, lens = s.decode_inputs(1, lay)
        want = ref.decode(x, kc.clone(), vc.clone(), lens)
        kf, vf = kc.clone(), vc.clone()
        replay = s.graphed(lambda: lay.decode(x, kf, vf, lens))
        replay()
        assert _rel(lay.decode(x, kf, vf, lens), want) < 2e-2
    cases = s.decode_cases(ref, lay, batches=(1,), impls=("eager", "fused", "fused graph"))
    assert [c.name for c in cases] == [s.decode_name(1, i) for i in ("eager", "fused", "fused graph")]
    split = s.split_cases(3000.0, shapes=((1, 4096),))
    assert [c.name for c in split] == [s.split_name(1, 4096, i) for i in s.SPLIT_IMPLS]
    assert all(c.predicted_ms > 0 for c in split)
