"""Widgets for the course: the memory-trip animation, live timing bars, and the static figures behind them.

Core ipywidgets only, no JavaScript of our own, so the same code runs on Colab (ipywidgets 7.7) and on
ipywidgets 8. Pictures are SVG strings in an ``ipywidgets.HTML``: the kernel redraws them on each frame
and the browser needs nothing but the HTML widget to show them.

Every display also carries a PNG drawn with matplotlib. A saved notebook then shows a picture on GitHub
and nbviewer, where no kernel runs and a widget view renders as nothing. We build that MIME bundle
ourselves because ``Widget._repr_mimebundle_`` / ``_ipython_display_`` differ between ipywidgets 7 and 8.

Figures are made with ``matplotlib.figure.Figure``, not pyplot: no global figure list to leak into, no
second copy shown by the inline backend when a notebook displays the returned figure, and PNGs are
rendered with Agg whatever backend the notebook chose.
"""

from __future__ import annotations

import base64
import html
import io
import math
import textwrap
from dataclasses import dataclass

import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from . import runtime
from .ledger import READ, WRITE, Ledger, Trip, human_bytes, machine_balance, roofline_tflops

# One palette for the SVG and the PNGs, so the animation and its picture read the same way.
READ_COLOR = "#1f77b4"  # HBM -> chip
WRITE_COLOR = "#ff7f0e"  # chip -> HBM
STAY_COLOR = "#2ca02c"  # made on chip, never written to HBM
MEASURED_COLOR = "#4c72b0"
PREDICTED_COLOR = "#c0392b"
INK = "#222222"
MUTED = "#777777"

#: what the trip pictures say instead of a device: bytes are counted from the ledger, not measured
COUNTED_LABEL = "counted from the ledger, not measured: the same bytes on every device"

_ARROW = {READ: "HBM → chip", WRITE: "chip → HBM"}
_VERB = {READ: "reads", WRITE: "writes"}
_DIR_COLOR = {READ: READ_COLOR, WRITE: WRITE_COLOR}


# -- shared helpers ------------------------------------------------------------------------------------
def _esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def _png(fig: Figure) -> bytes:
    """Render a figure to PNG bytes with Agg, independent of the notebook's matplotlib backend."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _bundle(widget: widgets.Widget, text: str, png: bytes) -> dict:
    """The display bundle: the live widget for a kernel-backed frontend, a PNG and text for the rest."""
    return {
        "application/vnd.jupyter.widget-view+json": {
            "version_major": 2,
            "version_minor": 0,
            "model_id": widget.model_id,
        },
        "text/plain": text,
        "image/png": base64.b64encode(png).decode("ascii"),
    }


def _footer(fig: Figure, text: str) -> None:
    """Where the numbers come from, bottom right; supxlabel takes part in the layout, so no overlap."""
    fig.supxlabel(text, x=0.99, ha="right", fontsize=7, color=MUTED)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _byte_unit(nbytes: float) -> tuple[float, str]:
    """The binary unit that keeps ``nbytes`` below 1024 of it (matches ``human_bytes``)."""
    div = 1
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 * div or unit == "GiB":
            return div, unit
        div *= 1024
    raise AssertionError("unreachable")


# -- the trips, with the kernel (op index) each one belongs to --------------------------------------------
@dataclass(frozen=True)
class _Timeline:
    """One panel's trips, with what the SVG needs to know about them beyond the ledger's list."""

    trips: list[Trip]
    op_index: list[int]  # which op of the ledger makes each trip (op names can repeat: cos, cos)
    hbm_slots: list[str]  # tensors this panel ever has in HBM, in order of first trip
    inputs: set[str]  # tensors in HBM before the first kernel starts
    nbytes: dict[str, int]  # bytes of each tensor

    @property
    def total(self) -> int:
        return sum(t.nbytes for t in self.trips)


def _op_indices(ledger: Ledger) -> list[int]:
    """Op index of each unfused trip: every op reads its inputs, then writes its outputs."""
    idx = [i for i, op in enumerate(ledger.ops) for _ in range(len(op.reads) + len(op.writes))]
    if len(idx) != len(ledger.trips(fused=False)):
        raise AssertionError("unfused trips no longer follow the ops one by one; update _op_indices")
    return idx


def _timeline(ledger: Ledger, fused: bool) -> _Timeline:
    unfused = ledger.trips(fused=False)
    unfused_idx = _op_indices(ledger)
    trips = ledger.trips(fused=fused)
    # The fused trips are a subsequence of the unfused ones (same order, some dropped): match them in
    # order to recover each one's op index, which the trip itself does not carry.
    op_index, j = [], 0
    for t in trips:
        while (unfused[j].op, unfused[j].tensor, unfused[j].direction) != (t.op, t.tensor, t.direction):
            j += 1
        op_index.append(unfused_idx[j])
        j += 1
    slots, inputs = [], set()
    for t in trips:
        if t.tensor not in slots:
            slots.append(t.tensor)
            if t.direction == READ:
                inputs.add(t.tensor)
    nbytes = {t.tensor: t.nbytes for t in unfused}
    return _Timeline(trips, op_index, slots, inputs, nbytes)


# -- one panel of the animation as SVG ----------------------------------------------------------------------
_W, _H = 460, 336
_BOX_X, _BOX_W, _BOX_H = 16, 428, 80
_CHIP_Y, _HBM_Y = 54, 206


@dataclass(frozen=True)
class _Chip:
    name: str
    style: str  # "read", "made", "stays" (on chip); "present", "pending" (in HBM)
    current: str | None = None  # direction of the trip moving this tensor right now


_CHIP_STYLE = {  # fill, stroke, text colour, dashed
    "read": ("#dbe9f6", READ_COLOR, INK, False),
    "made": ("#fde5cf", WRITE_COLOR, INK, False),
    "stays": ("#e3f3e3", STAY_COLOR, INK, True),
    "present": ("#ffffff", "#555555", INK, False),
    "pending": ("none", "#bbbbbb", "#aaaaaa", True),
}


def _on_chip(tl: _Timeline, ledger: Ledger, shown: int, fused: bool) -> list[_Chip]:
    """Tensors on chip after ``shown`` trips.

    Unfused, the chip holds only the current kernel's tensors: registers do not outlive a kernel.
    Fused, it holds every input read so far and everything the ops before the current trip computed,
    in the ledger's order; the intermediates among them are never written out ("stays").
    """
    if shown == 0:
        return []
    trips, ops = tl.trips[:shown], tl.op_index[:shown]
    last_op = ops[-1]
    chips: dict[str, _Chip] = {}
    if not fused:
        for t, i in zip(trips, ops, strict=True):
            if i == last_op:
                chips.setdefault(t.tensor, _Chip(t.tensor, "read" if t.direction == READ else "made"))
        return list(chips.values())
    read = {t.tensor for t in trips if t.direction == READ}
    written = {t.tensor for t in tl.trips if t.direction == WRITE}
    computed = last_op + 1 if trips[-1].direction == WRITE else last_op  # ops whose results exist
    for i, op in enumerate(ledger.ops):
        for name in op.reads:
            if name in read:
                chips.setdefault(name, _Chip(name, "read"))
        for name in op.writes if i < computed else ():
            chips.setdefault(name, _Chip(name, "made" if name in written else "stays"))
    return list(chips.values())


def _in_hbm(tl: _Timeline, shown: int) -> list[_Chip]:
    """Every HBM slot of the panel: present once it is an input or has been written, pending before."""
    written = {t.tensor for t in tl.trips[:shown] if t.direction == WRITE}
    return [_Chip(n, "present" if n in tl.inputs or n in written else "pending") for n in tl.hbm_slots]


def _mark_current(chips: list[_Chip], trip: Trip | None) -> list[_Chip]:
    if trip is None:
        return chips
    return [_Chip(c.name, c.style, trip.direction if c.name == trip.tensor else None) for c in chips]


def _svg_chips(chips: list[_Chip], nbytes: dict[str, int], box_y: float) -> list[str]:
    """Tensor tiles in a box, in rows of at most 8, shrinking to fit rather than overflowing."""
    if not chips:
        return []
    cols = min(len(chips), 8)
    rows = math.ceil(len(chips) / cols)
    area_y, area_h = box_y + 26, _BOX_H - 32
    w = min(56.0, (_BOX_W - 16) / cols - 6)
    h = min(26.0, area_h / rows - 4)
    font = max(8.0, min(13.0, h - 10, w / 3))
    out = []
    for k, c in enumerate(chips):
        x = _BOX_X + 10 + (k % cols) * (w + 6)
        y = area_y + (k // cols) * (h + 4)
        fill, stroke, ink, dashed = _CHIP_STYLE[c.style]
        width = 1.5
        if c.current:
            stroke, width = _DIR_COLOR[c.current], 3.5
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        tip = f"{c.name}: {human_bytes(nbytes.get(c.name, 0))}"
        out.append(
            f'<g><title>{_esc(tip)}</title><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
            f'rx="4" fill="{fill}" stroke="{stroke}" stroke-width="{width}"{dash}/>'
            f'<text x="{x + w / 2:.1f}" y="{y + h / 2 + font / 3:.1f}" font-size="{font:.0f}" '
            f'text-anchor="middle" fill="{ink}">{_esc(c.name)}</text></g>'
        )
    return out


def _svg_box(y: float, label: str, fill: str, stroke: str, note: str = "") -> list[str]:
    out = [
        f'<rect x="{_BOX_X}" y="{y}" width="{_BOX_W}" height="{_BOX_H}" rx="8" fill="{fill}" '
        f'stroke="{stroke}" stroke-width="1.5"/>',
        f'<text x="{_BOX_X + 10}" y="{y + 18}" font-size="13" font-weight="bold" fill="{INK}">{_esc(label)}</text>',
    ]
    if note:
        out.append(f'<text x="{_BOX_X + _BOX_W - 10}" y="{y + 18}" font-size="11" text-anchor="end" '
                   f'fill="{STAY_COLOR}">{_esc(note)}</text>')
    return out


def _svg_arrow(trip: Trip | None, idle_text: str) -> list[str]:
    """The current trip as a thick arrow between the boxes, or a grey line of text when there is none."""
    top, bottom = _CHIP_Y + _BOX_H + 4, _HBM_Y - 4
    mid = (top + bottom) / 2
    if trip is None:
        return [f'<text x="{_W / 2}" y="{mid + 4}" font-size="12" text-anchor="middle" '
                f'fill="{MUTED}">{_esc(idle_text)}</text>']
    color, x = _DIR_COLOR[trip.direction], 64
    tip, tail = (top, bottom) if trip.direction == READ else (bottom, top)
    head = 12 if trip.direction == READ else -12
    return [
        f'<line x1="{x}" y1="{tail}" x2="{x}" y2="{tip + head}" stroke="{color}" stroke-width="7"/>',
        f'<polygon points="{x - 11},{tip + head} {x + 11},{tip + head} {x},{tip}" fill="{color}"/>',
        f'<text x="{x + 24}" y="{mid - 4}" font-size="14" font-weight="bold" fill="{INK}">'
        f"{_esc(trip.op)} {_VERB[trip.direction]} {_esc(trip.tensor)}</text>",
        f'<text x="{x + 24}" y="{mid + 14}" font-size="12" fill="{color}">'
        f"{_esc(human_bytes(trip.nbytes))} · {_ARROW[trip.direction]}</text>",
    ]


def _svg_counter(moved: int, total: int, scale: int) -> list[str]:
    """The running byte counter over a bar; both panels share one scale, so the fused bar is shorter."""
    y, full = _H - 34, _BOX_W
    track = full * total / scale if scale else 0
    fill = full * moved / scale if scale else 0
    return [
        f'<text x="{_BOX_X}" y="{y}" font-size="13" fill="{INK}">bytes moved: '
        f'<tspan font-weight="bold">{_esc(human_bytes(moved))}</tspan> of {_esc(human_bytes(total))}</text>',
        f'<rect x="{_BOX_X}" y="{y + 8}" width="{track:.1f}" height="12" rx="3" fill="#e6e6e6"/>',
        f'<rect x="{_BOX_X}" y="{y + 8}" width="{fill:.1f}" height="12" rx="3" fill="{MUTED}"/>',
    ]


def _status(tl: _Timeline, ledger: Ledger, shown: int, fused: bool, frame: int) -> str:
    n, kernels = len(tl.trips), 1 if fused else len(ledger.ops)
    if frame == 0:
        return f"ready: {_plural(n, 'trip')} in {_plural(kernels, 'kernel')}"
    if frame > n:  # the fused panel has finished while the unfused one is still moving bytes
        return f"done: {_plural(n, 'trip')} in 1 kernel"
    i = tl.op_index[shown - 1]
    where = f"op {i + 1} of {len(ledger.ops)}" if fused else f"kernel {i + 1} of {kernels}"
    return f"trip {shown} of {n} · {where}: {ledger.ops[i].name}"


def _idle_text(frame: int, last_frame: int) -> str:
    """What the arrow's place says in a frame where the panel makes no trip."""
    if frame == 0:
        return "press ▶ or Step: each trip moves one tensor"
    if frame < last_frame:
        return "finished: the unfused kernels are still moving bytes"
    return "done: no more trips"


def _panel_svg(ledger: Ledger, tl: _Timeline, fused: bool, frame: int, last_frame: int, scale: int) -> str:
    shown = min(frame, len(tl.trips))
    current = tl.trips[shown - 1] if 0 < frame <= len(tl.trips) else None
    title = "fused (one kernel)" if fused else "unfused (one kernel per op)"
    chip = _mark_current(_on_chip(tl, ledger, shown, fused), current)
    stays = any(c.style == "stays" for c in chip)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" '
        f'style="width:100%;height:auto;max-width:{_W}px" font-family="sans-serif">',
        f'<rect width="{_W}" height="{_H}" fill="white"/>',
        f'<text x="{_W / 2}" y="22" font-size="16" font-weight="bold" text-anchor="middle" '
        f'fill="{INK}">{_esc(title)}</text>',
        f'<text x="{_W / 2}" y="42" font-size="12" text-anchor="middle" fill="{MUTED}">'
        f"{_esc(_status(tl, ledger, shown, fused, frame))}</text>",
        *_svg_box(_CHIP_Y, "on chip (SRAM + registers)", "#f1f8ee", "#7a9a6a",
                  "dashed: never goes to HBM" if stays else ""),
        *_svg_chips(chip, tl.nbytes, _CHIP_Y),
        *_svg_arrow(current, _idle_text(frame, last_frame)),
        *_svg_box(_HBM_Y, "HBM (off-chip DRAM)", "#eef1f6", "#6a7a9a"),
        *_svg_chips(_mark_current(_in_hbm(tl, shown), current), tl.nbytes, _HBM_Y),
        *_svg_counter(sum(t.nbytes for t in tl.trips[:shown]), tl.total, scale),
        "</svg>",
    ]
    return "\n".join(parts)


# -- static trips picture (the PNG of the animation) ----------------------------------------------------------
def trips_figure(ledger: Ledger, title: str = "", device_label: str | None = None) -> Figure:
    """Every HBM trip as a segment of a bar, unfused above fused; the bar length is bytes moved.

    ``device_label`` defaults to a note that the bytes are counted, not measured: the ledger is
    arithmetic, the same on every device.
    """
    rows = [("unfused", _timeline(ledger, False)), ("fused", _timeline(ledger, True))]
    div, unit = _byte_unit(max(tl.total for _, tl in rows))
    longest = max(tl.total for _, tl in rows) / div or 1
    fig = Figure(figsize=(9.5, 3.4), layout="constrained")
    ax = fig.add_subplot()
    for y, (name, tl) in zip((1, 0), rows, strict=True):
        _trip_bar(ax, y, tl, div, longest)
        ax.text(tl.total / div + 0.01 * longest, y, _row_note(ledger, tl, name == "fused"),
                va="center", fontsize=9, color=INK)
    kernels = len(ledger.ops)
    ax.set_yticks([1, 0], [f"unfused\n({_plural(kernels, 'kernel')})", "fused\n(1 kernel)"])
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlim(0, longest * 1.45)
    ax.set_xlabel(f"bytes moved through HBM ({unit})")
    ax.legend(handles=[Patch(color=READ_COLOR, label="read: HBM → chip"),
                       Patch(color=WRITE_COLOR, label="write: chip → HBM")],
              loc="upper right", fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    saving = f"fusion moves {ledger.saving:.2f}× fewer bytes" if ledger.fused_bytes else ""
    ax.set_title("\n".join(s for s in (title or "Memory trips", saving) if s), fontsize=11)
    _footer(fig, device_label or COUNTED_LABEL)
    return fig


def _trip_bar(ax, y: float, tl: _Timeline, div: float, longest: float) -> None:
    left = 0.0
    for t in tl.trips:
        width = t.nbytes / div
        ax.barh(y, width, left=left, height=0.6, color=_DIR_COLOR[t.direction], edgecolor="white")
        if width > 0.07 * longest:  # label only segments wide enough to hold the text
            ax.text(left + width / 2, y, f"{t.op}\n{t.direction} {t.tensor}", ha="center", va="center",
                    fontsize=8, color="white")
        left += width


def _row_note(ledger: Ledger, tl: _Timeline, fused: bool) -> str:
    note = f"{human_bytes(tl.total)}, {_plural(len(tl.trips), 'trip')}"
    if fused:
        kept = {t.tensor for t in tl.trips}
        stays = [n for op in ledger.ops for n in op.writes if n not in kept]
        if stays:
            names = ", ".join(stays[:4]) + (", …" if len(stays) > 4 else "")
            note += f"\nstays on chip: {names}"
    return note


# -- the animation ----------------------------------------------------------------------------------------
class TripAnimation:
    """HBM <-> chip trips of a ledger, unfused beside fused, one trip per frame.

    Frame ``k`` shows the first ``k`` unfused trips and the first ``min(k, len(fused trips))`` fused
    ones: both panels advance together, the fused one runs out of trips early and then shows its total.
    Frames run ``0 .. len(unfused trips)``.

        >>> anim = TripAnimation(Ledger.chain(["cos", "cos"], 1024))
        >>> anim.frame = anim.n_frames - 1
        >>> anim.bytes_moved(fused=False), anim.bytes_moved(fused=True)
        (16384, 8192)
    """

    def __init__(self, ledger: Ledger, title: str = "", interval_ms: int = 900):
        if not ledger.trips(fused=False):
            raise ValueError("the ledger has no trips to animate; add ops with Ledger.op(...) first")
        self.ledger = ledger
        self.title = title
        self._tl = {False: _timeline(ledger, False), True: _timeline(ledger, True)}
        last = self.n_frames - 1
        self._panels = {f: widgets.HTML(layout=widgets.Layout(flex="1 1 0%", min_width="280px"))
                        for f in (False, True)}
        self.play = widgets.Play(value=0, min=0, max=last, step=1, interval=interval_ms, description="play")
        self.slider = widgets.IntSlider(value=0, min=0, max=last, description="trip")
        # jslink moves the slider in the browser without a round trip; both values then sync to Python,
        # where observing the slider alone redraws the panels. Works alike on ipywidgets 7 and 8.
        self._link = widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.step_button = widgets.Button(description="Step", icon="step-forward",
                                          layout=widgets.Layout(width="90px"))
        self.reset_button = widgets.Button(description="Reset", icon="undo", layout=widgets.Layout(width="90px"))
        self.step_button.on_click(lambda _: self.step())
        self.reset_button.on_click(lambda _: self.reset())
        self.slider.observe(lambda _: self._render(), names="value")
        self._summary = widgets.HTML()
        head = widgets.HTML(f"<b>{_esc(title)}</b>" if title else "")
        self.widget = widgets.VBox([
            head,
            widgets.HBox(list(self._panels.values()), layout=widgets.Layout(width="100%")),
            widgets.HBox([self.play, self.slider, self.step_button, self.reset_button]),
            self._summary,
        ])
        self._render()

    # -- frames -------------------------------------------------------------------------------------------
    @property
    def n_frames(self) -> int:
        return len(self._tl[False].trips) + 1

    @property
    def frame(self) -> int:
        return self.slider.value

    @frame.setter
    def frame(self, k: int) -> None:
        if not 0 <= k < self.n_frames:
            raise ValueError(f"frame {k} is out of range: this animation has frames 0..{self.n_frames - 1}")
        self.slider.value = k  # the observer redraws
        self.play.value = k  # keep the play head where the slider is (jslink does this only in a browser)

    def step(self) -> int:
        """One trip forward (stays on the last frame); returns the new frame."""
        if self.frame < self.n_frames - 1:
            self.frame += 1
        return self.frame

    def reset(self) -> None:
        self.frame = 0

    # -- what the current frame shows ------------------------------------------------------------------
    def shown(self, fused: bool) -> list[Trip]:
        """The trips a panel has made by the current frame."""
        tl = self._tl[fused]
        return tl.trips[: min(self.frame, len(tl.trips))]

    def bytes_moved(self, fused: bool) -> int:
        return sum(t.nbytes for t in self.shown(fused))

    def html(self, fused: bool) -> str:
        return self._panels[fused].value

    def _render(self) -> None:
        scale = self._tl[False].total  # one scale for both counter bars: the fused bar is visibly shorter
        for fused, panel in self._panels.items():
            panel.value = _panel_svg(self.ledger, self._tl[fused], fused, self.frame, self.n_frames - 1, scale)
        self._summary.value = self._summary_html()

    def _summary_html(self) -> str:
        led = self.ledger
        if self.frame < self.n_frames - 1:
            text = f"trip {self.frame} of {self.n_frames - 1} of the unfused chain"
        else:
            text = (f"<b>fusion moves {led.saving:.2f}× fewer bytes</b>: {human_bytes(led.unfused_bytes)} "
                    f"unfused, {human_bytes(led.fused_bytes)} fused")
        return f'<span style="color:{INK}">{text}</span> <span style="color:{MUTED}">({COUNTED_LABEL})</span>'

    # -- static output ----------------------------------------------------------------------------------
    def figure(self) -> Figure:
        return trips_figure(self.ledger, self.title)

    def png(self) -> bytes:
        """All trips of both panels as a PNG: what a notebook shows where no kernel runs."""
        return _png(self.figure())

    def __repr__(self) -> str:
        return (f"TripAnimation(frame {self.frame} of {self.n_frames - 1}: "
                f"unfused {human_bytes(self.bytes_moved(False))} of {human_bytes(self.ledger.unfused_bytes)}, "
                f"fused {human_bytes(self.bytes_moved(True))} of {human_bytes(self.ledger.fused_bytes)})")

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs) -> dict:
        return _bundle(self.widget, repr(self), self.png())


# -- live timing bars -------------------------------------------------------------------------------------
_MS_TO = {"s": 1e-3, "ms": 1.0, "us": 1e3, "µs": 1e3}


def _nice_ticks(vmax: float, n: int = 5) -> list[float]:
    """Round tick values 0, s, 2s, ... covering ``vmax``, with s one of 1, 2, 5 times a power of ten."""
    if vmax <= 0:
        return [0.0, 1.0]
    raw = vmax / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(math.ceil(vmax / step - 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


class TimingBars:
    """Horizontal timing bars that grow as measurements arrive, with the prediction marked on each.

        bars = TimingBars("cos chain, 2^28 fp32 elements")
        bars.show()
        fusionlab.bench.run(cases, on_result=bars.add_result)
    """

    def __init__(self, title: str, unit: str = "ms", label: str | None = None):
        self.title = title
        self.unit = unit
        self.label = label if label is not None else runtime.info().label()
        self._values: dict[str, float] = {}
        self._predicted: dict[str, float] = {}
        self._html = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.widget = widgets.VBox([self._html])
        self._handle = None
        self._render()

    @classmethod
    def from_results(cls, results, title: str, label: str, unit: str = "ms") -> TimingBars:
        """Bars for results measured elsewhere; ``label`` says where (``fusionlab.bench.recorded().label()``)."""
        bars = cls(title, unit=unit, label=label)
        for r in results:
            bars.add_result(r)
        return bars

    # -- data ---------------------------------------------------------------------------------------------
    @property
    def values(self) -> dict[str, float]:
        return dict(self._values)

    @property
    def predicted(self) -> dict[str, float]:
        return dict(self._predicted)

    def add(self, name: str, value: float, predicted: float | None = None) -> None:
        """Add a bar (or update the one called ``name``) and redraw at once."""
        for what, v in (("value", value), ("prediction", predicted)):
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: {what} must be a finite number >= 0, got {v}")
        self._values[name] = float(value)
        if predicted is None:
            self._predicted.pop(name, None)
        else:
            self._predicted[name] = float(predicted)
        self._render()
        if self._handle is not None:  # keep the saved PNG in step with the live bars
            self._handle.update(self)

    def add_result(self, result) -> None:
        """Add a ``fusionlab.bench.Result``: pass as ``on_result=bars.add_result`` to ``bench.run``."""
        if self.unit not in _MS_TO:
            raise ValueError(f"cannot convert milliseconds to {self.unit!r}; use one of {', '.join(_MS_TO)}")
        k = _MS_TO[self.unit]
        pred = None if result.predicted_ms is None else result.predicted_ms * k
        self.add(result.name, result.ms * k, pred)

    def show(self) -> None:
        """Display the bars and keep the display's handle, so each later ``add`` refreshes its PNG too.

        Plain ``display(bars)`` works as well, but its PNG is the picture at display time (often empty)."""
        from IPython.display import display

        self._handle = display(self, display_id=True)

    def html(self) -> str:
        return self._html.value

    # -- drawing --------------------------------------------------------------------------------------------
    def _render(self) -> None:
        self._html.value = self._svg()

    def _svg(self) -> str:
        names = list(self._values)
        row, top, left, right, width = 28, 56, self._left_margin(), 150, 680
        plot_w = width - left - right
        footer = textwrap.wrap(self.label, 105) or [""]  # a RECORDED label is longer than the chart is wide
        axis_y = top + max(len(names), 1) * row + 4
        height = axis_y + 48 + 15 * len(footer)
        vmax = max([*self._values.values(), *self._predicted.values(), 0.0])
        ticks = _nice_ticks(vmax * 1.05)
        x = lambda v: left + plot_w * v / ticks[-1]
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" style="width:100%;height:auto;max-width:{width}px" font-family="sans-serif">',
            f'<rect width="{width}" height="{height}" fill="white"/>',
            f'<text x="10" y="20" font-size="15" font-weight="bold" fill="{INK}">{_esc(self.title)}</text>',
            *self._svg_legend(left, 40),
            *self._svg_axis(ticks, top, axis_y, x),  # first, so the grid lies under the bars
        ]
        if not names:
            parts.append(f'<text x="{left + 8}" y="{top + 18}" font-size="12" fill="{MUTED}">'
                         f"waiting for the first measurement…</text>")
        for i, name in enumerate(names):
            parts += self._svg_row(name, top + i * row, row, left, x)
        for i, line in enumerate(footer):
            parts.append(f'<text x="10" y="{axis_y + 58 + 15 * i}" font-size="11" fill="{MUTED}">{_esc(line)}</text>')
        parts.append("</svg>")
        return "\n".join(parts)

    def _left_margin(self) -> int:
        longest = max((len(n) for n in self._values), default=8)
        return int(min(280, 16 + 7 * longest))

    def _svg_row(self, name: str, y: float, row: float, left: float, x) -> list[str]:
        v, p = self._values[name], self._predicted.get(name)
        bar_h = row - 10
        text = f"{_fmt(v)} {self.unit}" + (f" (pred. {_fmt(p)})" if p is not None else "")
        out = [
            f'<text x="{left - 8}" y="{y + row / 2 + 4}" font-size="12" text-anchor="end" '
            f'fill="{INK}">{_esc(name)}</text>',
            f'<rect class="measured" x="{left}" y="{y + 5}" width="{x(v) - left:.1f}" height="{bar_h}" '
            f'fill="{MEASURED_COLOR}"/>',
            f'<text x="{max(x(v), x(p or 0)) + 8:.1f}" y="{y + row / 2 + 4}" font-size="12" '
            f'fill="{INK}">{_esc(text)}</text>',
        ]
        if p is not None:
            out.append(f'<line class="predicted" x1="{x(p):.1f}" y1="{y + 1}" x2="{x(p):.1f}" y2="{y + row - 1}" '
                       f'stroke="{PREDICTED_COLOR}" stroke-width="3"><title>predicted {_fmt(p)} '
                       f"{_esc(self.unit)}</title></line>")
        return out

    def _svg_axis(self, ticks: list[float], top: float, y: float, x) -> list[str]:
        out = [f'<line x1="{x(0)}" y1="{y}" x2="{x(ticks[-1])}" y2="{y}" stroke="{MUTED}"/>']
        for t in ticks:
            out.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{y + 5}" stroke="#e3e3e3"/>')
            out.append(f'<text x="{x(t):.1f}" y="{y + 18}" font-size="11" text-anchor="middle" '
                       f'fill="{MUTED}">{_fmt(t)}</text>')
        out.append(f'<text x="{(x(0) + x(ticks[-1])) / 2}" y="{y + 36}" font-size="12" text-anchor="middle" '
                   f'fill="{INK}">time ({_esc(self.unit)})</text>')
        return out

    def _svg_legend(self, x: float, y: float) -> list[str]:
        return [
            f'<rect x="{x}" y="{y - 11}" width="14" height="12" fill="{MEASURED_COLOR}"/>',
            f'<text x="{x + 20}" y="{y}" font-size="12" fill="{INK}">measured</text>',
            f'<line x1="{x + 100}" y1="{y - 13}" x2="{x + 100}" y2="{y + 3}" stroke="{PREDICTED_COLOR}" '
            f'stroke-width="3"/>',
            f'<text x="{x + 108}" y="{y}" font-size="12" fill="{INK}">predicted</text>',
        ]

    # -- static output ----------------------------------------------------------------------------------
    def figure(self) -> Figure:
        names = list(self._values)
        fig = Figure(figsize=(8, 1.4 + 0.45 * max(len(names), 1)), layout="constrained")
        ax = fig.add_subplot()
        ys = range(len(names))
        ax.barh(list(ys), [self._values[n] for n in names], height=0.6, color=MEASURED_COLOR, label="measured")
        pred = [(i, self._predicted[n]) for i, n in enumerate(names) if n in self._predicted]
        if pred:
            ax.scatter([p for _, p in pred], [i for i, _ in pred], marker="|", s=500, linewidths=3,
                       color=PREDICTED_COLOR, label="predicted", zorder=3)
        for i, n in enumerate(names):
            p = self._predicted.get(n)
            text = f"  {_fmt(self._values[n])}" + (f" (pred. {_fmt(p)})" if p is not None else "")
            ax.text(max(self._values[n], p or 0), i, text, va="center", fontsize=9)
        if not names:
            ax.text(0.5, 0.5, "no measurements yet", transform=ax.transAxes, ha="center", color=MUTED)
        ax.set_yticks(list(ys), names)
        ax.invert_yaxis()
        ax.set_xlabel(f"time ({self.unit})")
        ax.set_xlim(0, max([*self._values.values(), *self._predicted.values(), 0]) * 1.3 or 1)
        ax.spines[["top", "right"]].set_visible(False)
        if names:
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False, markerscale=0.5)
        ax.set_title(self.title, fontsize=11)
        _footer(fig, self.label)
        return fig

    def png(self) -> bytes:
        return _png(self.figure())

    def __repr__(self) -> str:
        lines = [f"{self.title} [{self.label}]"]
        for n, v in self._values.items():
            p = self._predicted.get(n)
            lines.append(f"  {n}: {_fmt(v)} {self.unit}" + (f" (predicted {_fmt(p)})" if p is not None else ""))
        return "\n".join(lines)

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs) -> dict:
        return _bundle(self.widget, repr(self), self.png())


# -- roofline -------------------------------------------------------------------------------------------
def roofline_figure(peak_tflops: float, bandwidth_GBps: float, points, device_label: str) -> Figure:
    """Log-log roofline: the memory slope, the compute roof, the ridge, and the given points.

    ``points`` are ``(name, intensity in FLOP/byte, achieved TFLOP/s or None)``; a point without a
    measurement is drawn on the roof (the best the device could do at that intensity), hollow.
    """
    points = list(points)
    for name, intensity, _ in points:
        if not intensity > 0:
            raise ValueError(f"{name}: arithmetic intensity must be > 0 FLOP/byte for a log axis, got {intensity}")
    ridge = machine_balance(peak_tflops, bandwidth_GBps)
    xs = [ridge] + [p[1] for p in points]
    lo, hi = min(xs) / 8, max(xs) * 8
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    roof = [roofline_tflops(x, peak_tflops, bandwidth_GBps) for x in grid]

    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.plot(grid, roof, color=INK, lw=2, gid="roof")
    ax.axvline(ridge, color=MUTED, ls=":", lw=1)
    ax.plot([ridge], [peak_tflops], "o", color=INK, gid="ridge")
    # Labels sit where neither the roof nor the points tend to be: above the roof's height left of the
    # ridge, below the slope (which rises away from a label that starts under it), up the ridge line.
    ax.text(ridge / 1.3, peak_tflops * 1.3, f"compute roof: {peak_tflops:.3g} TFLOP/s →", ha="right", fontsize=9)
    x0 = lo * 1.5
    ax.text(x0, roofline_tflops(x0, peak_tflops, bandwidth_GBps) / 3, f"memory slope: {bandwidth_GBps:.4g} GB/s",
            va="top", fontsize=9)
    ys = [peak_tflops] + _plot_points(ax, points, peak_tflops, bandwidth_GBps)
    ax.set_xlim(lo, hi)
    bottom = min(roof[0], *ys) / 10
    ax.set_ylim(bottom, peak_tflops * 4)
    ax.text(ridge * 1.12, bottom * 1.5, f"ridge: {ridge:.3g} FLOP/byte", rotation=90, va="bottom", fontsize=9,
            color=MUTED, gid="ridge-label")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(f"Roofline — {device_label}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if points:
        ax.legend(loc="lower right", fontsize=8)
    return fig


def _plot_points(ax, points, peak_tflops: float, bandwidth_GBps: float) -> list[float]:
    """Measured points filled, predicted ones hollow on the roof; returns their heights (for the y range)."""
    ys, seen = [], set()
    for k, (name, intensity, achieved) in enumerate(points):
        on_roof = roofline_tflops(intensity, peak_tflops, bandwidth_GBps)
        y = on_roof if achieved is None else achieved
        kind = "on the roof (predicted)" if achieved is None else "measured"
        ax.plot([intensity], [y], "o", ms=8, gid=f"point:{name}", color=READ_COLOR,
                mfc="white" if achieved is None else READ_COLOR, mew=2,
                label=None if kind in seen else kind, zorder=3)
        seen.add(kind)
        if achieved is not None and achieved < on_roof:  # the gap to the roof is what is left to win
            ax.plot([intensity, intensity], [achieved, on_roof], color=READ_COLOR, ls=":", lw=1)
        # alternate upper-left / lower-right so neighbouring points do not write over each other
        above = k % 2 == 0
        ax.annotate(name, (intensity, y), xytext=(-7, 7) if above else (7, -7), textcoords="offset points",
                    ha="right" if above else "left", va="bottom" if above else "top", fontsize=8)
        ys.append(y)
    return ys


def show(fig: Figure):
    """A figure as a displayable PNG (leave it last in a cell). Our figures are built without pyplot,
    so the notebook's inline backend does not draw them by itself."""
    from IPython.display import Image

    return Image(data=_png(fig), format="png")
