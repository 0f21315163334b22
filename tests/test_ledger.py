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


# -- properties ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(20))
def test_fusing_never_moves_more_bytes(seed):
    import random

    rng = random.Random(seed)
    led = Ledger(dtype_bytes=rng.choice([1, 2, 4]))
    made = ["x0"]
    for i in range(rng.randint(1, 6)):
        reads = {t: rng.randint(1, 1000) for t in rng.sample(made, rng.randint(1, len(made)))}
        out = f"t{i + 1}"
        led.op(f"op{i}", reads=reads, writes={out: rng.randint(1, 1000)})
        made.append(out)
    assert 0 < led.fused_bytes <= led.unfused_bytes
    assert led.saving >= 1


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("n", [1, 1000, 2**28])
def test_a_k_chain_moves_2kN_unfused_and_2N_fused(k, n):
    led = Ledger.chain(["op"] * k, n, torch.float16)
    assert led.unfused_bytes == 2 * k * n * 2 and led.fused_bytes == 2 * n * 2 and led.kernels_unfused == k


@pytest.mark.parametrize("bad", [-1, 1.5, float("nan"), float("inf"), "10", None, True])
def test_bad_sizes_get_a_clear_error(bad):
    with pytest.raises(ValueError, match="whole number >= 0"):
        Ledger().op("add", reads={"x": bad}, writes={"y": 10})
    with pytest.raises(ValueError, match="whole number >= 0"):
        Ledger.chain(["cos"], bad)


@pytest.mark.parametrize("bad", [0, -5.0, float("nan"), float("inf"), "900", None])
def test_bad_bandwidths_and_rates_get_a_clear_error(bad):
    led = Ledger.chain(["cos", "cos"], 1000)
    with pytest.raises(ValueError, match="bandwidth_GBps must be a finite number > 0"):
        led.predict_ms(bad, fused=True)
    with pytest.raises(ValueError, match="must be a finite number"):
        machine_balance(bad, 1000.0)
    with pytest.raises(ValueError, match="must be a finite number"):
        roofline_tflops(1.0, 100.0, bad)
    with pytest.raises(ValueError, match="bytes moved must be a finite number > 0"):
        arithmetic_intensity(1.0, bad)


def test_empty_tensors_have_no_speedup_to_predict():
    led = Ledger.chain(["cos"], 0)
    assert led.fused_bytes == 0
    with pytest.raises(ValueError, match="speedup is undefined"):
        _ = led.saving


@pytest.mark.parametrize("bad", [0, -2, 2.5, "fp32", None])
def test_bad_dtype_bytes(bad):
    with pytest.raises(ValueError, match="dtype_bytes must be"):
        Ledger(dtype_bytes=bad)


def test_a_written_out_fused_schedule_with_mixed_sizes():
    # residual + RMSNorm on 8 rows of 16 bf16 with an fp32 weight and fp32 rstd: the fused kernel writes
    # h, y and the statistic, none of which the first-read/last-write rule would find
    led = Ledger(dtype_bytes=torch.bfloat16, sizes={"w": torch.float32, "rstd": torch.float32})
    led.op("add", reads={"x": 128, "r": 128}, writes={"h": 128})
    led.op("rmsnorm", reads={"h": 128, "w": 16}, writes={"y": 128})
    led.fused("fused", reads={"x": 128, "r": 128, "w": 16}, writes={"h": 128, "y": 128, "rstd": 8})
    assert led.unfused_bytes == (128 * 3 + 128 * 2) * 2 + 16 * 4
    assert led.fused_bytes == 128 * 4 * 2 + 16 * 4 + 8 * 4
    with pytest.raises(ValueError, match="whole number"):
        led.fused("bad", reads={"x": -1})


def test_rereads_and_recomputed_inputs():
    # online softmax of a wide row: x read twice; SwiGLU's backward: s recomputed from g, never read
    led = Ledger(dtype_bytes=2, rereads={"x": 100})
    led.op("max", reads={"x": 100}, writes={"m": 1}).op("div", reads={"x": 100, "m": 1}, writes={"y": 100})
    trips = [(t.op, t.tensor, t.direction) for t in led.trips(fused=True)]
    assert trips == [("max", "x", READ), ("pass 2", "x", READ), ("div", "y", WRITE)]
    assert led.fused_bytes == 3 * 100 * 2 and "reread" in led.table()
    bwd = Ledger(dtype_bytes=2, recomputed=("s",))
    bwd.op("mul", reads={"dh": 10, "s": 10}, writes={"du": 10}).op(
        "dsilu", reads={"g": 10, "dh": 10}, writes={"dg": 10}
    )
    bwd.outputs = ("du", "dg")
    assert {t.tensor for t in bwd.trips(fused=True) if t.direction == READ} == {"dh", "g"}
