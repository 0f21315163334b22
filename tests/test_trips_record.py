"""The trips suite's recorder (``benchcli.record_trips``, ``benchmarks/record_trips.py``) on a CPU, with a
stand-in for ncu: a script that writes what a target of several cases writes (their infos, one that could
not run among them) and prints a raw-page CSV of marker and case kernels, different with and without a
flush. What is checked: one file a device and day with its schema, device, date and versions; counters
filed under each case and cache setting; a failed case kept with its error; a budget that runs out, an
ncu that fails and one that hangs (killed with its child) each listed as missing, the rest still written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import ncu_or_skip

from fusionlab import benchcli, runtime
from fusionlab.measure import ncu

# the details page, as ncu printed it on the lent H200 (2026-11-26): one row a metric a kernel
HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
)

FAKE = r"""#!{python}
import json, os, sys, time
args = sys.argv[1:]
if "--version" in args:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.1.0 (fake)")
    raise SystemExit(0)
mode = os.environ.get("FAKE_NCU_MODE", "ok")
if mode == "hang":
    open(os.environ["FAKE_NCU_PIDFILE"], "w").write(str(os.getpid()))
    time.sleep(60)
if mode == "fail":
    print("==ERROR== the application crashed", file=sys.stderr)
    raise SystemExit(3)
cc = args[args.index("--cache-control") + 1]
infos = [
    {{"name": "fused", "group": "g", "ledger_bytes": 2000, "schedule_bytes": 2000}},
    {{"name": "eager", "group": "g", "ledger_bytes": 2000, "schedule_bytes": 4000}},
    {{"name": "too big", "group": "g", "ledger_bytes": 1, "schedule_bytes": 1, "error": "OutOfMemoryError: no"}},
]
open(os.environ["FUSIONLAB_NCU_CASES"], "w").write(json.dumps(infos))
warm = 0.5 if cc == "none" else 1.0
rows = [("_fusionlab_case_marker", 0, 0, 10), ("_cos_kernel", 1000 * warm, 990, 4000),
        ("_fusionlab_case_marker", 0, 0, 10), ("vectorized_elementwise_kernel", 2000, 1980, 3000),
        ("vectorized_elementwise_kernel", 2000 * warm, 1980, 3000)]
print("==PROF== Disconnected from process 1")
print({header!r})
for i, (name, r, w, l2) in enumerate(rows):
    for metric, unit, v in (("dram__bytes_read.sum", "byte", r), ("dram__bytes_write.sum", "byte", w),
                            ("gpu__time_duration.sum", "nsecond", 1000), ("lts__t_bytes.sum", "byte", l2)):
        print(f'"{{i}}","1","python","h","{{name}}","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line '
              f'profiler metrics","{{metric}}","{{unit}}","{{v:,.0f}}"')
"""


def _stand_in(script: str, tmp_path, monkeypatch):
    """``script`` written as an executable ncu that fusionlab finds, the GPU check passed."""
    path = tmp_path / "ncu"
    path.write_text(script.format(python=sys.executable, header=HEADER))
    path.chmod(0o755)
    monkeypatch.setenv("FUSIONLAB_NCU", str(path))
    monkeypatch.setattr(ncu, "_check_gpu", lambda: None)
    return path


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    return _stand_in(FAKE, tmp_path, monkeypatch)


def test_the_recorder_files_counters_by_case_and_cache_setting_with_device_date_and_versions(tmp_path, fake_ncu):
    out = tmp_path / "trips"
    path = benchcli.record_trips(["lesson1"], out, budget_s=120, command="python benchmarks/record_trips.py")
    assert path.parent == out and path.name.endswith(".json")
    data = benchcli.read_trips(path)
    meta = data["meta"]
    assert data["schema"] == benchcli.TRIPS_SCHEMA and not data["missing"]
    for key in ("device", "date", "time", "torch", "triton", "command"):
        assert meta[key], key
    assert meta["ncu"] == "Version 2025.3.1.0 (fake)"
    cases = data["parts"]["lesson1"]
    assert list(cases) == ["fused", "eager", "too big"]
    fused, eager = cases["fused"], cases["eager"]
    assert fused["all"]["dram_read"] == 1000 and fused["none"]["dram_read"] == 500
    assert eager["all"]["dram_read"] == 4000 and eager["none"]["dram_read"] == 3000
    assert eager["all"]["dram_write"] == 3960 and len(eager["all"]["kernels"]) == 2
    assert eager["all"]["kernels"][0]["name"] == "vectorized_elementwise_kernel"
    assert eager["schedule_bytes"] == 4000 and fused["ledger_bytes"] == 2000
    assert "OutOfMemoryError" in cases["too big"]["error"] and "all" not in cases["too big"]
    table = benchcli.trips_table(cases)
    assert "could not run" in table and "1.990x" in table  # eager: 7960 bytes of DRAM against 4000


def test_what_the_budget_or_ncu_cannot_give_is_listed_as_missing(tmp_path, fake_ncu, monkeypatch):
    out = tmp_path / "trips"
    path = benchcli.record_trips(["lesson1", "cliff"], out, budget_s=0)
    data = benchcli.read_trips(path)
    want = {"cliff all", "lesson1 all", "lesson1 none"}  # the cliff's question is within one kernel
    assert not data["parts"] and set(data["missing"]) == want
    assert all("budget" in why for why in data["missing"].values())

    # time left, but less than a stage's margin: no ncu run is started that could start nothing
    data = benchcli.read_trips(benchcli.record_trips(["cliff"], out, budget_s=benchcli.DEADLINE_MARGIN_S))
    assert data["meta"]["runs"] == [] and "ran out" in data["missing"]["cliff all"]

    monkeypatch.setenv("FAKE_NCU_MODE", "fail")
    data = benchcli.read_trips(benchcli.record_trips(["cliff"], out, budget_s=120, cache_controls=("all",)))
    assert "crashed" in data["missing"]["cliff all"]


def test_a_hung_ncu_is_killed_with_its_child(tmp_path, fake_ncu, monkeypatch):
    pidfile = tmp_path / "pid"
    monkeypatch.setenv("FAKE_NCU_MODE", "hang")
    monkeypatch.setenv("FAKE_NCU_PIDFILE", str(pidfile))
    t0 = time.perf_counter()
    with pytest.raises(subprocess.TimeoutExpired):
        ncu.run_ncu([str(fake_ncu), "--cache-control", "all"], timeout=2)
    assert time.perf_counter() - t0 < 30
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):  # gone, not left holding the GPU
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


def test_an_unknown_part_is_refused_and_other_schemas_are_not_read(tmp_path):
    with pytest.raises(SystemExit, match="no part"):
        benchcli.target_of("lesson99")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": 1, "meta": {}, "cases": []}))
    with pytest.raises(ValueError, match="schema 1"):
        benchcli.read_trips(old)


def test_the_ledger_bar_reads_the_large_parts_flushed_counters():
    cases = {
        "on": {"schedule_bytes": 1000, "all": {"dram_read": 500, "dram_write": 490}},
        "off": {"schedule_bytes": 1000, "all": {"dram_read": 500, "dram_write": 470}},
        "broken": {"schedule_bytes": 1000, "error": "no"},
    }
    assert benchcli.trips_bars(cases) == [("on", True, "0.9900x"), ("off", False, "0.9700x")]


def test_gpu_the_large_kernels_move_their_ledger_through_dram(tmp_path):
    """On a GPU with ncu: every >= 1 GiB element-wise and row-wise kernel within 2% of its ledger."""
    ncu_or_skip(triton_gpu=True)
    data = benchcli.read_trips(benchcli.record_trips(["large"], tmp_path, budget_s=300, cache_controls=("all",)))
    assert not data["missing"], data["missing"]
    bars = benchcli.trips_bars(data["parts"]["large"])
    assert len(bars) >= 7 and all(met for _, met, _ in bars), bars


def test_a_case_that_cannot_run_is_left_out_of_the_thunk_with_its_error(tmp_path, monkeypatch):
    side = tmp_path / "cases.json"
    monkeypatch.setenv(ncu.CASES_ENV, str(side))
    ran = []

    def too_big():
        raise MemoryError("2 GiB more")

    ncu.cases_thunk([({"name": "ok"}, lambda: ran.append(1)), ({"name": "too big"}, too_big)])
    infos = json.loads(side.read_text())
    assert ran == [1] and infos[0] == {"name": "ok"} and infos[1]["error"] == "MemoryError: 2 GiB more"


# -- parts chosen, batched into one ncu run, and read back merged ------------------------------------
STAGED = r"""#!{python}
import json, os, sys
args = sys.argv[1:]
if "--version" in args:
    print("Version 2025.3.1.0 (fake)")
    raise SystemExit(0)
cc = args[args.index("--cache-control") + 1]
parts = args[args.index("--child") + 2:]
if os.environ.get("FAKE_NCU_CRASH") in parts and len(parts) > 1:
    print("==ERROR== the application crashed", file=sys.stderr)
    raise SystemExit(3)
infos, rows = [], []
for p in parts:
    infos.append({{"name": "fused", "group": "g", "ledger_bytes": 100, "schedule_bytes": 100, "part": p}})
    rows += [("_fusionlab_case_marker", 0), ("k_" + p, 60 if cc == "all" else 30)]
open(os.environ["FUSIONLAB_NCU_CASES"], "w").write(json.dumps(infos))
print({header!r})
for i, (name, r) in enumerate(rows):
    for metric, v in (("dram__bytes_read.sum", r), ("dram__bytes_write.sum", 40),
                      ("gpu__time_duration.sum", 1000), ("lts__t_bytes.sum", 100)):
        cells = [str(i), "1", "python", "h", name, "1", "7", "(1, 1, 1)", "(1, 1, 1)", "0", "9.0", "s", metric, "byte"]
        print(",".join(f'"{{c}}"' for c in [*cells, v]))
"""


@pytest.fixture
def staged_ncu(tmp_path, monkeypatch):
    return _stand_in(STAGED, tmp_path, monkeypatch)


def test_parts_and_settings_are_chosen_ordered_and_batched():
    runs = benchcli.trips_runs(["lesson4b", "regimes:none", "lesson1:none", "large"])
    want = [("large", "all"), ("regimes", "none"), ("lesson4b", "all"), ("lesson1", "none"), ("lesson4b", "none")]
    assert runs == want
    assert benchcli.trips_batches(runs) == [
        (["large"], "all"),
        (["regimes"], "none"),
        (["lesson4b"], "all"),
        (["lesson1", "lesson4b"], "none"),
    ]
    every = benchcli.trips_batches(benchcli.trips_runs())
    assert [cc for _, cc in every] == ["all", "none", "all", "all", "all", "none", "none", "none"]
    flushed = [p for parts, cc in every[2:5] for p in parts]
    assert flushed.index("lesson4") < flushed.index("lesson4b") < flushed.index("lesson5")
    assert max(len(parts) for parts, _ in every) == benchcli.MAX_BATCH
    assert benchcli.trips_runs(["lesson1"], ("all",)) == [("lesson1", "all")]
    for bad in ("lesson99", "lesson1:warm"):
        with pytest.raises(SystemExit):
            benchcli.trips_runs([bad])


def test_a_batch_of_parts_is_one_ncu_run_and_a_crashing_batch_is_run_part_by_part(tmp_path, staged_ncu, monkeypatch):
    data = benchcli.read_trips(benchcli.record_trips(["lesson1", "lesson2"], tmp_path, budget_s=120))
    assert not data["missing"]
    assert [(r["parts"], r["cache_control"]) for r in data["meta"]["runs"]] == [
        (["lesson1", "lesson2"], "all"),
        (["lesson1", "lesson2"], "none"),
    ]
    for part in ("lesson1", "lesson2"):
        c = data["parts"][part]["fused"]
        assert c["all"]["dram_read"] == 60 and c["none"]["dram_read"] == 30
        assert c["all"]["kernels"][0]["name"] == f"k_{part}"
    monkeypatch.setenv("FAKE_NCU_CRASH", "lesson2")
    data = benchcli.read_trips(benchcli.record_trips(["lesson1:all", "lesson2:all"], tmp_path, budget_s=120))
    assert [r["parts"] for r in data["meta"]["runs"]] == [["lesson1", "lesson2"], ["lesson1"], ["lesson2"]]
    assert data["parts"]["lesson1"]["fused"]["all"]["dram_read"] == 60 and not data["missing"]


def test_stages_past_the_deadline_are_not_started_and_a_replay_runs_the_first_passes_stages(tmp_path, monkeypatch):
    side = tmp_path / "cases.json"
    side.write_text("[]")
    monkeypatch.setenv(ncu.CASES_ENV, str(side))
    monkeypatch.setattr(ncu, "_window", lambda thunk: thunk())
    ran = []

    def stage(name, fail=False):
        def build():
            if fail:
                raise MemoryError("too big")
            return ncu.cases_thunk([({"name": "c"}, lambda: ran.append(name))], name)

        return name, build

    monkeypatch.setattr(ncu, "marker", lambda: None)
    monkeypatch.setenv(ncu.DEADLINE_ENV, repr(time.time() + 3600))
    stages = [stage("a"), stage("b", fail=True), stage("c")]
    ncu.stages_child(stages)
    infos = json.loads(side.read_text())
    assert [i.get("part") for i in infos] == ["a", "b", "c"] and "too big" in infos[1]["part_error"]
    assert json.loads((tmp_path / ("cases.json" + ncu.PLAN_SUFFIX)).read_text()) == ["a", "b", "c"]
    (tmp_path / ("cases.json" + ncu.PLAN_SUFFIX)).write_text('["a"]')  # a later pass: the first pass's stages
    monkeypatch.setenv(ncu.DEADLINE_ENV, repr(time.time() - 1))
    ran.clear()
    ncu.stages_child(stages)
    assert ran == ["a", "a"]  # warmed up in cases_thunk, then the profiled call
    (tmp_path / ("cases.json" + ncu.PLAN_SUFFIX)).unlink()
    ran.clear()
    ncu.stages_child(stages)  # a first pass past its deadline starts nothing
    assert ran == [] and json.loads((tmp_path / ("cases.json" + ncu.PLAN_SUFFIX)).read_text()) == []


def test_a_suite_that_can_leave_out_its_graphs_does_so_for_the_counters(monkeypatch):
    """The counters' runs build a suite's cases with ``graphs=False`` where its ``cases`` takes it (a
    graph's replay launches the ungraphed case's kernels; lesson 9's graphs ended in an illegal memory
    access under Nsight Compute), and pass nothing new to a suite that does not."""
    from fusionlab.bench import Case

    seen = {}

    def with_graphs(copy_GBps=None, matmul_TFLOPs=None, graphs=True):
        seen["graphs"] = graphs
        return [Case("a", lambda: None, 8, 0, "g", 1e-6), Case("b", lambda: None, 8, 0, "peak memory", 1e-6)]

    def without(copy_GBps=None, matmul_TFLOPs=None):
        seen["without"] = True
        return []

    for cases in (with_graphs, without):
        monkeypatch.setattr(benchcli, "suite_module", lambda suite, cases=cases: SimpleNamespace(cases=cases))
        benchcli.suite_cases("lesson9")
    assert seen == {"graphs": False, "without": True}


def test_gpu_lesson9_leaves_out_its_graphs_only_when_asked():
    """Lesson 9's suite without graphs: no decode case replays one, and flash-decoding keeps its cases."""
    if not runtime.is_gpu():
        pytest.skip("lesson 9's suite builds an 8B layer on a GPU")
    from fusionlab.lessons.l9 import suite as S

    names = [c.name for c in S.split_cases(graphs=False, shapes=((1, 1024),))]
    assert names == [S.split_name(1, 1024, impl) for impl in S.SPLIT_IMPLS]
