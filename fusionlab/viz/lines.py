"""Line charts for sweeps, so a notebook cell says what to plot and never how (no hex colours in cells).

``line_chart`` draws measured series with markers and their predictions dashed in the same colour,
with optional horizontal reference lines (the copy ceiling, "predicted k×"). ``regimes_chart`` is the
size sweep: time per call against bytes, log-log, shaded where the launch, the L2 or HBM sets the time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

from ._style import (
    GRID,
    INK,
    LABEL_SIZE,
    MUTED,
    NOTE_SIZE,
    REGION_COLORS,
    SERIES_COLORS,
    fmt,
    footer,
    keep_inside,
    new_figure,
    set_title,
    short_bytes,
)

Series = Mapping[str, tuple[Iterable[float], Iterable[float]]]
Marks = Mapping[str, float] | Iterable[tuple[str, float]]


def line_chart(
    series: Series,
    x_label: str,
    y_label: str,
    title: str,
    label: str,
    logx: bool = False,
    logy: bool = False,
    marks: Marks | None = None,
    predicted: Series | None = None,
) -> Figure:
    """Measured ``series`` (``{name: (xs, ys)}``) as lines with markers; ``predicted`` series of the same
    names dashed in the same colour; ``marks`` (``{name: y}`` or ``[(name, y)]``) as grey horizontal
    reference lines labelled at their right end. ``label`` says where the numbers come from (under the
    chart). A linear y axis starts at 0, so ratios read true. Show it with ``fusionlab.viz.show(fig)``.
    """
    fig = new_figure(7.5, 4.4)
    ax = fig.add_subplot()
    _draw_series(ax, series, predicted or {})
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    if not logy and _all_non_negative(ax):
        ax.set_ylim(bottom=0)
    _draw_marks(ax, marks)
    _finish(fig, ax, x_label, y_label, title, label)
    return fig


def regimes_chart(
    series: Series,
    l2_bytes: float,
    launch_floor: float,
    title: str,
    label: str,
    y_label: str = "time per call (µs)",
    x_label: str = "bytes moved per call",
    launch_bytes: float | None = None,
    predicted: Series | None = None,
    marks: Marks | None = None,
) -> Figure:
    """A size sweep, log-log: ``series`` is ``{name: (bytes moved per call, time per call)}``.

    Three shaded regions: launch-bound (left of ``launch_bytes``: the time is the launch floor, whatever
    the size), L2-resident (up to ``l2_bytes``: the data fits the L2 cache) and HBM-bound (beyond it).
    ``launch_floor`` is in the y axis' unit and drawn as a dashed line. ``launch_bytes`` defaults to
    the largest size at which the first series still takes under 1.5× the floor.
    """
    fig = new_figure(7.5, 4.6)
    ax = fig.add_subplot()
    _draw_series(ax, series, predicted or {})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    lo, hi = ax.get_xlim()
    if launch_bytes is None:
        launch_bytes = _launch_edge(series, launch_floor)
    launch_bytes = min(max(launch_bytes or lo, lo), l2_bytes)
    edges = [lo, launch_bytes, min(max(l2_bytes, lo), hi), hi]
    names = ["launch-bound", "L2-resident", "HBM-bound"]
    regions = []
    for (a, b), name, color in zip(zip(edges[:-1], edges[1:], strict=True), names, REGION_COLORS, strict=True):
        if b > a:
            ax.axvspan(a, b, color=color, zorder=0, lw=0)
            t = ax.text(math.sqrt(a * b), 0.98, name, transform=ax.get_xaxis_transform(), ha="center", va="top")
            t.set(fontsize=NOTE_SIZE, color=MUTED, style="italic")
            regions.append((t, a, b))
    ax.set_xlim(lo, hi)
    ax.axhline(launch_floor, color=MUTED, ls="--", lw=1)
    unit = y_label[y_label.rfind("(") + 1 : -1] if y_label.endswith(")") and "(" in y_label else ""
    floor_text = f"launch floor ≈ {fmt(launch_floor)} {unit}".rstrip()
    # at the right end, where a size sweep has long left the floor behind
    t = ax.text(0.99, launch_floor * 1.05, floor_text, ha="right", va="bottom", fontsize=NOTE_SIZE, color=MUTED)
    t.set_transform(ax.get_yaxis_transform())
    _byte_ticks(ax, lo, hi)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    _draw_marks(ax, marks)
    _finish(fig, ax, x_label, y_label, title, label)
    _fit_region_names(fig, ax, regions)
    return fig


def _fit_region_names(fig: Figure, ax, regions) -> None:
    """A region too narrow for its name gets it upright; one too narrow even for that stays unnamed."""
    renderer = fig.canvas.get_renderer()
    for t, a, b in regions:
        span = ax.transData.transform([(b, 1)])[0][0] - ax.transData.transform([(a, 1)])[0][0]
        ext = t.get_window_extent(renderer)
        if ext.width < span - 4:
            continue
        # upright, reading upwards and hanging from the top: its end is at the anchor, centred across
        t.set(rotation=90, rotation_mode="anchor", ha="right", va="center")
        t.set_visible(t.get_window_extent(renderer).width < span - 2)


# -- shared pieces ----------------------------------------------------------------------------------------
def _draw_series(ax, series: Series, predicted: Series) -> None:
    colors = {}
    for name in [*series, *(n for n in predicted if n not in series)]:
        colors[name] = SERIES_COLORS[len(colors) % len(SERIES_COLORS)]
    for name, (xs, ys) in series.items():
        ax.plot(list(xs), _floats(ys), "o-", ms=5, lw=1.5, color=colors[name], label=name, gid=f"series:{name}")
    for name, (xs, ys) in predicted.items():
        kind = f"{name}, predicted" if name in series else name
        ax.plot(list(xs), _floats(ys), "--", lw=1.5, color=colors[name], label=kind, gid=f"predicted:{name}")


def _launch_edge(series: Series, floor: float) -> float | None:
    """The largest size at which the first series still runs within 1.5× the launch floor."""
    if not series:
        return None
    xs, ys = next(iter(series.values()))
    edge = None
    for x, y in sorted(zip(xs, _floats(ys), strict=True)):
        if not y <= 1.5 * floor:
            break
        edge = x
    return edge


def _floats(ys) -> list[float]:
    return [math.nan if y is None else float(y) for y in ys]  # a missing point leaves a gap


def _all_non_negative(ax) -> bool:
    ys = [y for line in ax.lines for y in line.get_ydata() if not math.isnan(y)]
    return bool(ys) and min(ys) >= 0


def _draw_marks(ax, marks: Marks | None) -> None:
    items = list(marks.items()) if isinstance(marks, Mapping) else list(marks or [])
    for name, y in items:
        ax.axhline(y, color=MUTED, ls=":", lw=1.2, gid=f"mark:{name}")
        t = ax.text(0.99, y, f"{name}", ha="right", va="bottom", fontsize=NOTE_SIZE, color=MUTED)
        t.set_transform(ax.get_yaxis_transform())  # x in axes fractions, y in data
    if items:
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, *(y for _, y in items)), max(hi, *(y * 1.15 for _, y in items)))


def _byte_ticks(ax, lo: float, hi: float) -> None:
    """Ticks at powers of two, every 1, 2, 5 or 10 of them: 1 KiB, 1 MiB and 1 GiB are always among them."""
    k0, k1 = math.ceil(math.log2(lo)), math.floor(math.log2(hi))
    step = next(s for s in (1, 2, 5, 10, 20) if (k1 - k0) / s <= 7)
    ax.xaxis.set_major_locator(FixedLocator([2.0**k for k in range(k0, k1 + 1) if k % step == 0]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: short_bytes(v)))


def _finish(fig: Figure, ax, x_label: str, y_label: str, title: str, label: str) -> None:
    ax.set_xlabel(x_label, fontsize=LABEL_SIZE, color=INK)
    ax.set_ylabel(y_label, fontsize=LABEL_SIZE, color=INK)
    ax.tick_params(labelsize=NOTE_SIZE)
    ax.grid(True, which="major", color=GRID)
    ax.spines[["top", "right"]].set_visible(False)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=NOTE_SIZE, framealpha=0.9)
    set_title(ax, title)
    footer(fig, label)
    keep_inside(fig)
