"""The recorded trips read back (fusionlab.measure.recorded) and what lessons 1 and 4 say from them.

The recording here is synthetic, written by :func:`synthetic` in the format ``benchmarks/record_trips.py``
writes (schema 2): its numbers are chosen to make each reader's answer known in advance (an eager
softmax that makes the ledger's trips slowly, an online softmax whose second read leaves the L2 past
the cliff), not measured.
"""

from __future__ import annotations

import json

import pytest

from fusionlab.lessons import l4
from fusionlab.lessons.l1 import traffic
from fusionlab.measure import recorded

MiB = 2**20
L2 = 50 * MiB


def _k(name, read, write, l2, ns=100_000.0):
    return {"name": name, "dram_read": read, "dram_write": write, "l2_bytes": l2, "time_ns": ns, "case": ""}


def _counted(*kernels):
    return {
        "dram_read": sum(k["dram_read"] for k in kernels),
        "dram_write": sum(k["dram_write"] for k in kernels),
        "l2_bytes": sum(k["l2_bytes"] for k in kernels),
        "time_ns": sum(k["time_ns"] for k in kernels),
        "kernels": list(kernels),
    }


def _regimes() -> dict:
    out = {}
    for nbytes in (16 * MiB, 1024 * MiB):
        inside = nbytes < L2
        out[f"flush before eager cos().cos() {nbytes}"] = {"name": "f", "group": recorded.FLUSH}
        for call in ("first", "again"):
            # the second kernel of the repeated call finds t1 in L2 inside the band, in HBM past it
            t1_from_hbm = 0.02 * nbytes if inside and call == "again" else nbytes
            eager = [_k("cos", nbytes, nbytes, 2 * nbytes), _k("cos", t1_from_hbm, nbytes, 2 * nbytes)]
            fused_read = 0.01 * nbytes if inside and call == "again" else nbytes
            for group, kernels, sched in (
                ("eager cos().cos()", eager, 4 * nbytes),
                ("fused cos_cos", [_k("_cos_kernel", fused_read, nbytes, 2 * nbytes)], 2 * nbytes),
            ):
                out[f"{group} {nbytes} {call}"] = {
                    "name": f"{group} {nbytes} {call}",
                    "group": group,
                    "ledger_bytes": 2 * nbytes,
                    "schedule_bytes": sched,
                    "tensor_bytes": nbytes,
                    "call": call,
                    "all": _counted(*[_k(k["name"], nbytes, nbytes, 2 * nbytes) for k in kernels]),
                    "none": _counted(*kernels),
                }
    return out


def _eager_softmax() -> dict:
    x = 256 * MiB
    cases = {
        "torch.softmax 32768x4096": _counted(_k("cunn_SoftMaxForward", x, x - 20 * MiB, 3 * x, 250_000.0)),
        "softmax fused 32768x4096": _counted(_k("_softmax_kernel", x, x - 20 * MiB, 2 * x, 110_000.0)),
    }
    return {
        n: {"name": n, "group": n.split()[0], "ledger_bytes": 2 * x, "schedule_bytes": 2 * x, "all": c}
        for n, c in cases.items()
    }


def _cliff() -> dict:
    out = {}
    for n in (65536, 1048576):
        rows, x = 2**27 // n, 2**28
        past = 132 * 2 * n > L2
        for sched, reads in (("one program a row", 2 if past else 1), ("split rows", 1)):
            name = f"softmax {sched} n={n}"
            out[name] = {
                "name": name,
                "group": "softmax",
                "ledger_bytes": (3 if sched.startswith("one") else 2) * x,
                "schedule_bytes": (3 if sched.startswith("one") else 2) * x,
                "rows": rows,
                "n": n,
                "row_bytes": 2 * n,
                "all": _counted(_k("_softmax_kernel", reads * x, x, 3 * x)),
            }
    out["softmax one program a row n=4194304"] = {"name": "x", "group": "softmax", "error": "OutOfResources: no"}
    return out


def synthetic(device="NVIDIA H100 80GB HBM3", date="2026-11-26", time="23:00:00Z") -> dict:
    meta = {
        "device": device,
        "capability": "9.0",
        "date": date,
        "time": time,
        "torch": "2.11.0",
        "triton": "3.6.0",
        "cuda": "13.0",
        "python": "3.12.3",
        "command": "python benchmarks/record_trips.py",
        "ncu": "Version 2025.3.1.0",
        "L2_bytes": L2,
        "SMs": 132,
    }
    parts = {"regimes": _regimes(), "eager_softmax": _eager_softmax(), "cliff": _cliff()}
    return {"schema": recorded.SCHEMA, "meta": meta, "metrics": [], "parts": parts, "missing": {}}


@pytest.fixture
def trips_dir(tmp_path, monkeypatch):
    (tmp_path / "h100-old.json").write_text(json.dumps(synthetic(date="2026-11-20")))
    (tmp_path / "h100.json").write_text(json.dumps(synthetic()))
    monkeypatch.setattr(recorded, "TRIPS_DIR", tmp_path)
    return tmp_path


def test_the_newest_part_of_a_device_is_read_with_its_label(trips_dir):
    part = recorded.newest("eager_softmax", "H100", trips_dir)
    assert part.meta["date"] == "2026-11-26" and part.name == "eager_softmax"
    assert "RECORDED with Nsight Compute (Version 2025.3.1.0) on NVIDIA H100 80GB HBM3, 2026-11-26" in part.label
    assert "torch 2.11.0, triton 3.6.0" in part.label
    assert recorded.newest("eager_softmax", "H200", trips_dir) is None
    assert recorded.newest("lesson7", None, trips_dir) is None
    assert "python benchmarks/record_trips.py lesson7" in recorded.missing_message("lesson7", "H200")


def test_cases_that_could_not_run_or_only_flush_are_left_out_and_say_why(trips_dir):
    cliff = recorded.newest("cliff", None, trips_dir)
    assert all("4194304" not in n for n in cliff.names())
    with pytest.raises(KeyError, match="OutOfResources"):
        cliff.dram("softmax one program a row n=4194304")
    reg = recorded.newest("regimes", None, trips_dir)
    assert not any(n.startswith("flush") for n in reg.names())
    with pytest.raises(KeyError, match="'none'"):
        recorded.newest("eager_softmax", None, trips_dir).dram("torch.softmax 32768x4096", recorded.WARM)


def test_lesson1_reads_t1_from_the_l2_inside_the_band_and_from_hbm_past_it(trips_dir):
    t = traffic.recorded("H100", trips_dir)
    assert t.sizes() == [16 * MiB, 1024 * MiB]
    assert t.intermediate_from_hbm(16 * MiB) == pytest.approx(0.02)
    assert t.intermediate_from_hbm(1024 * MiB) == pytest.approx(1.0)
    # eager's repeated call inside the band: (x + t1 written + 0.02 t1 read + y) over four tensors' worth
    assert t.hbm_over_ledger("eager cos().cos()", 16 * MiB) == pytest.approx(3.02 / 4)
    assert t.hbm_over_ledger("fused cos_cos", 1024 * MiB) == pytest.approx(1.0)
    assert t.hbm_over_ledger("fused cos_cos", 16 * MiB, recorded.FLUSHED) == pytest.approx(1.0)
    assert t.l2_over_ledger("fused cos_cos", 16 * MiB) == pytest.approx(1.0)
    assert traffic.recorded("H200", trips_dir) is None


def test_lesson4_says_eager_softmax_makes_the_ledgers_trips_slowly(trips_dir):
    part = recorded.newest("eager_softmax", "H100")
    verdict = l4.eager_softmax_verdict(part, 32768, 4096)
    assert "0.96× the ledger's bytes" in verdict and "1.50× through L2" in verdict
    assert "its excess is time, not bytes" in verdict and "2.27× the fused kernel's" in verdict
    more = json.loads(json.dumps(part.cases))
    more["torch.softmax 32768x4096"]["all"]["dram_read"] *= 2
    part2 = recorded.Part(part.name, part.meta, more)
    assert "trips the ledger does not count" in l4.eager_softmax_verdict(part2, 32768, 4096)
    table = l4.describe_counters(part)
    assert "torch.softmax 32768x4096" in table and "RECORDED with Nsight Compute" in table


def test_lesson4s_cliff_table_reads_x_twice_only_past_the_l2(trips_dir):
    table = l4.cliff_table(recorded.newest("cliff"), L2, 132)
    rows = [r for r in table.splitlines() if r.startswith("| 65536") or r.startswith("| 1048576")]
    assert rows[0].split("|")[3].strip() == "yes" and rows[0].split("|")[4].strip() == "1.00×"
    assert rows[1].split("|")[3].strip() == "no" and rows[1].split("|")[4].strip() == "2.00×"
    assert rows[1].split("|")[6].strip() == "1.00×"  # the split schedule reads once wherever


def test_another_schema_is_refused(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"schema": 1, "meta": {}, "cases": []}))
    with pytest.raises(ValueError, match="schema 1"):
        recorded.runs(tmp_path)


def test_lesson1s_kernels_are_drawn_measured_beside_the_ledger(trips_dir):
    from fusionlab.viz import measured_figure

    t = traffic.recorded("H100", trips_dir)
    rows = t.kernel_rows([16 * MiB])
    assert [r[0] for r in rows] == ["eager kernel 1, 16.00 MiB", "eager kernel 2, 16.00 MiB", "fused, 16.00 MiB"]
    assert rows[1][1] == 32 * MiB and rows[1][2] == pytest.approx(16 * MiB + 0.02 * 16 * MiB)
    fig = measured_figure([], rows, "eager against fused", t.label)
    texts = [x.get_text() for ax in fig.axes for x in ax.texts]
    assert "−15.68 MiB (−49.0%)" in texts  # the second kernel: t1 from L2, not HBM


def test_bench_trips_shows_each_recorded_part_labelled_and_says_which_are_missing(trips_dir, capsys):
    from fusionlab import benchcli

    assert benchcli.show_trips(["eager_softmax", "cliff", "lesson7"], None, trips_dir) == 2
    out = capsys.readouterr().out
    assert "[eager_softmax] RECORDED with Nsight Compute" in out and "torch.softmax 32768x4096" in out
    assert "could not run: OutOfResources" in out
    assert "[lesson7] The counters of 'lesson7' are not recorded yet" in out


def test_a_summary_puts_hbm_beside_l2_for_each_case_that_ran(trips_dir):
    part = recorded.newest("eager_softmax", None, trips_dir)
    text = part.summary(["torch.softmax 32768x4096", "softmax fused 32768x4096", "absent"])
    assert "torch.softmax 32768x4096  HBM  0.96× its ledger, through L2  1.50×" in text
    assert "absent" not in text and text.endswith(part.label)


def test_a_later_recording_of_the_unflushed_runs_is_read_together_with_the_flushed_one(tmp_path):
    flushed = synthetic(date="2026-11-26")
    for c in flushed["parts"]["eager_softmax"].values():
        c.pop("none", None)
    later = synthetic(date="2026-11-27")
    later["parts"] = {"eager_softmax": {n: {**{k: v for k, v in c.items() if k != "all"}, "none": c["all"]}
                                        for n, c in flushed["parts"]["eager_softmax"].items()}}  # fmt: skip
    (tmp_path / "a.json").write_text(json.dumps(flushed))
    (tmp_path / "b.json").write_text(json.dumps(later))
    part = recorded.newest("eager_softmax", "H100", tmp_path)
    name = "torch.softmax 32768x4096"
    assert part.dram(name, recorded.FLUSHED) == part.dram(name, recorded.WARM) > 0
    assert part.meta["date"] == "2026-11-27" and "2026-11-27 and 2026-11-26" in part.label
    other = synthetic(device="NVIDIA H200", date="2026-11-28")  # another device's never fills in
    (tmp_path / "c.json").write_text(json.dumps(other))
    assert recorded.newest("eager_softmax", "H100", tmp_path).dates == ("2026-11-27", "2026-11-26")


def test_a_lesson_shows_its_devices_recording_else_another_named_as_such(tmp_path):
    (tmp_path / "h200.json").write_text(json.dumps(synthetic(device="NVIDIA H200", date="2026-11-26")))
    (tmp_path / "h100.json").write_text(json.dumps(synthetic(date="2026-11-25")))
    assert recorded.for_device("cliff", "NVIDIA H100 80GB HBM3", tmp_path).device == "NVIDIA H100 80GB HBM3"
    assert recorded.for_device("cliff", "H200", tmp_path).device == "NVIDIA H200"
    (tmp_path / "h100.json").unlink()
    part = recorded.for_device("cliff", "NVIDIA H100 80GB HBM3", tmp_path)
    assert part.device == "NVIDIA H200" and "on NVIDIA H200 (none recorded on NVIDIA H100 80GB HBM3 yet)" in part.label
    assert recorded.for_device("lesson7", "H100", tmp_path) is None


def test_lesson1_shows_another_devices_regimes_named_where_this_one_has_none(tmp_path, monkeypatch):
    from fusionlab import benchcli

    if benchcli.runtime.is_gpu():
        pytest.skip("on a GPU the regimes are counted here where ncu works")
    (tmp_path / "h200.json").write_text(json.dumps(synthetic(device="NVIDIA H200")))
    monkeypatch.setattr(benchcli, "TRIPS_DIR", tmp_path)
    t = traffic.here_or_recorded("NVIDIA H100 80GB HBM3")
    assert isinstance(t, traffic.Traffic) and t.sizes() == [16 * MiB, 1024 * MiB]
    assert "on NVIDIA H200 (none recorded on NVIDIA H100 80GB HBM3 yet)" in t.label
