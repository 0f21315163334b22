"""fusionlab.measure.ncu: the CSV parser on sample output (CPU), and the counters against the ledger (GPU).

The two files in tests/data are written in the layouts ncu documents for ``--csv`` (``--page raw``: one
row a kernel and a row of units; the details page: one row a metric). The raw file's first kernel carries
the counters issue 38 quotes for eager cos on 256 MiB of fp32 on an H100; the other values are
illustrative, chosen to exercise the units (byte, Kbyte, Mbyte, nsecond, usecond) and separators.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import ncu_or_skip

from fusionlab.kernels.cos import cos_cos_ledger
from fusionlab.measure import ncu

DATA = Path(__file__).parent / "data"


def test_the_raw_page_gives_one_kernel_a_row_in_base_units():
    kernels = ncu.parse_csv((DATA / "ncu_raw_cos_cos.txt").read_text())
    assert len(kernels) == 2
    first = kernels[0]
    assert (first.dram_read, first.dram_write, first.l2_bytes) == (268_485_632, 245_286_400, 537_133_056)
    assert first.time_ns == 173_472 and first.ms == pytest.approx(0.173472)
    assert ncu.short_name(first.name) == "vectorized_elementwise_kernel"


def test_the_details_page_converts_units_and_markers_split_the_cases():
    kernels = ncu.parse_csv((DATA / "ncu_details_marked.txt").read_text())
    assert [ncu.short_name(k.name) for k in kernels] == [
        ncu.MARKER,
        "_cos_kernel",
        ncu.MARKER,
        "vectorized_elementwise_kernel",
        "vectorized_elementwise_kernel",
    ]
    fused = kernels[1]
    assert fused.dram_read == pytest.approx(16.80e6) and fused.dram_write == pytest.approx(12.54e3)
    assert fused.time_ns == pytest.approx(10_340) and kernels[3].time_ns == 11_200
    cases = ncu.split_cases(kernels, ["fused", "eager"])
    assert [(k.case, ncu.short_name(k.name)) for k in cases] == [
        ("fused", "_cos_kernel"),
        ("eager", "vectorized_elementwise_kernel"),
        ("eager", "vectorized_elementwise_kernel"),
    ]
    with pytest.raises(ncu.NcuFailed, match="markers"):
        ncu.split_cases(kernels, ["fused"])


def test_output_without_counters_says_what_ncu_said():
    perm = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
    with pytest.raises(ncu.NcuFailed, match="no CSV header"):
        ncu.parse_csv("==PROF== Connected to process 1\n" + perm)
    assert "NVreg_RestrictProfilingToAdminUsers=0" in ncu.permission_message(perm)
    assert "ERR_NVGPUCTRPERM" in ncu.permission_message(perm)
    missing = (DATA / "ncu_raw_cos_cos.txt").read_text().replace("lts__t_bytes.sum", "lts__t_sectors.sum")
    with pytest.raises(ncu.NcuFailed, match="lts__t_bytes.sum"):
        ncu.parse_csv(missing)


def test_the_command_profiles_only_the_window_and_names_the_cache_control(monkeypatch, tmp_path):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("FUSIONLAB_NCU", str(fake))
    cmd = ncu.command("fusionlab.measure.targets:cos_cos_eager", ["1024"], cache_control="none")
    assert cmd[0] == str(fake) and cmd[cmd.index("--cache-control") + 1] == "none"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    # unflushed, a kernel replayed alone would find its own input in L2: the program is replayed instead
    assert cmd[cmd.index("--replay-mode") + 1] == "application"
    flushed = ncu.command("m:f", cache_control="all")
    assert flushed[flushed.index("--replay-mode") + 1] == "kernel"
    assert cmd[-3:] == ["--child", "fusionlab.measure.targets:cos_cos_eager", "1024"]
    with pytest.raises(ValueError, match="cache_control"):
        ncu.command("m:f", cache_control="some")


def test_no_ncu_and_no_gpu_say_what_to_use_instead(monkeypatch):
    monkeypatch.setenv("FUSIONLAB_NCU", "/nonexistent/ncu")
    monkeypatch.setattr(ncu, "DEFAULT_PATHS", ())
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ncu.NcuUnavailable, match="interpreter"):
        ncu.find_ncu()
    if not torch.cuda.is_available():
        with pytest.raises(ncu.NcuUnavailable, match="no CUDA GPU"):
            ncu.profile("fusionlab.measure.targets:cos_cos_eager", "1024")


# -- on a GPU with ncu ---------------------------------------------------------------------------------
N = 2**26  # 256 MiB of fp32: five times an H100's L2


def _l2_bytes() -> int:
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)


def test_gpu_eager_cos_cos_moves_its_ledger_through_dram():
    """Flushed: each cos reads its whole input from DRAM (within 2%); its writes fall short of the ledger
    by at most L2's size, the tail of the output still in L2 when the kernel ends."""
    ncu_or_skip()
    kernels = ncu.profile("fusionlab.measure.targets:cos_cos_eager", str(N))
    assert len(kernels) == 2
    led = cos_cos_ledger(N)
    per_kernel = led.unfused_bytes / 4  # each kernel reads N and writes N elements
    for k in kernels:
        assert k.dram_read == pytest.approx(per_kernel, rel=0.02), k.describe()
        assert per_kernel - _l2_bytes() <= k.dram_write <= per_kernel * 1.02, k.describe()
        assert k.l2_bytes >= 2 * per_kernel * 0.98, k.describe()  # every byte crosses L2
    total = sum(k.dram_bytes for k in kernels)
    assert total == pytest.approx(led.unfused_bytes, rel=0.10)


def test_gpu_without_a_flush_the_second_cos_finds_part_of_its_input_in_l2():
    ncu_or_skip()
    both = ncu.profile_both("fusionlab.measure.targets:cos_cos_eager", str(N))
    flushed, warm = both["all"], both["none"]
    assert len(flushed) == len(warm) == 2
    # t1's tail, written by the first cos, is still in L2 when the second reads it
    assert warm[1].dram_read <= flushed[1].dram_read * 1.005
    assert warm[1].dram_read >= flushed[1].dram_read - _l2_bytes()


def test_gpu_fused_cos_cos_reads_x_once_and_writes_y_once():
    ncu_or_skip()
    (k,) = ncu.profile("fusionlab.measure.targets:cos_cos_fused", str(N))
    nbytes = N * 4
    assert "_cos_kernel" in k.name
    assert k.dram_read == pytest.approx(nbytes, rel=0.02), k.describe()
    assert nbytes - _l2_bytes() <= k.dram_write <= nbytes * 1.02, k.describe()
