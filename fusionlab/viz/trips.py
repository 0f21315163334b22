"""The memory-trip animation: HBM <-> chip trips of a ledger, unfused beside fused, one trip per frame.

The animation is SVG in an ``ipywidgets.HTML``: the kernel redraws it on every frame and the browser
needs nothing but the HTML widget. Its display bundle carries the same SVG (all trips made) as
``text/html``, so a notebook saved without widget state still shows a picture. ``trips_figure`` is a
different chart, a static summary of the bytes, drawn with matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets as widgets
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..ledger import READ, WRITE, Ledger, Trip, human_bytes
from ._style import (
    COUNTED_LABEL,
    INK,
    LABEL_SIZE,
    MUTED,
    NOTE_SIZE,
    READ_COLOR,
    STAY_COLOR,
    WRITE_COLOR,
    byte_unit,
    esc,
    footer,
    keep_inside,
    new_figure,
    plural,
    set_title,
    widget_view,
    wrap,
)

_ARROW = {READ: "HBM → chip", WRITE: "chip → HBM"}
_VERB = {READ: "reads", WRITE: "writes"}
_DIR_COLOR = {READ: READ_COLOR, WRITE: WRITE_COLOR}


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
    # Rule-based fused trips are a subsequence of the unfused ones (same order, some dropped): match them
    # in order to recover each one's op index, which the trip itself does not carry. A trip no eager op
    # makes (a re-read, a step of a written-out schedule) belongs with the trip before it.
    op_index, j = [], 0
    for t in trips:
        k = j
        while k < len(unfused) and (unfused[k].op, unfused[k].tensor, unfused[k].direction) != (
            t.op,
            t.tensor,
            t.direction,
        ):
            k += 1
        if k < len(unfused):
            op_index.append(unfused_idx[k])
            j = k + 1
        else:
            op_index.append(op_index[-1] if op_index else 0)
    slots, inputs = [], set()
    for t in trips:
        if t.tensor not in slots:
            slots.append(t.tensor)
            if t.direction == READ:
                inputs.add(t.tensor)
    nbytes = {t.tensor: t.nbytes for t in unfused}
    for t in trips:  # tensors only a fused schedule moves (statistics written by the kernel)
        nbytes.setdefault(t.tensor, t.nbytes)
    return _Timeline(trips, op_index, slots, inputs, nbytes)


# -- one panel of the animation as SVG ----------------------------------------------------------------------
_W, _H = 460, 336
_BOX_X, _BOX_W, _BOX_H = 16, 428, 80
_CHIP_Y, _HBM_Y = 54, 206
_NOTE_H = 22  # the extra height of a panel whose animation has notes
_TILE_COLS, _ROW_H = 8, 22  # tiles a row in a box; the HBM box grows by a row's height past two rows


def _hbm_growth(tl: _Timeline) -> int:
    """Pixels the HBM box grows by to hold this panel's tensors: a whole layer's thirty would leave each
    of four rows eight pixels high in the box's own height."""
    rows = math.ceil(len(tl.hbm_slots) / _TILE_COLS)
    return max(0, rows - 2) * _ROW_H


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


def _svg_chips(chips: list[_Chip], nbytes: dict[str, int], box_y: float, box_h: float = _BOX_H) -> list[str]:
    """Tensor tiles in a box, in rows of at most 8, shrinking to fit rather than overflowing."""
    if not chips:
        return []
    cols = min(len(chips), _TILE_COLS)
    rows = math.ceil(len(chips) / cols)
    area_y, area_h = box_y + 26, box_h - 32
    w = min(56.0, (_BOX_W - 16) / cols - 6)
    h = min(26.0, area_h / rows - 4)
    font = max(8.0, min(13.0, h - 10, w / 3))
    out = []
    for k, c in enumerate(chips):
        label, size = _fit_label(c.name, w - 6, font)
        x = _BOX_X + 10 + (k % cols) * (w + 6)
        y = area_y + (k // cols) * (h + 4)
        fill, stroke, ink, dashed = _CHIP_STYLE[c.style]
        width = 1.5
        if c.current:
            stroke, width = _DIR_COLOR[c.current], 3.5
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        tip = f"{c.name}: {human_bytes(nbytes.get(c.name, 0))}"
        out.append(
            f'<g><title>{esc(tip)}</title><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
            f'rx="4" fill="{fill}" stroke="{stroke}" stroke-width="{width}"{dash}/>'
            f'<text x="{x + w / 2:.1f}" y="{y + h / 2 + size / 3:.1f}" font-size="{size:.{0 if size == font else 1}f}" '
            f'text-anchor="middle" fill="{ink}">{esc(label)}</text></g>'
        )
    return out


#: a sans-serif glyph's advance, as a share of the font size, with room for wide ones (DejaVu Sans: 0.55-0.82)
_GLYPH_WIDTH = 0.66
#: the smallest font a tile's label shrinks to before it is cut short (its tooltip keeps the whole name)
_MIN_FONT = 7.0


def _fit_label(name: str, width: float, font: float) -> tuple[str, float]:
    """``name`` and a font size that fit ``width`` pixels: smaller type first, down to :data:`_MIN_FONT`,
    then the name cut short with an ellipsis (a layer's tiles are narrow; "o_proj + residual: temporaries"
    would spill over its neighbours)."""
    if len(name) * _GLYPH_WIDTH * font <= width:
        return name, font
    size = width / (len(name) * _GLYPH_WIDTH)
    if size >= _MIN_FONT:
        return name, size
    size = min(font, _MIN_FONT)
    keep = max(1, int(width / (_GLYPH_WIDTH * size)) - 1)
    return name[:keep] + "…", size


def _svg_box(y: float, label: str, fill: str, stroke: str, note: str = "", h: float = _BOX_H) -> list[str]:
    out = [
        f'<rect x="{_BOX_X}" y="{y}" width="{_BOX_W}" height="{h}" rx="8" fill="{fill}" '
        f'stroke="{stroke}" stroke-width="1.5"/>',
        f'<text x="{_BOX_X + 10}" y="{y + 18}" font-size="13" font-weight="bold" fill="{INK}">{esc(label)}</text>',
    ]
    if note:
        out.append(
            f'<text x="{_BOX_X + _BOX_W - 10}" y="{y + 18}" font-size="11" text-anchor="end" '
            f'fill="{STAY_COLOR}">{esc(note)}</text>'
        )
    return out


def _svg_l2() -> list[str]:
    """The middle floor: the L2 cache every trip between HBM and the chip passes through. Lesson 1's
    size sweep shows when it matters (an intermediate that fits stays there, never reaching HBM)."""
    y = _CHIP_Y + _BOX_H + 3
    return [
        f'<rect x="{_BOX_X}" y="{y}" width="{_BOX_W}" height="14" rx="3" fill="#f7f3ea" stroke="#b8a98a" '
        'stroke-width="1" stroke-dasharray="5 3"/>',
        f'<text x="{_BOX_X + _BOX_W - 8}" y="{y + 10.5}" font-size="10" text-anchor="end" fill="#7a6a4a">'
        "L2 cache, tens of MiB: every trip passes it; data that fits can stay</text>",
    ]


def _svg_arrow(trip: Trip | None, idle_text: str) -> list[str]:
    """The current trip as a thick arrow between the boxes, or a grey line of text when there is none."""
    top, bottom = _CHIP_Y + _BOX_H + 4, _HBM_Y - 4
    mid = (top + bottom) / 2
    if trip is None:
        return [
            f'<text x="{_W / 2}" y="{mid + 4}" font-size="12" text-anchor="middle" '
            f'fill="{MUTED}">{esc(idle_text)}</text>'
        ]
    color, x = _DIR_COLOR[trip.direction], 64
    tip, tail = (top, bottom) if trip.direction == READ else (bottom, top)
    head = 12 if trip.direction == READ else -12
    return [
        f'<line x1="{x}" y1="{tail}" x2="{x}" y2="{tip + head}" stroke="{color}" stroke-width="7"/>',
        f'<polygon points="{x - 11},{tip + head} {x + 11},{tip + head} {x},{tip}" fill="{color}"/>',
        f'<text x="{x + 24}" y="{mid - 4}" font-size="14" font-weight="bold" fill="{INK}">'
        f"{esc(trip.op)} {_VERB[trip.direction]} {esc(trip.tensor)}</text>",
        f'<text x="{x + 24}" y="{mid + 14}" font-size="12" fill="{color}">'
        f"{esc(human_bytes(trip.nbytes))} · {_ARROW[trip.direction]}</text>",
    ]


def _svg_counter(moved: int, total: int, scale: int, grow: int = 0) -> list[str]:
    """The running byte counter over a bar; both panels share one scale, so the fused bar is shorter."""
    y, full = _H + grow - 34, _BOX_W
    track = full * total / scale if scale else 0
    fill = full * moved / scale if scale else 0
    return [
        f'<text x="{_BOX_X}" y="{y}" font-size="13" fill="{INK}">bytes moved: '
        f'<tspan font-weight="bold">{esc(human_bytes(moved))}</tspan> of {esc(human_bytes(total))}</text>',
        f'<rect x="{_BOX_X}" y="{y + 8}" width="{track:.1f}" height="12" rx="3" fill="#e6e6e6"/>',
        f'<rect x="{_BOX_X}" y="{y + 8}" width="{fill:.1f}" height="12" rx="3" fill="{MUTED}"/>',
    ]


def _status(tl: _Timeline, ledger: Ledger, shown: int, fused: bool, frame: int) -> str:
    n, kernels = len(tl.trips), 1 if fused else len(ledger.ops)
    if frame == 0:
        return f"ready: {plural(n, 'trip')} in {plural(kernels, 'kernel')}"
    if frame > n:  # this panel has finished while the other one is still moving bytes
        return f"done: {plural(n, 'trip')} in {plural(kernels, 'kernel')}"
    i, step = tl.op_index[shown - 1], tl.trips[shown - 1].op
    if fused and step != ledger.ops[i].name:  # a step of a written-out schedule ("write O, lse"): its own name
        return f"trip {shown} of {n} · {step}"
    where = f"op {i + 1} of {len(ledger.ops)}" if fused else f"kernel {i + 1} of {kernels}"
    return f"trip {shown} of {n} · {where}: {ledger.ops[i].name}"


def _idle_text(frame: int, last_frame: int, fused: bool = True) -> str:
    """What the arrow's place says in a frame where the panel makes no trip."""
    if frame == 0:
        return "press ▶ or Step: each trip moves one tensor"
    if frame < last_frame:  # a schedule of several passes can make more trips than the unfused chain
        return f"finished: the {'unfused kernels are' if fused else 'fused schedule is'} still moving bytes"
    return "done: no more trips"


def _svg_note(note: str, grow: int = 0) -> list[str]:
    """The caller's line for this frame (the state a kernel keeps on chip, say), under the counter."""
    return [f'<text x="{_BOX_X}" y="{_H + grow + 12}" font-size="12" fill="{STAY_COLOR}">{esc(note)}</text>']


def _panel_svg(
    ledger: Ledger,
    tl: _Timeline,
    fused: bool,
    frame: int,
    last_frame: int,
    scale: int,
    note: str | None = None,
    grow: int = 0,
) -> str:
    """One panel; ``note`` (``None``: the animation has no notes) adds a line of text under the counter;
    ``grow``: pixels added to the HBM box (:func:`_hbm_growth`, the same for both panels)."""
    height = (_H if note is None else _H + _NOTE_H) + grow
    shown = min(frame, len(tl.trips))
    current = tl.trips[shown - 1] if 0 < frame <= len(tl.trips) else None
    title = "fused (one kernel)" if fused else "unfused (one kernel per op)"
    chip = _mark_current(_on_chip(tl, ledger, shown, fused), current)
    stays = any(c.style == "stays" for c in chip)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {height}" width="{_W}" height="{height}" '
        f'style="width:100%;height:auto;max-width:{_W}px" font-family="sans-serif">',
        f'<rect width="{_W}" height="{height}" fill="white"/>',
        f'<text x="{_W / 2}" y="22" font-size="16" font-weight="bold" text-anchor="middle" '
        f'fill="{INK}">{esc(title)}</text>',
        f'<text x="{_W / 2}" y="42" font-size="12" text-anchor="middle" fill="{MUTED}">'
        f"{esc(_status(tl, ledger, shown, fused, frame))}</text>",
        *_svg_box(
            _CHIP_Y, "on chip (SRAM + registers)", "#f1f8ee", "#7a9a6a", "dashed: never goes to HBM" if stays else ""
        ),
        *_svg_chips(chip, tl.nbytes, _CHIP_Y),
        *_svg_l2(),
        *_svg_arrow(current, _idle_text(frame, last_frame, fused)),
        *_svg_box(_HBM_Y, "HBM (off-chip DRAM)", "#eef1f6", "#6a7a9a", h=_BOX_H + grow),
        *_svg_chips(_mark_current(_in_hbm(tl, shown), current), tl.nbytes, _HBM_Y, _BOX_H + grow),
        *_svg_counter(sum(t.nbytes for t in tl.trips[:shown]), tl.total, scale, grow),
        *(_svg_note(note, grow) if note else []),
        "</svg>",
    ]
    return "\n".join(parts)


# -- the static summary: every trip as a segment of a bar -----------------------------------------------------
def trips_figure(ledger: Ledger, title: str = "", device_label: str | None = None) -> Figure:
    """Every HBM trip as a segment of a bar, unfused above fused; the bar length is bytes moved.

    ``device_label`` defaults to a note that the bytes are counted, not measured: the ledger is
    arithmetic, the same on every device.
    """
    rows = [("unfused", _timeline(ledger, False)), ("fused", _timeline(ledger, True))]
    div, unit = byte_unit(max(tl.total for _, tl in rows))
    longest = max(tl.total for _, tl in rows) / div or 1
    fig = new_figure(9.5, 3.4)
    ax = fig.add_subplot()
    segments = []
    for y, (name, tl) in zip((1, 0), rows, strict=True):
        segments += _trip_bar(ax, y, tl, div)
        ax.text(tl.total / div + 0.01 * longest, y, _row_note(ledger, tl, name == "fused"), va="center", fontsize=9)
    kernels = len(ledger.ops)
    ax.set_yticks([1, 0], [f"unfused\n({plural(kernels, 'kernel')})", "fused\n(1 kernel)"])
    ax.tick_params(labelsize=LABEL_SIZE)
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlim(0, longest * 1.45)
    ax.set_xlabel(f"bytes moved through HBM ({unit})", fontsize=LABEL_SIZE)
    ax.legend(
        handles=[
            Patch(color=READ_COLOR, label="read: HBM → chip"),
            Patch(color=WRITE_COLOR, label="write: chip → HBM"),
        ],
        loc="upper right",
        fontsize=NOTE_SIZE,
        frameon=False,
    )
    ax.spines[["top", "right"]].set_visible(False)
    saving = f"fusion moves {ledger.saving:.2f}× fewer bytes" if ledger.fused_bytes else ""
    set_title(ax, "\n".join(s for s in (title or "Memory trips", saving) if s))
    footer(fig, device_label or COUNTED_LABEL)
    keep_inside(fig)
    _hide_labels_wider_than_their_segment(fig, segments)
    return fig


def _trip_bar(ax, y: float, tl: _Timeline, div: float) -> list:
    """One bar of trips; returns (segment, its label) pairs so labels that do not fit can be hidden."""
    left, out = 0.0, []
    for t in tl.trips:
        width = t.nbytes / div
        (bar,) = ax.barh(y, width, left=left, height=0.6, color=_DIR_COLOR[t.direction], edgecolor="white")
        text = ax.text(
            left + width / 2,
            y,
            f"{t.op}\n{t.direction} {t.tensor}",
            ha="center",
            va="center",
            fontsize=NOTE_SIZE,
            color="white",
            parse_math=False,
        )
        out.append((bar, text))
        left += width
    return out


def _hide_labels_wider_than_their_segment(fig: Figure, segments) -> None:
    renderer = fig.canvas.get_renderer()  # laid out by keep_inside just before
    for bar, text in segments:
        if text.get_window_extent(renderer).width > bar.get_window_extent(renderer).width - 4:
            text.set_visible(False)


def _row_note(ledger: Ledger, tl: _Timeline, fused: bool) -> str:
    note = f"{human_bytes(tl.total)}, {plural(len(tl.trips), 'trip')}"
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

    ``notes`` (fused panel) and ``unfused_notes``: one line of text per frame, drawn under the panel's
    byte counter — what the ledger's trips cannot show, such as the running statistics a fused kernel
    keeps on chip. Without them the panels are drawn exactly as before.

        >>> anim = TripAnimation(Ledger.chain(["cos", "cos"], 1024))
        >>> anim.frame = anim.n_frames - 1
        >>> anim.bytes_moved(fused=False), anim.bytes_moved(fused=True)
        (16384, 8192)
    """

    def __init__(
        self,
        ledger: Ledger,
        title: str = "",
        interval_ms: int = 900,
        *,
        notes: Sequence[str] | None = None,
        unfused_notes: Sequence[str] | None = None,
    ):
        if not ledger.trips(fused=False):
            raise ValueError("the ledger has no trips to animate; add ops with Ledger.op(...) first")
        self.ledger = ledger
        self.title = title
        self._tl = {False: _timeline(ledger, False), True: _timeline(ledger, True)}
        self._notes = {
            False: self._check_notes(unfused_notes, "unfused_notes"),
            True: self._check_notes(notes, "notes"),
        }
        last = self.n_frames - 1
        self._panels = {f: widgets.HTML(layout=widgets.Layout(flex="1 1 0%", min_width="280px")) for f in (False, True)}
        self.play = widgets.Play(value=0, min=0, max=last, step=1, interval=interval_ms, description="play")
        self.slider = widgets.IntSlider(value=0, min=0, max=last, description="trip")
        # jslink moves the slider in the browser without a round trip; both values then sync to Python,
        # where observing the slider alone redraws the panels. Works alike on ipywidgets 7 and 8.
        self._link = widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.step_button = widgets.Button(description="Step", icon="step-forward", layout=widgets.Layout(width="90px"))
        self.reset_button = widgets.Button(description="Reset", icon="undo", layout=widgets.Layout(width="90px"))
        self.step_button.on_click(lambda _: self.step())
        self.reset_button.on_click(lambda _: self.reset())
        self.slider.observe(lambda _: self._render(), names="value")
        self._summary = widgets.HTML()
        head = widgets.HTML(f"<b>{esc(title)}</b>" if title else "")
        self.widget = widgets.VBox(
            [
                head,
                widgets.HBox(list(self._panels.values()), layout=widgets.Layout(width="100%")),
                widgets.HBox([self.play, self.slider, self.step_button, self.reset_button]),
                self._summary,
            ]
        )
        self._render()

    def _check_notes(self, notes: Sequence[str] | None, name: str) -> tuple[str, ...] | None:
        if notes is None:
            return None
        if isinstance(notes, str) or not all(isinstance(n, str) for n in notes):
            raise TypeError(f"{name} must be a sequence of strings, one line per frame")
        if len(notes) > self.n_frames:
            raise ValueError(
                f"{name} has {len(notes)} lines, more than the {self.n_frames} frames (0..{self.n_frames - 1})"
            )
        return tuple(notes)

    def note(self, fused: bool, frame: int | None = None) -> str | None:
        """The caller's line for a panel at a frame (the current one by default): ``notes[frame]`` for the
        fused panel, ``unfused_notes[frame]`` for the other; ``""`` past the end of a shorter list, and
        ``None`` for a panel given no notes."""
        notes = self._notes[fused]
        if notes is None:
            return None
        frame = self.frame if frame is None else frame
        return notes[frame] if frame < len(notes) else ""

    # -- frames -------------------------------------------------------------------------------------------
    @property
    def n_frames(self) -> int:
        # the longer of the two: a fused schedule of several passes can make more trips than eager's chain
        return max(len(self._tl[False].trips), len(self._tl[True].trips)) + 1

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
        """The SVG of one panel at the current frame."""
        return self._panels[fused].value

    def _panel(self, fused: bool, frame: int) -> str:
        scale = self._tl[False].total  # one scale for both counter bars: the fused bar is visibly shorter
        has_notes = any(n is not None for n in self._notes.values())  # both panels the same height
        note = (self.note(fused, frame) or "") if has_notes else None
        grow = max(_hbm_growth(tl) for tl in self._tl.values())  # both panels the same height
        return _panel_svg(self.ledger, self._tl[fused], fused, frame, self.n_frames - 1, scale, note, grow)

    def _render(self) -> None:
        for fused, panel in self._panels.items():
            panel.value = self._panel(fused, self.frame)
        self._summary.value = self._summary_html(self.frame)

    def _summary_html(self, frame: int) -> str:
        led = self.ledger
        if frame < self.n_frames - 1:
            longer = "unfused chain" if len(self._tl[False].trips) == self.n_frames - 1 else "fused schedule"
            text = f"trip {frame} of {self.n_frames - 1} of the {longer}"
        else:
            text = (
                f"<b>fusion moves {led.saving:.2f}× fewer bytes</b>: {human_bytes(led.unfused_bytes)} "
                f"unfused, {human_bytes(led.fused_bytes)} fused"
            )
        return f'<span style="color:{INK}">{text}</span> <span style="color:{MUTED}">({COUNTED_LABEL})</span>'

    # -- static output ----------------------------------------------------------------------------------
    def static_html(self) -> str:
        """Both panels after the last trip, with the summary: what a notebook shows where no kernel runs
        (GitHub, nbviewer, nbconvert), in place of controls that could not move anything there."""
        last = self.n_frames - 1
        panels = "".join(
            f'<div style="flex:1 1 0%;min-width:280px;max-width:460px">{self._panel(f, last)}</div>'
            for f in (False, True)
        )
        head = f"<b>{esc(self.title)}</b><br>" if self.title else ""
        return (
            f'<div>{head}<div style="display:flex;flex-wrap:wrap;gap:8px">{panels}</div>'
            f"<div>all {len(self._tl[False].trips)} unfused trips made: {self._summary_html(last)}</div></div>"
        )

    def __repr__(self) -> str:
        return (
            f"TripAnimation(frame {self.frame} of {self.n_frames - 1}: "
            f"unfused {human_bytes(self.bytes_moved(False))} of {human_bytes(self.ledger.unfused_bytes)}, "
            f"fused {human_bytes(self.bytes_moved(True))} of {human_bytes(self.ledger.fused_bytes)})"
        )

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs) -> dict:
        return {**widget_view(self.widget), "text/html": self.static_html(), "text/plain": repr(self)}


# -- measured beside predicted ----------------------------------------------------------------------------
def _difference(predicted: float, measured: float) -> str:
    if measured == predicted:
        return "= ledger"
    sign = "+" if measured > predicted else "−"
    pct = f" ({sign}{100 * abs(measured - predicted) / predicted:.1f}%)" if predicted else ""
    return f"{sign}{human_bytes(abs(measured - predicted))}{pct}"


def _paired_bars(ax, labels, predicted, measured, colors, div: float) -> None:
    """One row per label: the ledger's bytes as an outlined bar above the measured bytes as a filled one,
    and the difference written after them."""
    longest = max([*predicted, *measured, 1]) / div
    for i, (label, p, m, c) in enumerate(zip(labels, predicted, measured, colors, strict=True)):
        y = len(labels) - 1 - i
        ax.barh(y + 0.18, p / div, height=0.34, color="white", edgecolor=c, hatch="///", gid=f"predicted:{label}")
        ax.barh(y - 0.18, m / div, height=0.34, color=c, gid=f"measured:{label}")
        ax.text(max(p, m) / div + 0.01 * longest, y, _difference(p, m), va="center", fontsize=NOTE_SIZE, color=INK)
    ax.set_yticks(range(len(labels)), list(reversed(labels)))
    ax.tick_params(labelsize=NOTE_SIZE)
    ax.set_xlim(0, longest * 1.35)
    ax.spines[["top", "right"]].set_visible(False)


def measured_figure(checks, kernels=(), title: str = "", source_label: str = "") -> Figure:
    """Measured trips beside the ledger's: per tensor and direction (``checks``, the
    :class:`fusionlab.measure.compare.TripCheck` list of ``against_ledger``) and, when given, per kernel
    (``kernels``: ``(name, predicted bytes, measured bytes)``). Each row shows the prediction as an
    outlined bar, the measurement as a filled one, and their difference. ``source_label`` says where the
    measurement comes from (the interpreter's logical loads, or a GPU's counters), shown at the foot."""
    checks, kernels = list(checks), list(kernels)
    if not checks and not kernels:
        raise ValueError("nothing to show: give the checks of against_ledger(...) or (kernel, predicted, measured)")
    div, unit = byte_unit(max([c.predicted for c in checks] + [c.measured for c in checks] + [k[2] for k in kernels]))
    panels = [p for p in (checks, kernels) if p]
    heights = [max(1.2, 0.42 * len(p) + 0.6) for p in panels]
    fig = new_figure(8.5, sum(heights) + 1.0)
    axes = fig.subplots(len(panels), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    ax_iter = iter(axes)
    if checks:
        ax = next(ax_iter)
        _paired_bars(
            ax,
            [f"{c.direction} {c.tensor}" for c in checks],
            [c.predicted for c in checks],
            [c.measured for c in checks],
            [_DIR_COLOR.get(c.direction, MUTED) for c in checks],
            div,
        )
        ax.set_title("per tensor", fontsize=LABEL_SIZE, loc="left", color=INK)
    if kernels:
        ax = next(ax_iter)
        _paired_bars(
            ax, [k[0] for k in kernels], [k[1] for k in kernels], [k[2] for k in kernels], [INK] * len(kernels), div
        )
        ax.set_title("per kernel", fontsize=LABEL_SIZE, loc="left", color=INK)
    axes[-1].set_xlabel(f"bytes ({unit})", fontsize=LABEL_SIZE)
    fig.legend(
        handles=[
            Patch(facecolor="white", edgecolor=MUTED, hatch="///", label="predicted (ledger)"),
            Patch(color=MUTED, label="measured"),
        ],
        loc="outside upper right",
        ncols=2,
        fontsize=NOTE_SIZE,
        frameon=False,
    )
    predicted = sum(c.predicted for c in checks) if checks else sum(k[1] for k in kernels)
    measured = sum(c.measured for c in checks) if checks else sum(k[2] for k in kernels)
    head = f"measured {human_bytes(measured)} against the ledger's {human_bytes(predicted)}"
    # the title, at the left, wraps short of the legend at the top right beside it
    text = "\n".join(wrap(s, 8.5 * 0.55, LABEL_SIZE + 1) for s in (title, head) if s)
    fig.suptitle(text, fontsize=LABEL_SIZE + 1, color=INK, x=0.01, ha="left")
    if source_label:
        footer(fig, source_label)
    keep_inside(fig)
    return fig
