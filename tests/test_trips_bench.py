"""fusionlab.benchcli: the bench command on the CPU (recorded results) and its counters on a GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import ncu_or_skip

from fusionlab import __main__ as cli
from fusionlab import bench, benchcli, runtime
from fusionlab.bench import Ceilings, Result

CEIL = Ceilings(copy_GBps=4000.0, matmul_TFLOPs=700.0, vector_TFLOPs=60.0)


def test_on_a_cpu_the_bench_shows_the_recorded_run_labelled(tmp_path, capsys):
    if runtime.is_gpu():
        pytest.skip("on a GPU the bench measures; the recorded view is the CPU's")
    assert cli.main(["bench", "--lesson", "1", "--op", "cos", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "RECORDED on" in out and "not measured on this machine" in out
    (js,) = tmp_path.glob("bench-recorded-*-lesson1.json")
    data = json.loads(js.read_text())
    rows = data["suites"]["lesson1"]["rows"]
    rec = bench.recorded(suite="lesson1")
    assert data["source"] == "recorded" and data["suites"]["lesson1"]["label"] == rec.label()
    assert data["suites"]["lesson1"]["ceilings"]["copy_GBps"] == rec.ceilings.copy_GBps
    assert rows and all("cos" in r["name"] or "cos" in r["group"] for r in rows)
    fused = next(r for r in rows if r["name"] == "triton cos_cos (fused)")
    assert fused["pct_copy"] == pytest.approx(100 * rec.get("lesson1", fused["name"]).frac_copy)
    assert fused["ledger_bytes"] == rec.get("lesson1", fused["name"]).nbytes


def test_op_words_all_match_and_unknown_lessons_say_which_exist():
    assert benchcli.matches("triton cos_cos (fused)", "cos", "cos fused")
    assert not benchcli.matches("eager cos", "cos", "cos fused")
    assert benchcli.matches("anything", "", None)
    with pytest.raises(SystemExit, match="no lesson 99"):
        benchcli.suites_for(99)


def test_a_row_puts_counted_bytes_beside_the_ledger_and_leaves_peak_memory_alone():
    r = Result("fused", 1.0, nbytes=4e9, flops=2e12, group="linear", GBps=4000.0, TFLOPs=2.0)
    row = benchcli.row(r, CEIL, {"fused": {"all": {"dram_read": 2.1e9, "dram_write": 1.9e9}, "schedule_bytes": 4e9}})
    assert row["pct_copy"] == pytest.approx(100) and row["pct_matmul"] == pytest.approx(100 * 2 / 700)
    assert row["dram_bytes"] == pytest.approx(4e9) and row["ledger_bytes"] == 4e9
    peak = benchcli.row(Result("peak ours", 1.0, nbytes=1e9, group="peak memory", GBps=1.0), CEIL)
    assert peak["pct_copy"] is None and peak["ledger_bytes"] is None
    assert "1.00x" in benchcli.table([row])
    vector = benchcli.row(
        Result("rms fwd fused", 1.0, nbytes=4e9, flops=4e9, group="rms", GBps=4000.0, TFLOPs=0.004), CEIL
    )
    assert vector["pct_matmul"] is None and vector["pct_copy"] == pytest.approx(100)


def test_the_roofline_keeps_each_groups_fastest_when_crowded_and_names_each_roof():
    roofs = [("tensor", 700.0), ("vector", 60.0)]
    rows = [
        {"name": f"fma k={k}", "group": "fma", "flops": k * 1e9, "ledger_bytes": 1e9, "TFLOPs": k / 10}
        for k in range(1, 20)
    ] + [{"name": "cuBLAS matmul", "group": "mm", "flops": 1e12, "ledger_bytes": 1e9, "TFLOPs": 600.0}]
    points = benchcli.roofline_points(rows, roofs)
    assert points == [("fma k=19", 19.0, 1.9, "vector"), ("cuBLAS matmul", 1000.0, 600.0, "tensor")]
    assert len(benchcli.roofline_points(rows[:3], roofs)) == 3


def test_recorded_trips_are_read_newest_first(tmp_path, monkeypatch):
    monkeypatch.setattr(benchcli, "TRIPS_DIR", tmp_path)
    for date, dram in (("2026-11-20", 1.0), ("2026-11-26", 2.0)):
        meta = {"device": "NVIDIA H200", "date": date, "time": "00:00:00Z"}
        cases = {"fused": {"all": {"dram_read": dram, "dram_write": 0.0}}}
        data = {"schema": benchcli.TRIPS_SCHEMA, "meta": meta, "parts": {"lesson1": cases}, "missing": {}}
        (tmp_path / f"h200-{date}.json").write_text(json.dumps(data))
    meta, cases = benchcli.recorded_trips("lesson1", "H200")
    assert meta["date"] == "2026-11-26" and cases["fused"]["all"]["dram_read"] == 2.0
    assert benchcli.recorded_trips("lesson1", "H100") is None
    assert benchcli.recorded_trips("lesson2") is None


def test_the_progress_bar_counts_to_the_end(capsys):
    import io

    s = io.StringIO()
    p = benchcli.Progress(2, stream=s, width=4)
    p.step("a")
    p.step("b")
    assert "[##..] 1/2 a" in s.getvalue() and s.getvalue().rstrip().endswith("b") and "[####] 2/2" in s.getvalue()


# -- on a GPU with ncu --------------------------------------------------------------------------------------
def test_gpu_lesson1_counters_match_each_schedules_ledger():
    """Fused cos_cos moves its fused ledger, eager cos().cos() its unfused one (each within 3%: the writes
    may fall short by the output's tail still in L2)."""
    ncu_or_skip(triton_gpu=True)
    trips = benchcli.measure_trips("lesson1", ["triton cos_cos (fused)", "eager cos().cos()"])
    fused, eager = trips["triton cos_cos (fused)"], trips["eager cos().cos()"]
    f, e = fused["all"], eager["all"]
    assert f["dram_read"] + f["dram_write"] == pytest.approx(fused["schedule_bytes"], rel=0.03)
    assert e["dram_read"] + e["dram_write"] == pytest.approx(eager["schedule_bytes"], rel=0.03)
    assert eager["schedule_bytes"] == pytest.approx(2 * fused["schedule_bytes"])
    assert len(e["kernels"]) == 2 and len(f["kernels"]) == 1
    torch.cuda.empty_cache()


def test_a_suites_counters_are_summed_case_by_case(monkeypatch):
    from fusionlab.measure import ncu

    calls = []

    def fake_profile(target, suite, *names, cache_control, timeout):
        calls.append((target, suite, names, cache_control))
        info = [
            {"name": "fused", "group": "g", "ledger_bytes": 8.0, "schedule_bytes": 8.0},
            {"name": "eager", "group": "g", "ledger_bytes": 8.0, "schedule_bytes": 16.0},
        ]
        Path(os.environ["FUSIONLAB_NCU_CASES"]).write_text(json.dumps(info))
        k = lambda name, r, w: ncu.KernelCounters(name, r, w, r + w, 10.0)  # noqa: E731
        warm = 0.5 if cache_control == "none" else 1.0
        return [k(ncu.MARKER, 0, 0), k("void f<4>(int)", 4 * warm, 4), k(ncu.MARKER, 0, 0), k("a", 4, 4), k("b", 4, 4)]

    monkeypatch.setattr(ncu, "profile", fake_profile)
    trips = benchcli.measure_trips("lesson1", cache_controls=("all", "none"))
    assert [c[0] for c in calls] == ["fusionlab.benchcli:suite_thunk"] * 2 and calls[1][3] == "none"
    fused, eager = trips["fused"], trips["eager"]
    f, e = fused["all"], eager["all"]
    assert (f["dram_read"], f["dram_write"], f["time_ns"]) == (4, 4, 10)
    assert fused["none"]["dram_read"] == 2 and f["kernels"][0]["name"] == "f"
    assert e["dram_read"] + e["dram_write"] == eager["schedule_bytes"] == 16
    assert [k["name"] for k in e["kernels"]] == ["a", "b"] and "FUSIONLAB_NCU_CASES" not in os.environ


def test_a_crowded_roofline_numbers_its_points_and_no_two_labels_overlap():
    from fusionlab.viz import roofline_figure

    roofs = [("tensor", 700.0), ("vector", 60.0)]
    # twelve points, pairs of them on one spot, the pairs half a step apart on the x axis
    points = [(f"case {i}", 200.0 * (1.5 ** (i // 2)), 300.0 + 10 * (i // 2), "tensor") for i in range(12)]
    fig = roofline_figure(4000.0, roofs, points, "TEST GPU", numbered=True)
    chart, key = fig.axes
    assert [t.get_text() for t in key.texts][:2] == [" 1  case 0", " 2  case 1"]
    labels = [t for t in chart.texts if t.get_text()[:1].isdigit() and "FLOP" not in t.get_text()]
    assert "1, 2" in [t.get_text() for t in labels]  # one spot, one label
    r = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for t in labels]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def test_the_bench_starts_no_suite_past_its_budget_or_one_its_recorded_time_would_overrun():
    est = {"lesson7": 120.0}
    assert benchcli.left_out_by_budget("lesson7", 100.0, None, est) is None
    assert benchcli.left_out_by_budget("lesson7", 100.0, 600.0, est) is None
    assert "took 120 s" in benchcli.left_out_by_budget("lesson7", 500.0, 600.0, est)
    assert benchcli.left_out_by_budget("lesson2", 500.0, 600.0, est) is None  # never timed: it starts
    assert "was spent" in benchcli.left_out_by_budget("lesson2", 600.0, 600.0, est)
    assert "the longest suite so far took 150 s" in benchcli.left_out_by_budget("lesson2", 500.0, 600.0, est, 150.0)


def test_the_whole_bench_time_is_read_back_per_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(benchcli, "BENCH_TIME_DIR", tmp_path)
    assert cli.main(["bench", "--timings"]) == 1 and "no bench timed yet" in capsys.readouterr().out
    for device, date, total in (
        ("NVIDIA H100 80GB HBM3", "2026-11-26", 400.0),
        ("NVIDIA H100 80GB HBM3", "2026-11-27", 300.0),
    ):
        meta = {"device": device, "date": date, "time": "03:10:00Z", "torch": "2.11.0", "triton": "3.6.0"}
        t = {"meta": meta, "budget_s": 600, "total_s": total, "ncu": False, "wall_s": {"lesson1": 20.0}, "left_out": []}
        (tmp_path / f"bench-time-h100-{date}.json").write_text(json.dumps(t))
    assert [t["total_s"] for t in benchcli.bench_timings("H100")] == [400.0, 300.0]
    assert benchcli.bench_timings("H200") == []
    assert cli.main(["bench", "--timings", "--device", "H100"]) == 0
    out = capsys.readouterr().out
    assert "2026-11-27, torch 2.11.0, triton 3.6.0: the whole bench took 5.0 min (budget 10 min) — lesson1 20 s" in out
