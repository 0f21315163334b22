import pytest
import torch

from fusionlab.ledger import (
    READ,
    WRITE,
    Ledger,
    arithmetic_intensity,
    human_bytes,
    machine_balance,
    roofline_tflops,
)

pytestmark = pytest.mark.lesson1


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("dtype, size", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_chain_moves_2kN_unfused_and_2N_fused(k, dtype, size):
    n = 1000
    led = Ledger.chain(["op"] * k, n, dtype)
    assert led.unfused_bytes == 2 * k * n * size
    assert led.fused_bytes == 2 * n * size
    assert led.saving == pytest.approx(k)
    assert led.kernels_unfused == k


def test_bias_gelu_four_trips_become_two():
    m, n = 64, 32
    led = Ledger(dtype_bytes=4)
    led.op("add", reads={"x": m * n, "bias": n}, writes={"t": m * n})
    led.op("gelu", reads={"t": m * n}, writes={"y": m * n})
    unfused = led.trips(fused=False)
    assert [(t.tensor, t.direction) for t in unfused] == [
        ("x", READ),
        ("bias", READ),
        ("t", WRITE),
        ("t", READ),
        ("y", WRITE),
    ]
    fused = led.trips(fused=True)
    assert [(t.tensor, t.direction) for t in fused] == [("x", READ), ("bias", READ), ("y", WRITE)]
    assert led.unfused_bytes == 4 * (4 * m * n + n)
    assert led.fused_bytes == 4 * (2 * m * n + n)
    assert "stays on chip" in led.table()


def test_an_input_read_twice_is_read_once_fused():
    led = Ledger(dtype_bytes=2)
    led.op("a", reads={"x": 10}, writes={"t": 10})
    led.op("b", reads={"x": 10, "t": 10}, writes={"y": 10})
    assert led.unfused_bytes == 2 * 50
    assert led.fused_bytes == 2 * 20


def test_explicit_outputs_keep_an_intermediate():
    led = Ledger(dtype_bytes=4, outputs=("t", "y"))
    led.op("a", reads={"x": 10}, writes={"t": 10})
    led.op("b", reads={"t": 10}, writes={"y": 10})
    assert led.fused_bytes == 4 * 30


def test_predict_ms():
    led = Ledger.chain(["cos", "cos"], 2**28, torch.float32)
    # 2 GiB fused at 4000 GB/s
    assert led.predict_ms(4000, fused=True) == pytest.approx(2 * 2**30 / 4e12 * 1e3)
    assert led.predict_ms(4000, fused=False) == pytest.approx(2 * led.predict_ms(4000, fused=True))
    with pytest.raises(ValueError):
        led.predict_ms(0, fused=True)


def test_bad_sizes_rejected():
    with pytest.raises(ValueError, match="whole number"):
        Ledger().op("x", reads={"a": -1}, writes={})


def test_roofline_helpers():
    assert machine_balance(989, 3350) == pytest.approx(295, rel=0.01)  # H100: ~295 FLOP/byte
    # a bias-add in fp32: 1 FLOP per element, 12 bytes (two reads, one write) -> ~0.08
    assert arithmetic_intensity(1, 12) == pytest.approx(1 / 12)
    assert roofline_tflops(0.1, 989, 3350) == pytest.approx(0.335)
    assert roofline_tflops(1000, 989, 3350) == 989
    assert human_bytes(2**30) == "1.00 GiB"
    assert human_bytes(12) == "12 B"
