"""Timing bars that fill in as measurements arrive, with the prediction marked on each bar.

One renderer: matplotlib draws the chart once per update into a PNG, shown live in an
``ipywidgets.Image`` and saved with the notebook as the display's ``image/png``.

A draw costs a few hundred milliseconds of CPU, so drawing is debounced: ``add`` only records the
number, and the chart is redrawn when it is displayed, at most every ``interval_s`` while results keep
arriving (a live measurement, where each result takes a second or more, still grows bar by bar), and
once more when the cell finishes (IPython's ``post_run_cell``) or on ``flush()``. Recorded results,
which arrive all at once, are drawn once.

The layout is computed from the measured sizes of the texts, not left to a layout engine: the names,
values, title and footer always fit the canvas, and no layout pass doubles the cost of a draw.
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Iterable

import ipywidgets as widgets
from IPython import get_ipython
from IPython.display import display
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import offset_copy

from .. import bench
from ._style import (
    DPI,
    FOOTER_SIZE,
    GRID,
    INK,
    LABEL_SIZE,
    MEASURED_COLOR,
    MUTED,
    NOTE_SIZE,
    PREDICTED_COLOR,
    TITLE_SIZE,
    esc,
    fmt,
    new_figure,
    png,
    widget_view,
    wrap,
)

_MS_TO = {"s": 1e-3, "ms": 1.0, "us": 1e3, "µs": 1e3}
_WIDTH_IN = 8.0
_PAD = 10  # px around the canvas and between blocks
_NAME_SHARE = 0.42  # the names column takes at most this share of the width; longer names wrap


class TimingBars:
    """Horizontal timing bars that grow as measurements arrive, with the prediction marked on each.

        bars = TimingBars("cos chain, 2^28 fp32 elements", label=fusionlab.bench.source_label())
        bars.show()
        fusionlab.bench.run(cases, on_result=bars.add_result)

    ``label`` says where the numbers come from (default: ``fusionlab.bench.source_label()``); it is
    printed under the chart.
    """

    #: least time between two draws while results keep arriving (the first draw after ``show`` waits too,
    #: so results that arrive together are drawn together)
    interval_s = 0.3

    def __init__(self, title: str, unit: str = "ms", label: str | None = None):
        self.title = title
        self.unit = unit
        # default: where this machine's lesson timings come from (measured here, or the recording's
        # label): numbers recorded elsewhere must never carry this machine's name
        self.label = label if label is not None else bench.source_label()
        self._values: dict[str, float] = {}
        self._predicted: dict[str, float] = {}
        # shown at the size it is drawn (a front end would otherwise stretch it to the output's width, blurred),
        # narrower only where the output is
        self._image = widgets.Image(
            format="png", layout=widgets.Layout(width=f"{_WIDTH_IN * DPI:.0f}px", max_width="100%", height="auto")
        )
        self._waiting = widgets.HTML(
            f'<span style="color:{MUTED}">{esc(title)}: waiting for the first measurement…</span>'
        )
        self.widget = widgets.VBox([self._waiting, self._image])
        self._png: bytes | None = None  # the chart as last drawn
        self._dirty = True  # the numbers changed since
        self._live = False  # displayed somewhere, so new numbers should reach the screen
        self._handle = None  # show()'s display, updated with the final PNG for the saved notebook
        self._handle_png: bytes | None = None
        self._hooked = False
        self._last_draw = -math.inf
        self._draw_s = 0.0
        #: how many times the chart has been drawn (what the debouncing saves; tests count it)
        self.draws = 0

    @classmethod
    def from_results(cls, results: Iterable, title: str, label: str, unit: str = "ms") -> TimingBars:
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
        """Add a bar (or update the one called ``name``); the chart is redrawn at most every ``interval_s``."""
        for what, v in (("value", value), ("prediction", predicted)):
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: {what} must be a finite number >= 0, got {v!r}")
        self._values[name] = float(value)
        if predicted is None:
            self._predicted.pop(name, None)
        else:
            self._predicted[name] = float(predicted)
        self._dirty = True
        if self._live:
            if time.monotonic() - self._last_draw >= max(self.interval_s, 2 * self._draw_s):
                self._draw()
            self._flush_after_cell()

    def add_result(self, result) -> None:
        """Add a ``fusionlab.bench.Result`` (anything with ``name``, ``ms``, ``predicted_ms``): pass as
        ``on_result=bars.add_result`` to ``bench.run``."""
        if self.unit not in _MS_TO:
            raise ValueError(f"cannot convert milliseconds to {self.unit!r}; use one of {', '.join(_MS_TO)}")
        k = _MS_TO[self.unit]
        pred = getattr(result, "predicted_ms", None)
        self.add(result.name, result.ms * k, None if pred is None else pred * k)

    # -- display ------------------------------------------------------------------------------------------
    def show(self) -> None:
        """Display the bars and keep the display, so its saved PNG follows later ``add`` calls.

        Plain ``display(bars)`` works as well, but its saved PNG is the picture at display time."""
        self._live = True
        if self._values and self._dirty:
            self._draw()
        self._last_draw = time.monotonic()  # results that arrive right after show() are drawn together
        self._handle = display(self._bundle(), raw=True, display_id=True)
        self._handle_png = self._png
        self._flush_after_cell()

    def flush(self) -> None:
        """Draw now if the numbers changed, and bring ``show()``'s saved PNG up to date."""
        if self._dirty:
            self._draw()
        if self._handle is not None and self._handle_png is not self._png:
            self._handle.update(self._bundle(), raw=True)
            self._handle_png = self._png

    def png(self) -> bytes:
        """The chart as PNG bytes (drawn only if the numbers changed since the last draw)."""
        if self._dirty or self._png is None:
            self._draw()
        return self._png

    def _flush_after_cell(self) -> None:
        """Draw the final state when the running cell finishes (only inside IPython)."""
        ip = get_ipython()
        if ip is not None and not self._hooked:
            ip.events.register("post_run_cell", self._after_cell)
            self._hooked = True

    def _after_cell(self, result=None) -> None:
        get_ipython().events.unregister("post_run_cell", self._after_cell)
        self._hooked = False
        self.flush()

    def _draw(self) -> None:
        start = time.perf_counter()
        self._png = png(self.figure())
        self._image.value = self._png
        self._waiting.layout.display = "none"
        self._dirty = False
        self.draws += 1
        self._last_draw = time.monotonic()
        self._draw_s = time.perf_counter() - start

    def _bundle(self) -> dict:
        out = {**widget_view(self.widget), "text/plain": repr(self)}
        if self._png is not None:
            out["image/png"] = _b64(self._png)
        return out

    def __repr__(self) -> str:
        # deterministic (no timings): nbval compares text/plain in cells that do not ignore their output
        n = len(self._values)
        return f"TimingBars({self.title!r}: {n} bar{'' if n == 1 else 's'}, {self.unit})"

    def text(self) -> str:
        """The numbers as text: the title, where they come from, one line per bar."""
        lines = [f"{self.title} [{self.label}]"]
        for n, v in self._values.items():
            p = self._predicted.get(n)
            lines.append(f"  {n}: {fmt(v)} {self.unit}" + (f" (predicted {fmt(p)})" if p is not None else ""))
        return "\n".join(lines)

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs) -> dict:
        self._live = True
        self.png()
        return self._bundle()

    # -- drawing --------------------------------------------------------------------------------------------
    def figure(self) -> Figure:
        """The chart as a matplotlib figure, laid out by hand from the sizes of its texts."""
        names = list(self._values)
        fig = new_figure(_WIDTH_IN, 4.0, constrained=False)  # the height is set below, once known
        renderer = fig.canvas.get_renderer()
        width = _WIDTH_IN * DPI
        size = lambda t: (t.get_window_extent(renderer).width, t.get_window_extent(renderer).height)

        head = fig.text(0, 0, wrap(self.title, _WIDTH_IN - 0.25, TITLE_SIZE), fontsize=TITLE_SIZE, weight="bold")
        foot = fig.text(0, 0, wrap(self.label, _WIDTH_IN - 0.25, FOOTER_SIZE), fontsize=FOOTER_SIZE, color=MUTED)
        legend_h, tick_h, xlabel_h = 22, 16, 18
        top_h = size(head)[1] + legend_h + 2 * _PAD
        bottom_h = tick_h + xlabel_h + size(foot)[1] + 2 * _PAD

        ax = fig.add_axes((0, 0, 1, 1))
        labels = [self._name_text(ax, n, width) for n in names]
        name_w = max([size(t)[0] for t in labels], default=60)
        row_h = max([28.0, *(size(t)[1] + 8 for t in labels)])
        plot_h = row_h * max(len(names), 1)
        height = top_h + plot_h + bottom_h
        left = _PAD + name_w + 8
        plot_w = width - left - _PAD
        fig.set_size_inches(_WIDTH_IN, height / DPI)

        # texts first: how far right the axis must reach depends on how wide each value's text is
        values = [self._value_text(ax, n) for n in names]
        ends = [max(self._values[n], self._predicted.get(n, 0.0)) for n in names]
        xmax = max(ends) * 1.05 if any(ends) else 1.0
        for end, t in zip(ends, values, strict=True):
            room = max(plot_w - size(t)[0] - 12, 0.25 * plot_w)
            xmax = max(xmax, end * plot_w / room)
        ax.set_position((left / width, bottom_h / height, plot_w / width, plot_h / height))
        ax.set_xlim(0, xmax)
        ax.set_ylim(max(len(names), 1) - 0.5, -0.5)
        for i, (end, t, name) in enumerate(zip(ends, values, labels, strict=True)):
            t.set_position((end + xmax * 6 / plot_w, i))
            name.set_position((0, i))

        ys = list(range(len(names)))
        ax.barh(ys, [self._values[n] for n in names], height=0.6, color=MEASURED_COLOR)
        pred = [(i, self._predicted[n]) for i, n in enumerate(names) if n in self._predicted]
        if pred:
            i_, p_ = zip(*pred, strict=True)
            ax.vlines(p_, [i - 0.42 for i in i_], [i + 0.42 for i in i_], colors=PREDICTED_COLOR, lw=3, zorder=3)
        if not names:
            ax.text(0.02, 0.5, "waiting for the first measurement…", transform=ax.transAxes, va="center", color=MUTED)
        ax.set_yticks([])
        ax.tick_params(axis="x", labelsize=NOTE_SIZE, colors=MUTED, labelcolor=INK)
        # a time unit reads "time (ms)"; anything else (a rate such as TFLOP/s) is named as it is
        xlabel = f"time ({self.unit})" if self.unit in _MS_TO else self.unit
        ax.set_xlabel(xlabel, fontsize=LABEL_SIZE, color=INK, labelpad=2)
        ax.grid(True, axis="x", color=GRID, lw=0.8)
        ax.set_axisbelow(True)
        ax.spines[["top", "right"]].set_visible(False)
        ax.spines[["left", "bottom"]].set_color(MUTED)

        head.set_position((_PAD / width, 1 - _PAD / height))
        head.set(va="top", ha="left", color=INK)
        foot.set_position((1 - _PAD / width, _PAD / height))
        foot.set(va="bottom", ha="right", multialignment="left")
        handles = [Patch(color=MEASURED_COLOR, label="measured")]
        if pred:
            handles.append(Line2D([], [], color=PREDICTED_COLOR, marker="|", ls="", ms=12, mew=3, label="predicted"))
        fig.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(left / width, 1 - (size(head)[1] + _PAD + 2) / height),
            ncol=2,
            fontsize=NOTE_SIZE,
            frameon=False,
            borderaxespad=0,
            borderpad=0,
            handlelength=1.2,
        )
        return fig

    def _name_text(self, ax, name: str, width: float):
        """A bar's name right-aligned left of the axis; names wider than their column share wrap."""
        t = ax.text(0, 0, name, fontsize=LABEL_SIZE, ha="right", va="center", color=INK, parse_math=False)
        t.set_gid(f"name:{name}")
        # x in axes fractions, 6 px left of the axis; y in rows
        t.set_transform(offset_copy(ax.get_yaxis_transform(), ax.figure, x=-6, units="dots"))
        if t.get_window_extent(ax.figure.canvas.get_renderer()).width > _NAME_SHARE * width:
            t.set_text(wrap(name, _NAME_SHARE * _WIDTH_IN, LABEL_SIZE))
        return t

    def _value_text(self, ax, name: str):
        v, p = self._values[name], self._predicted.get(name)
        text = f"{fmt(v)} {self.unit}" + (f" (pred. {fmt(p)})" if p is not None else "")
        return ax.text(0, 0, text, fontsize=LABEL_SIZE, va="center", color=INK, parse_math=False)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
