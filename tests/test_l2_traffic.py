"""Lesson 1's profiler evidence: ncu's CSV read right (benchmarks/l2_traffic.py), the recording read
right (fusionlab.lessons.l1.traffic). CPU only: the profiling itself runs on a GPU."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fusionlab.lessons.l1 import traffic

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.lesson1


def _script():
    spec = importlib.util.spec_from_file_location("l2_traffic", ROOT / "benchmarks" / "l2_traffic.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# what ncu 2025.3 prints with --csv --print-units base: one row a metric a kernel, thousands separators
_HEAD = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
)


def _row(i, kernel, metric, unit, value):
    return (
        f'"{i}","123","python3","127.0.0.1","{kernel}","1","7","(128, 1, 1)","(8192, 1, 1)","0","9.0",'
        f'"Command line profiler metrics","{metric}","{unit}","{value}"'
    )


_METRICS = [("dram__bytes_read.sum", "byte"), ("dram__bytes_write.sum", "byte"), ("lts__t_bytes.sum", "byte"),
            ("gpu__time_duration.sum", "ns")]  # fmt: skip
_COS = ["268,483,328", "241,420,800", "812,684,160", "124,384"]
CSV = "\n".join(
    ["==PROF== Connected to process 123", _HEAD]
    + [_row(0, "cos_kernel", m, u, v) for (m, u), v in zip(_METRICS, _COS, strict=True)]
    + [
        _row(1, "copy_kernel", m, u, v)
        for (m, u), v in zip(_METRICS, ["1,000", "2,000", "3,000", "4,000"], strict=True)
    ]
    + ["==PROF== Disconnected from process 123"]
)


def test_ncu_csv_is_read_per_kernel_in_launch_order():
    kernels = _script().parse_ncu_csv(CSV)
    assert [k["kernel"] for k in kernels] == ["cos_kernel", "copy_kernel"]
    assert kernels[0]["dram__bytes_read.sum"] == 268_483_328 and kernels[0]["gpu__time_duration.sum"] == 124_384
    assert kernels[1]["lts__t_bytes.sum"] == 3000
    with pytest.raises(ValueError, match="no CSV header"):
        _script().parse_ncu_csv("==PROF== nothing profiled\n")


def _kernel(read, write):
    return {"kernel": "k", "dram_read": read, "dram_write": write, "l2_bytes": read + write, "ns": 1.0}


def test_a_recording_is_read_and_its_shares_computed(tmp_path):
    assert traffic.recorded(directory=tmp_path) is None  # nothing recorded yet: the lesson says so
    n = 2**25
    meta = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-27", "time": "01:00Z", "torch": "2.11.0",
            "triton": "3.6.0", "ncu": "2025.3.1"}  # fmt: skip
    rows = [
        {
            "case": "eager cos().cos()",
            "bytes": n,
            "mode": "warm",
            "per_kernel": [_kernel(n, n // 2), _kernel(n // 8, n)],
        },
        {"case": "fused cos_cos", "bytes": n, "mode": "warm", "per_kernel": [_kernel(n, n)]},
    ]
    (tmp_path / "nvidia-h100-80gb-hbm3-2026-11-27.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    t = traffic.recorded("H100", directory=tmp_path)
    assert t.intermediate_from_hbm(n) == pytest.approx(1 / 8)
    assert t.hbm_over_ledger("fused cos_cos", n) == pytest.approx(1.0)
    assert t.hbm_over_ledger("eager cos().cos()", n) == pytest.approx((n + n / 2 + n / 8 + n) / (4 * n))
    assert "Nsight Compute" in t.label and "2026-11-27" in t.label
    assert traffic.recorded("H200", directory=tmp_path) is None
    with pytest.raises(KeyError):
        t.row("copy", n)


def test_the_regimes_sweep_has_a_size_inside_each_recorded_l2_band():
    # lesson 1's chart needs a point between the launch-bound sizes and the L2's size on every GPU it shows
    from fusionlab.lessons.l1 import regimes

    for path in regimes.RECORDED_FILES:
        data = json.loads(path.read_text())
        reg = regimes.measure(data["meta"]["device"])
        sizes = [4 * 2**k for k in regimes.LOG2_SIZES]
        inside = [b for b in sizes if reg.launch_bytes < b < data["L2_bytes"]]
        assert inside, f"{path.name}: no size of the sweep lies in ({reg.launch_bytes}, {data['L2_bytes']}) bytes"
