"""Lesson 6's deep dive reads the matmul configuration sweep from a data file: it carries its device,
date and versions, every ratio is a number, and the configurations the package's autotuner keeps were
in the sweep (a config added to ``TMA_CONFIGS`` without its measurement fails here)."""

from __future__ import annotations

import json
import math
from importlib.resources import files

import pytest

from fusionlab.kernels.matmul import TMA_CONFIGS

pytestmark = pytest.mark.lesson6


def test_config_sweep_data_file():
    data = json.loads(files("fusionlab.lessons.l6").joinpath("matmul_config_sweep.json").read_text())
    assert data["schema"] == 1
    assert {"device", "date", "torch", "triton", "source"} <= set(data["meta"])
    for cfg, row in data["ratios"].items():
        assert row and all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in row.values()), cfg
    for c in TMA_CONFIGS:
        k = c.kwargs
        name = f"{k['BLOCK_M']}×{k['BLOCK_N']}×{k['BLOCK_K']} s{c.num_stages} w{c.num_warps}"
        assert name in data["ratios"], f"{name} is autotuned over but was not in the sweep"
