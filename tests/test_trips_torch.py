"""fusionlab.measure.torch_ops: the bytes each aten op reads and writes, against the eager ledgers."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fusionlab import runtime
from fusionlab.kernels.bias_gelu import bias_gelu_eager, bias_gelu_ledger
from fusionlab.kernels.cos import cos_cos, cos_cos_eager, cos_cos_ledger
from fusionlab.kernels.swiglu import swiglu_eager, swiglu_ledger
from fusionlab.measure.torch_ops import TorchTrips, tensor_bytes

DEV = runtime.DEVICE


def test_eager_cos_cos_moves_the_unfused_ledger():
    x = torch.randn(1000, device=DEV)
    with TorchTrips() as t:
        cos_cos_eager(x)
    assert [(o.op, o.read_bytes, o.write_bytes) for o in t.ops] == [("cos", 4000, 4000)] * 2
    assert t.nbytes == cos_cos_ledger(1000).unfused_bytes


def test_eager_bias_gelu_and_swiglu_move_their_unfused_ledgers():
    x, b = torch.randn(37, 129, device=DEV), torch.randn(129, device=DEV)
    with TorchTrips() as t:
        bias_gelu_eager(x, b)
    assert t.nbytes == bias_gelu_ledger(37, 129, torch.float32).unfused_bytes
    g, u = torch.randn(64, 32, device=DEV), torch.randn(64, 32, device=DEV)
    with TorchTrips() as t:
        swiglu_eager(g, u)
    assert t.nbytes == swiglu_ledger(64 * 32, torch.float32).unfused_bytes


def test_views_are_free_and_out_copy_and_in_place_count_what_they_move():
    x = torch.randn(8, 16, device=DEV)
    y = torch.empty(16, 8, device=DEV)
    with TorchTrips() as t:
        x.view(16, 8).t().unsqueeze(0).expand(2, 8, 16)  # views only: nothing moves
        torch.cos(x, out=y.view(8, 16))  # out=: written, not read
        y.copy_(x.t())  # copy_: reads the source, writes the destination
        x.add_(1.0)  # in place: reads and writes x
        x.sum()
        F.relu(x[:, :4])  # a slice reads only its elements
    nb = 8 * 16 * 4
    assert [(o.op, o.kind, o.read_bytes, o.write_bytes) for o in t.ops] == [
        ("cos", "compute", nb, nb),
        ("copy_", "pass", nb, nb),
        ("add_", "compute", nb, nb),
        ("sum", "compute", nb, 4),
        ("relu", "compute", nb // 4, nb // 4),
    ]


def test_a_broadcast_counts_its_bytes_once():
    assert tensor_bytes(torch.zeros(16).expand(1000, 16)) == 64
    assert tensor_bytes(torch.zeros(0, 3)) == 0


def test_torch_ops_inside_a_triton_launch_are_not_the_callers():
    x = torch.randn(1000, device=DEV)
    with TorchTrips() as t:
        cos_cos(x)
    assert t.names == ["_cos_kernel"]
    # the launcher allocates y (free); the interpreter's own copies are inside the launch
    assert t.ops == []
