"""fusionlab.viz.trips.measured_figure: measured trips beside the ledger's, per tensor and per kernel."""

from __future__ import annotations

import pytest
import torch

from fusionlab import runtime
from fusionlab.kernels.layernorm import layernorm, layernorm_ledger
from fusionlab.ledger import READ, WRITE, Ledger
from fusionlab.measure.compare import TripCheck, against_ledger
from fusionlab.measure.interpreter import InterpreterTrips
from fusionlab.viz.trips import measured_figure


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_each_tensor_shows_its_prediction_its_measurement_and_the_difference():
    checks = [TripCheck("x", READ, 4096, 4096 + 256), TripCheck("y", WRITE, 4096, 4096), TripCheck("k", READ, 0, 64)]
    fig = measured_figure(checks, [("_kernel", 8192, 8192 + 320)], "a kernel", "counted in the interpreter")
    per_tensor, per_kernel = fig.axes
    gids = {p.get_gid() for p in per_tensor.patches}
    assert {"predicted:read x", "measured:read x", "predicted:write y", "measured:write y"} <= gids
    assert "+256 B (+6.2%)" in _texts(fig) and "= ledger" in _texts(fig) and "+64 B" in _texts(fig)
    assert "+320 B (+3.9%)" in [t.get_text() for t in per_kernel.texts]
    assert fig._supxlabel.get_text() == "counted in the interpreter"
    assert "measured 8.31 KiB against the ledger's 8.00 KiB" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="nothing to show"):
        measured_figure([])


@pytest.mark.skipif(runtime.is_gpu(), reason="counts Triton's interpreter; a GPU runs compiled kernels")
def test_the_interpreter_count_of_a_kernel_draws_against_its_ledger():
    x, w, b = torch.randn(8, 64), torch.randn(64), torch.randn(64)
    with torch.no_grad(), InterpreterTrips() as t:
        layernorm(x, w, b)
    led: Ledger = layernorm_ledger(8, 64, torch.float32)
    fig = measured_figure(against_ledger(t.by_tensor(), led), [(k.name, led.fused_bytes, k.nbytes) for k in t.kernels])
    # layernorm loads x[row, 0] (its shift) besides the row: 8 rows x 4 bytes more than the ledger
    assert "+32 B (+1.6%)" in _texts(fig)
