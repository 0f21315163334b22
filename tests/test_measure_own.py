"""A learner's own kernel counted by the GPU (fusionlab.measure.own and the GPU path of the measured-trips
checkers). On a CPU: the learner's code written out as a module of its own (it runs there as here), the
counters held against a ledger (a forgotten re-read fails, with the factor named), and the fallback said
once where ncu cannot count. On a GPU with ncu: the answer keys pass against the counters of the kernels
below, written as a learner writes them, and a ledger that forgets a re-read fails."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from conftest import ncu_or_skip

from fusionlab import runtime
from fusionlab.grading import CheckFailed
from fusionlab.kernels import _attention
from fusionlab.kernels._launch import KernelInputError
from fusionlab.ledger import Ledger
from fusionlab.measure import exercises as ex
from fusionlab.measure import ncu, own

BLOCK = 256  # a notebook's constant, used by the launcher below


@triton.jit
def _silu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, (x * tl.sigmoid(x)).to(y_ptr.dtype.element_ty), mask=mask)


def _grid(n):
    return (triton.cdiv(n, BLOCK),)


def silu(x):
    y = torch.empty_like(x)
    _silu_kernel[_grid(x.numel())](x, y, x.numel(), BLOCK=BLOCK)
    return y


@triton.jit
def _row_var_kernel(x_ptr, v_ptr, n, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row * stride
    offs = tl.arange(0, BLOCK)
    if n <= BLOCK:  # the row on chip: loaded once
        x = tl.load(base + offs, mask=offs < n, other=0.0).to(tl.float32)
        d = tl.where(offs < n, x - tl.sum(x, 0) / n, 0.0)
        var = tl.sum(d * d, 0) / n
    else:  # two passes: the mean, then the squares
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            acc += tl.load(base + start + offs, mask=start + offs < n, other=0.0).to(tl.float32)
        mean = tl.sum(acc, 0) / n
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            x = tl.load(base + start + offs, mask=start + offs < n, other=0.0).to(tl.float32)
            d = tl.where(start + offs < n, x - mean, 0.0)
            acc += d * d
        var = tl.sum(acc, 0) / n
    tl.store(v_ptr + row, var.to(v_ptr.dtype.element_ty))


def row_var(x, block):
    rows, n = x.shape
    v = torch.empty(rows, dtype=x.dtype, device=x.device)
    _row_var_kernel[(rows,)](x, v, n, x.stride(0), BLOCK=block if n > block else triton.next_power_of_2(n))
    return v


def row_var_ledger(rows, n, dtype, block):
    return Ledger(dtype_bytes=dtype).op("var", reads={"x": rows * n * (1 if n <= block else 2)}, writes={"v": rows})


def test_the_learners_code_is_written_out_as_a_module_that_runs_the_same(tmp_path, monkeypatch):
    src = own.module_source({"silu": silu, "row_var": row_var}, inline={__name__})
    assert "import triton.language as tl" in src and "BLOCK = 256" in src
    for name in ("def _silu_kernel", "def _grid", "def silu", "def _row_var_kernel", "def row_var"):
        assert name in src, name
    assert "def row_var_ledger" not in src  # only what the kernels' launchers use
    (tmp_path / "written_out.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("written_out")
    try:
        x = torch.randn(3, 70, device=runtime.DEVICE)
        assert torch.equal(mod.silu(x), silu(x))
        assert torch.allclose(mod.row_var(x, 16), x.var(dim=-1, unbiased=False), atol=1e-5)
    finally:
        sys.modules.pop("written_out", None)


def test_code_from_an_importable_module_is_imported_not_copied():
    src = own.module_source({"silu": silu})  # this file is not a notebook: imported by its name
    assert f"from {__name__} import silu" in src and "def silu" not in src
    with pytest.raises(own.SourceError, match="not a function"):
        own.module_source({"x": 3})


def test_dram_counts_against_a_ledger_name_a_forgotten_reread(monkeypatch):
    rows, n = 512, 2**20
    once = Ledger(dtype_bytes=torch.float32).op("var", reads={"x": rows * n}, writes={"v": rows})
    twice = row_var_ledger(rows, n, torch.float32, 1024)
    measured = {"dram_read": 2 * rows * n * 4 * 0.995, "dram_write": 0.0, "l2_bytes": 0.0}
    ex.compare_with_dram(twice, measured, "row_var_ledger(...)", l2=50 * 2**20)
    with pytest.raises(CheckFailed, match=r"says 2.00 GiB read; .*read 3.98 GiB from DRAM\. The kernel moved it twice"):
        ex.compare_with_dram(once, measured, "row_var_ledger(...)", l2=50 * 2**20)
    short = {**measured, "dram_write": 0.0}
    big_out = Ledger(dtype_bytes=torch.float32).op("var", reads={"x": 2 * rows * n}, writes={"v": 2**28})
    with pytest.raises(CheckFailed, match="written.*up to the L2's 50.00 MiB"):
        ex.compare_with_dram(big_out, short, "w", l2=50 * 2**20)


def test_l2_counts_bound_a_ledger_from_below():
    led = Ledger(dtype_bytes=torch.float32).op("matmul", reads={"A": 64 * 2**20, "B": 64 * 2**20}, writes={"C": 2**20})
    seen = {"l2_bytes": led.fused_bytes * 1.01, "dram_read": 2**23, "dram_write": 2**22}
    ex.compare_with_l2_floor(led, seen, "my_ledger(...)")
    # the SMs' own caches served a share of the re-reads (the H200, 2026-11-27: 0.73x at 16 x 64 tiles)
    ex.compare_with_l2_floor(led, {**seen, "l2_bytes": led.fused_bytes * 0.73}, "my_ledger(...)")
    with pytest.raises(CheckFailed, match="through the L2 alone, more than your ledger"):
        ex.compare_with_l2_floor(led, {**seen, "l2_bytes": led.fused_bytes * 2}, "my_ledger(...)")


def test_shared_tiles_bound_the_ledger_from_below_and_the_schedule_holds_it(monkeypatch):
    # the GPU path of the matmul and attention exercises, on counters faked as the H200 gave them (2026-11-27:
    # 0.73x of the matmul's ledger crossed the L2 at 16 x 64 tiles)
    from fusionlab.kernels.matmul import matmul_ledger

    specs = [[640, 512, 768, 16, 64]]
    schedule = lambda spec: matmul_ledger(*spec, torch.float32)  # noqa: E731
    l2 = 0.73 * schedule(specs[0]).fused_bytes
    monkeypatch.setattr(ex, "gpu_counters", lambda fns, b, sp: [{"l2_bytes": l2, "dram_read": 0, "dram_write": 0}])

    def at(ledger):
        return lambda spec: ("my_ledger(...)", ledger(spec))

    note = ex._on_gpu_shared("matmul", specs, at(schedule), schedule, "the tiles' re-reads")
    assert "0.73-0.73x of your ledger crossed the L2" in note
    once = lambda spec: Ledger(dtype_bytes=4).op(  # noqa: E731  (A and B read once: the re-reads forgotten)
        "matmul", reads={"A": spec[0] * spec[2], "B": spec[2] * spec[1]}, writes={"C": spec[0] * spec[1]}
    )
    with pytest.raises(CheckFailed, match="through the L2 alone"):
        ex._on_gpu_shared("matmul", specs, at(once), schedule, "the tiles' re-reads")
    monkeypatch.setattr(ex, "gpu_counters", lambda fns, b, sp: None)  # no counters here: the caller falls back
    assert ex._on_gpu_shared("matmul", specs, at(schedule), schedule, "the tiles' re-reads") is None


def test_a_small_output_is_held_to_the_whole_counts_tolerance():
    # row_var on the H200 (2026-11-27): 1 GiB read, a 1 MiB output, 3.98 MiB written to DRAM
    rows, n = 2**18, 1024
    led = Ledger(dtype_bytes=torch.float32).op("var", reads={"x": rows * n}, writes={"v": rows})
    seen = {"dram_read": rows * n * 4 * 1.001, "dram_write": 3.98 * 2**20, "l2_bytes": 0.0}
    ex.compare_with_dram(led, seen, "row_var_ledger(...)", l2=60 * 2**20)
    rows_back = Ledger(dtype_bytes=torch.float32).op("var", reads={"x": rows * n}, writes={"v": rows * n})
    with pytest.raises(CheckFailed, match="written"):  # a ledger that writes the rows back still fails
        ex.compare_with_dram(rows_back, seen, "row_var_ledger(...)", l2=60 * 2**20)


def test_without_counters_the_check_says_why_once_and_falls_back(monkeypatch, capsys):
    monkeypatch.setattr(own, "_UNAVAILABLE", [])

    def no_permission():
        raise ncu.NcuUnavailable(ncu.permission_message("==ERROR== ERR_NVGPUCTRPERM"))

    monkeypatch.setattr(ncu, "find_ncu", no_permission)
    assert ex.gpu_counters({"silu": silu}, "silu", [[1024, "float32"]]) is None
    first = capsys.readouterr().out
    assert "No GPU counters for your kernel here: ncu is here but may not read" in first
    assert "package's count of the same schedule instead" in first
    assert ex.gpu_counters({"silu": silu}, "silu", [[1024, "float32"]]) is None  # remembered: no second try
    assert capsys.readouterr().out == "" and "ERR_NVGPUCTRPERM" in own.unavailable()


def test_ncu_that_profiles_no_kernel_says_so(tmp_path):
    # what ncu printed on the H100 (2026-11-27) when every case of the attention exercise failed
    fake = tmp_path / "ncu"
    fake.write_text(
        "#!/bin/sh\necho '==PROF== Disconnected from process 2010'\necho '==WARNING== No kernels were profiled.' >&2\n"
    )
    fake.chmod(0o755)
    with pytest.raises(ncu.NcuNoKernels, match="profiled no kernel"):
        ncu.run_ncu([str(fake)])


def _refused_target(n):
    """Cases that fail while warming up, as the attention exercise's fp32 inputs did on a GPU."""

    def refused():
        raise KernelInputError("attention: q is float32; on a GPU the kernel takes fp16 or bf16")

    return ncu.cases_thunk([({"name": str(i)}, refused) for i in range(int(n))])


def test_cases_that_fail_before_the_window_are_named_in_the_error(monkeypatch):
    def child_then_nothing(target, *args, **kwargs):  # the child's part, run here; then ncu's answer
        ncu._resolve(target)(*args)
        raise ncu.NcuNoKernels("ncu profiled no kernel")

    monkeypatch.setattr(ncu, "profile", child_then_nothing)
    with pytest.raises(ncu.NcuNoKernels, match=r"(?s)2 of 2 cases failed before the profiled window.*0: Kern.*float32"):
        ncu.measure_cases(f"{__name__}:_refused_target", "2", cache_controls=("all",))


def test_a_package_kernel_ncu_cannot_count_fails_loudly_a_learners_falls_back(monkeypatch, capsys):
    why = "ncu profiled no kernel\n1 of 1 cases failed before the profiled window:\n0: KernelInputError: refused"

    def nothing(*args, **kwargs):
        raise ncu.NcuNoKernels(why)

    monkeypatch.setattr(ex, "gpu_counted", nothing)
    with pytest.raises(ncu.NcuFailed, match="(?s)package's attention kernel.*KernelInputError: refused"):
        ex.gpu_counters({}, "attention", [[1, 2, 512, 512, 64, 16, "bfloat16"]])
    assert ex.gpu_counters({"silu": silu}, "silu", [[1024, "float32"]]) is None
    out = capsys.readouterr().out
    assert out.startswith("⚠ Nsight Compute could not count your kernel") and "KernelInputError: refused" in out


def test_the_profiled_command_follows_the_written_out_module_and_filters_no_kernel(monkeypatch, tmp_path):
    # ncu itself faked: its command line, the child's path and what the counters come back as, on a CPU
    seen = {}

    def fake_ncu(cmd, *, timeout, env):
        seen["cmd"], seen["env"] = cmd, env
        target = cmd[cmd.index("--child") + 1]
        folder = next(f for f in env["PYTHONPATH"].split(":") if Path(f, target.split(":")[0] + ".py").is_file())
        seen["source"] = Path(folder, target.split(":")[0] + ".py").read_text()
        Path(env[ncu.CASES_ENV]).write_text('[{"name": "0"}, {"name": "1"}]')  # as the child's cases write it
        return (Path(__file__).parent / "data" / "ncu_details_marked.txt").read_text()

    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("FUSIONLAB_NCU", str(fake))
    monkeypatch.setattr(ncu, "_check_gpu", lambda: None)
    monkeypatch.setattr(ncu, "run_ncu", fake_ncu)
    monkeypatch.setattr(own, "_UNAVAILABLE", [])
    got = own.counted({"silu": silu}, "fusionlab.measure.exercises:cases_target", "silu", [[8, "float32"]] * 2)
    cmd = seen["cmd"]
    # every kernel of the one Python process, between cudaProfilerStart and Stop, caches flushed
    assert "--kernel-name" not in cmd and "--launch-skip" not in cmd and "--launch-count" not in cmd
    assert cmd[cmd.index("--target-processes") + 1] == "application-only"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off" and cmd[cmd.index("--cache-control") + 1] == "all"
    assert cmd[cmd.index("--child") - 1] == "fusionlab.measure.ncu" and cmd[cmd.index("--child") + 2] == "silu"
    assert "def _fusionlab_target(builder, specs)" in seen["source"] and "exercises as _cases" in seen["source"]
    assert [[k["name"] for k in c["kernels"]] for c in got] == [["_cos_kernel"], ["vectorized_elementwise_kernel"] * 2]


def test_the_attention_exercise_counts_inputs_the_gpu_kernel_takes(monkeypatch):
    # on the H100 (2026-11-27) its fp32 inputs were refused by the GPU kernel in every case, and ncu
    # profiled nothing: the GPU's input checks, run here on the shapes and dtype the GPU check uses
    monkeypatch.setattr(runtime, "is_gpu", lambda: True)
    specs = ex.attention_gpu_specs(torch.Generator().manual_seed(0))
    for B, H, _, _, D, _, dtype in specs:
        q, k, v = ex.attention_inputs(B, H, 16, 16, D, dtype, device=runtime.DEVICE)  # the sizes do not matter
        _attention.check_inputs(q, k, v, False, None)
    with pytest.raises(KernelInputError, match="float32"):  # what the check above would have caught
        _attention.check_inputs(*ex.attention_inputs(1, 2, 16, 16, 64, "float32", device=runtime.DEVICE), False, None)


def _attn_ledger(B, H, N_q, N_k, D, dtype, bm, times=None):
    import math

    t = math.ceil(N_q / bm) if times is None else times
    reads = {"Q": B * H * N_q * D, "K": B * H * N_k * D * t, "V": B * H * N_k * D * t}
    writes = {"O": B * H * N_q * D, "lse": B * H * N_q}  # lse is fp32 whatever the inputs' dtype
    return Ledger(dtype_bytes=dtype, sizes={"lse": 4}).op("attention", reads=reads, writes=writes)


def test_on_a_gpu_the_attention_ledger_is_bounded_by_the_l2_and_held_to_the_schedule(monkeypatch):
    # the H200 (2026-11-27): 7.00 MiB through the L2 for a ledger of 18.29 MiB, the SMs' own caches serving the
    # rest of K's and V's re-reads: the counters bound the ledger from below, the schedule's count holds it
    share = {"l2": 0.38}

    def counters(fns, builder, specs):
        assert fns == {} and builder == "attention" and all(s[-1] in ("bfloat16", "float16") for s in specs)
        return [{"l2_bytes": share["l2"] * _attn_ledger(*s[:5], getattr(torch, s[6]), s[5]).fused_bytes} for s in specs]

    monkeypatch.setattr(runtime, "is_gpu", lambda: True)
    monkeypatch.setattr(ex, "gpu_counters", counters)
    msg = ex.check_attention_trips(_attn_ledger).message
    assert "0.38-0.38x of your ledger crossed the L2" in msg and "Nsight Compute" in msg
    with pytest.raises(CheckFailed, match="through the L2 alone, more than your ledger"):  # K and V read once
        ex.check_attention_trips(lambda *a: _attn_ledger(*a, times=1))
    with pytest.raises(CheckFailed, match="as the package counts its schedule"):  # K and V read twice a tile
        ex.check_attention_trips(lambda B, H, N_q, N_k, D, dt, bm: _attn_ledger(B, H, N_q, N_k, D, dt, bm // 2))


# -- on a GPU with ncu -------------------------------------------------------------------------------
def test_gpu_a_window_with_no_kernel_is_an_error_not_an_empty_list():
    ncu_or_skip()
    with pytest.raises(ncu.NcuNoKernels, match="profiled no kernel"):
        ncu.profile("fusionlab.measure.targets:nothing")


def _gpu(monkeypatch):
    ncu_or_skip(triton_gpu=True)
    monkeypatch.setattr(own, "_UNAVAILABLE", [])
    monkeypatch.setattr(own, "INLINE_MODULES", frozenset({"__main__", __name__}))  # as if a notebook's


def test_gpu_the_learners_silu_and_row_var_are_held_against_their_dram_bytes(monkeypatch):
    _gpu(monkeypatch)

    def silu_ledger(n, dtype):  # the learner's own (the checker's answer key may not be called)
        return Ledger(dtype_bytes=dtype).op("silu", reads={"x": n}, writes={"y": n})

    msg = ex.check_silu_trips(silu, silu_ledger).message
    assert "counted by this GPU under Nsight Compute" in msg, msg
    msg = ex.check_row_var_trips(row_var, row_var_ledger).message
    assert "counted by this GPU under Nsight Compute" in msg, msg

    def forgets_the_second_pass(rows, n, dtype, block):
        return Ledger(dtype_bytes=dtype).op("var", reads={"x": rows * n}, writes={"v": rows})

    with pytest.raises(CheckFailed, match="from DRAM"):
        ex.check_row_var_trips(row_var, forgets_the_second_pass)


def test_gpu_the_matmul_and_attention_ledgers_are_held_against_the_l2(monkeypatch):
    import math

    _gpu(monkeypatch)

    def mm(M, N, K, bm, bn, dtype):
        reads = {"A": M * K * math.ceil(N / bn), "B": K * N * math.ceil(M / bm)}
        return Ledger(dtype_bytes=dtype).op("matmul", reads=reads, writes={"C": M * N})

    def attn(B, H, N_q, N_k, D, dtype, bm):
        t = math.ceil(N_q / bm)
        reads = {"Q": B * H * N_q * D, "K": B * H * N_k * D * t, "V": B * H * N_k * D * t}
        writes = {"O": B * H * N_q * D, "lse": B * H * N_q}  # lse is fp32 whatever the inputs' dtype
        return Ledger(dtype_bytes=dtype, sizes={"lse": 4}).op("attention", reads=reads, writes=writes)

    assert "of your ledger crossed the L2" in ex.check_matmul_trips(mm).message
    assert "of your ledger crossed the L2" in ex.check_attention_trips(attn).message
    with pytest.raises(CheckFailed, match="through the L2 alone"):  # K and V once: the re-reads forgotten
        ex.check_attention_trips(lambda B, H, N_q, N_k, D, dtype, bm: attn(B, H, N_q, N_k, D, dtype, N_q))
    with pytest.raises(CheckFailed, match="through the L2"):
        ex.check_matmul_trips(lambda M, N, K, bm, bn, dtype: mm(M, N, K, M, N, dtype))  # one read of each
