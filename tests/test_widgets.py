"""The widgets, driven from Python: frames, byte counters, live bars, the PNG fallback, the figures."""

import base64
import io

import ipywidgets
import pytest
from PIL import Image

from fusionlab import bench
from fusionlab.ledger import Ledger, human_bytes, machine_balance, roofline_tflops
from fusionlab.widgets import TimingBars, TripAnimation, roofline_figure, show, trips_figure

pytestmark = pytest.mark.lesson1

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def cos_cos() -> Ledger:
    return Ledger.chain(["cos", "cos"], 1024)


def bias_gelu() -> Ledger:
    led = Ledger(dtype_bytes=4)
    led.op("add", reads={"x": 1024, "bias": 8}, writes={"t": 1024})
    led.op("gelu", reads={"t": 1024}, writes={"y": 1024})
    return led


LEDGERS = pytest.mark.parametrize("make", [cos_cos, bias_gelu], ids=["cos_cos", "bias_gelu"])


def decode_png(b64: str) -> Image.Image:
    raw = base64.b64decode(b64)
    assert raw[:8] == PNG_MAGIC
    return Image.open(io.BytesIO(raw))


# -- TripAnimation ---------------------------------------------------------------------------------------
@LEDGERS
def test_frames_run_over_the_unfused_trips(make):
    led = make()
    anim = TripAnimation(led)
    assert anim.n_frames == len(led.trips(fused=False)) + 1
    assert anim.frame == 0
    assert anim.bytes_moved(False) == anim.bytes_moved(True) == 0
    assert anim.slider.max == anim.play.max == anim.n_frames - 1


@LEDGERS
def test_every_frame_changes_the_unfused_html(make):
    anim = TripAnimation(make())
    pages = []
    for k in range(anim.n_frames):
        anim.frame = k
        pages.append(anim.html(fused=False))
    assert len(set(pages)) == anim.n_frames


@LEDGERS
def test_fused_panel_advances_then_holds_its_total(make):
    led = make()
    anim = TripAnimation(led)
    n_fused = len(led.trips(fused=True))
    pages = []
    for k in range(anim.n_frames):
        anim.frame = k
        pages.append(anim.html(fused=True))
    assert len(set(pages[: n_fused + 1])) == n_fused + 1  # one new picture per fused trip
    held = pages[n_fused + 1 : -1]  # the fused kernel is done while the unfused ones still move bytes
    assert all(p == held[0] and "still moving bytes" in p for p in held)
    assert all(f"done: {n_fused} trips in 1 kernel" in p for p in pages[n_fused + 1 :])
    assert "done: no more trips" in pages[-1]


@LEDGERS
def test_byte_counters_match_the_trips_at_every_frame(make):
    led = make()
    anim = TripAnimation(led)
    trips = {f: led.trips(fused=f) for f in (False, True)}
    last = {False: -1, True: -1}
    for k in range(anim.n_frames):
        anim.frame = k
        for fused in (False, True):
            expected = sum(t.nbytes for t in trips[fused][:k])
            moved = anim.bytes_moved(fused)
            assert moved == expected
            assert moved >= last[fused]
            last[fused] = moved
            total = led.fused_bytes if fused else led.unfused_bytes
            assert f"{human_bytes(expected)}</tspan> of {human_bytes(total)}" in anim.html(fused)


@pytest.mark.parametrize("make, unfused, fused", [(cos_cos, 16384, 8192), (bias_gelu, 16416, 8224)])
def test_stepping_to_the_end_moves_the_ledger_bytes(make, unfused, fused):
    led = make()
    anim = TripAnimation(led)
    for _ in range(anim.n_frames - 1):
        anim.step()
    assert anim.frame == anim.n_frames - 1
    assert anim.bytes_moved(False) == led.unfused_bytes == unfused
    assert anim.bytes_moved(True) == led.fused_bytes == fused
    assert anim.step() == anim.n_frames - 1  # stepping past the end stays on the last frame
    assert "fewer bytes" in anim._summary.value


def test_reset_and_bounds():
    anim = TripAnimation(cos_cos())
    first = anim.html(False)
    anim.frame = 3
    assert anim.html(False) != first
    anim.reset()
    assert anim.frame == 0 and anim.play.value == 0
    assert anim.html(False) == first
    with pytest.raises(ValueError, match="out of range"):
        anim.frame = anim.n_frames
    with pytest.raises(ValueError, match="no trips"):
        TripAnimation(Ledger())


def test_controls_drive_the_frame():
    anim = TripAnimation(cos_cos())
    anim.slider.value = 2  # what the browser does when the slider moves (or the Play widget, via jslink)
    assert anim.frame == 2 and anim.bytes_moved(False) == 2 * 4096
    anim.step_button.click()
    assert anim.frame == 3
    anim.reset_button.click()
    assert anim.frame == 0


def test_html_shows_the_current_trip_and_what_stays_on_chip():
    anim = TripAnimation(cos_cos())
    anim.frame = 1
    assert "cos reads x" in anim.html(False) and "4.00 KiB · HBM → chip" in anim.html(False)
    anim.frame = 2
    unfused, fused = anim.html(False), anim.html(True)
    assert "cos writes t1" in unfused and "chip → HBM" in unfused
    assert "cos writes y" in fused  # the fused kernel's second trip is already the final write
    assert "never goes to HBM" in fused and ">t1<" in fused  # t1 on chip, dashed
    anim.reset()
    # before anything moves, the unfused HBM has a slot for t1 and the fused one has none
    assert ">t1<" in anim.html(False) and ">t1<" not in anim.html(True)


@LEDGERS
def test_animation_bundle_has_widget_view_and_png(make):
    anim = TripAnimation(make(), title="trips")
    bundle = anim._repr_mimebundle_()
    assert bundle[WIDGET_VIEW] == {"version_major": 2, "version_minor": 0, "model_id": anim.widget.model_id}
    assert isinstance(anim.widget, ipywidgets.VBox)
    assert "TripAnimation(frame 0" in bundle["text/plain"]
    img = decode_png(bundle["image/png"])
    assert img.width > 400 and img.height > 200
    assert anim.png()[:8] == PNG_MAGIC


def test_trips_figure_says_bytes_and_source():
    led = bias_gelu()
    fig = trips_figure(led, "bias + GELU")
    ax = fig.axes[0]
    assert "bytes moved through HBM (KiB)" == ax.get_xlabel()
    assert "bias + GELU" in ax.get_title() and "2.00× fewer bytes" in ax.get_title()
    assert "counted from the ledger" in fig._supxlabel.get_text()
    assert "stays on chip: t" in " ".join(t.get_text() for t in ax.texts)
    assert trips_figure(led, device_label="NVIDIA H100")._supxlabel.get_text() == "NVIDIA H100"


# -- TimingBars ------------------------------------------------------------------------------------------
def test_bars_add_updates_values_html_and_prediction_marker():
    bars = TimingBars("cos chain", label="TEST GPU · torch 0 · triton 0")
    assert bars.values == {} and "waiting for the first measurement" in bars.html()
    bars.add("eager", 1.5, predicted=1.25)
    assert bars.values == {"eager": 1.5}
    html = bars.html()
    assert ">eager<" in html and "1.5 ms (pred. 1.25)" in html and html.count('class="predicted"') == 1
    bars.add("fused", 0.75)
    assert bars.values == {"eager": 1.5, "fused": 0.75}
    assert bars.html().count('class="predicted"') == 1  # no prediction given, no marker drawn
    bars.add("eager", 1.4, predicted=1.25)  # an update keeps its place
    assert list(bars.values) == ["eager", "fused"] and bars.values["eager"] == 1.4
    assert "TEST GPU" in bars.html() and "time (ms)" in bars.html()
    with pytest.raises(ValueError):
        bars.add("bad", float("nan"))


def test_bars_label_defaults_to_this_machine():
    from fusionlab import runtime

    assert TimingBars("t").label == runtime.info().label()


def test_bars_fill_live_from_bench_run(monkeypatch):
    times = iter([2.0, 1.0])
    monkeypatch.setattr(bench, "time_ms", lambda fn, **kw: next(times))  # no GPU needed to drive the bars
    bars = TimingBars("run", label="TEST GPU")
    seen = []
    cases = [bench.Case("eager", lambda: None, predicted_ms=1.9), bench.Case("fused", lambda: None)]
    bench.run(cases, on_result=lambda r: (bars.add_result(r), seen.append(bars.values)))
    assert seen == [{"eager": 2.0}, {"eager": 2.0, "fused": 1.0}]  # one bar more as each result arrives
    assert bars.predicted == {"eager": 1.9}


def test_bars_from_recorded_results_and_bundle():
    label = "RECORDED on TEST GPU (sm_90), 2025-01-01, torch 2.8, triton 3.4 — not measured on this machine"
    results = [bench.Result("eager", 0.02, predicted_ms=0.01), bench.Result("fused", 0.01)]
    bars = TimingBars.from_results(results, "recorded", label, unit="us")
    assert bars.values == pytest.approx({"eager": 20.0, "fused": 10.0})
    assert bars.predicted == pytest.approx({"eager": 10.0})
    assert "RECORDED on TEST GPU" in bars.html() and "time (us)" in bars.html()
    bundle = bars._repr_mimebundle_()
    assert bundle[WIDGET_VIEW]["model_id"] == bars.widget.model_id
    assert "RECORDED" in bundle["text/plain"] and "eager: 20 us (predicted 10)" in bundle["text/plain"]
    decode_png(bundle["image/png"])
    fig = bars.figure()
    assert fig.axes[0].get_xlabel() == "time (us)" and fig._supxlabel.get_text() == label


# -- roofline ----------------------------------------------------------------------------------------------
def test_roofline_axes_units_device_and_points():
    points = [("cos", 0.125, None), ("matmul", 2000.0, 600.0)]
    fig = roofline_figure(989.0, 3350.0, points, "TEST GPU (sm_90)")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "arithmetic intensity (FLOP/byte)"
    assert ax.get_ylabel() == "attainable TFLOP/s"
    assert "TEST GPU (sm_90)" in ax.get_title()
    assert ax.get_xscale() == ax.get_yscale() == "log"
    lines = {ln.get_gid(): ln for ln in ax.lines if ln.get_gid()}
    # a point without a measurement sits on the roof: 3350 GB/s × 0.125 FLOP/byte = 0.41875 TFLOP/s
    assert lines["point:cos"].get_ydata()[0] == pytest.approx(roofline_tflops(0.125, 989.0, 3350.0))
    assert lines["point:cos"].get_ydata()[0] == pytest.approx(0.41875)
    assert lines["point:matmul"].get_ydata()[0] == 600.0
    assert lines["ridge"].get_xdata()[0] == pytest.approx(machine_balance(989.0, 3350.0))
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "ridge: 295 FLOP/byte" in texts and "3350 GB/s" in texts and "989 TFLOP/s" in texts
    with pytest.raises(ValueError):
        roofline_figure(989.0, 3350.0, [("zero", 0.0, None)], "TEST GPU")


def test_show_gives_a_png_for_static_renders():
    fig = roofline_figure(989, 3350, [("add", 1 / 12, None)], device_label="H100 (datasheet)")
    img = show(fig)
    assert img.data[:8] == b"\x89PNG\r\n\x1a\n"
