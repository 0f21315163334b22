"""The roofline with one roof per compute unit.

Element-wise ops never run on tensor cores: their ceiling is the vector FP32 units, whose ridge sits
10-20× lower than the tensor cores' bf16 ridge. So the chart takes a list of measured ceilings and
draws each as its own roof over the one memory slope, each point under the roof of the unit it runs on.
"""

from __future__ import annotations

import math
import numbers

from matplotlib.figure import Figure

from ..ledger import machine_balance, roofline_tflops
from ._style import (
    CEILING_COLORS,
    GRID,
    INK,
    LABEL_SIZE,
    MUTED,
    NOTE_SIZE,
    keep_inside,
    new_figure,
    place_labels,
    set_title,
)


def roofline_figure(bandwidth_GBps, ceilings, points=(), device_label: str = "", numbered: bool = False) -> Figure:
    """Log-log roofline: the memory slope, one roof per ceiling with its ridge, and the given points.

    ``ceilings`` are ``(name, TFLOP/s)`` pairs, e.g. ``[("tensor cores, bf16 matmul", 700),
    ("vector units, fp32 FMA", 60)]``. ``points`` are ``(name, intensity in FLOP/byte, achieved TFLOP/s
    or None, ceiling name or None)``; a point sits under the roof it names (the highest when None), and a
    point without a measurement is drawn hollow on that roof: the best the device could do there.

    ``numbered``: each point labelled by its number, the names in a key under the chart — for many
    points close together (a whole suite), whose names cannot all sit beside them without overlapping.

    The older form ``roofline_figure(peak_tflops, bandwidth_GBps, points, device_label)``, one roof and
    three-element points, still works.
    """
    if isinstance(ceilings, numbers.Real):  # the old signature: (peak_tflops, bandwidth_GBps, ...)
        bandwidth_GBps, ceilings = ceilings, [("compute roof", bandwidth_GBps)]
    roofs = sorted(((str(n), float(t)) for n, t in ceilings), key=lambda c: -c[1])
    if not roofs:
        raise ValueError("give at least one ceiling: [(name, TFLOP/s), ...]")
    for name, tflops in roofs:
        if not tflops > 0:  # e.g. Ceilings.vector_TFLOPs is 0.0 in a recording made before it was measured
            raise ValueError(f"ceiling {name!r} is {tflops} TFLOP/s: give only measured ceilings (> 0)")
    color = {name: CEILING_COLORS[i % len(CEILING_COLORS)] for i, (name, _) in enumerate(roofs)}
    peak = dict(roofs)
    pts = [_point(p, roofs[0][0], peak, bandwidth_GBps) for p in points]
    ridges = {name: machine_balance(t, bandwidth_GBps) for name, t in roofs}

    xs = [*ridges.values(), *(p[1] for p in pts)]
    lo, hi = min(xs) / 8, max(xs) * 8
    top = roofs[0][1]
    ys = [roofline_tflops(lo, top, bandwidth_GBps)] + [p[2] if p[2] is not None else p[4] for p in pts]
    bottom = min(ys) / 10

    names = [p[0] for p in pts]
    if numbered and pts:
        key_rows = (len(pts) + 1) // 2
        fig = new_figure(7.5, 5.0 + 0.2 * key_rows + 0.2)
        ax, key = fig.subplots(2, 1, gridspec_kw={"height_ratios": [5.0, 0.2 * key_rows + 0.2]})
        _draw_key(key, names, key_rows)
        pts = [(label, *p[1:]) for label, p in zip(_numbers(pts), pts, strict=True)]
    else:
        fig = new_figure(7.5, 5.0)
        ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(bottom, top * 5)
    # the memory slope, up to the highest ridge; each roof from its own ridge on
    ax.plot([lo, ridges[roofs[0][0]]], [bandwidth_GBps * lo / 1e3, top], color=INK, lw=2, gid="slope")
    ax.text(
        lo * 1.5,
        bandwidth_GBps * lo * 1.5 / 1e3 / 3,
        f"memory: {bandwidth_GBps:.4g} GB/s",
        va="top",
        fontsize=NOTE_SIZE,
        color=INK,
    )
    for name, tflops in roofs:
        r, c = ridges[name], color[name]
        ax.plot([r, hi], [tflops, tflops], color=c, lw=2, gid=f"roof:{name}")
        ax.plot([r], [tflops], "o", color=c, ms=6, gid=f"ridge:{name}")
        ax.plot([r, r], [bottom, tflops], color=c, ls=":", lw=1)
        ax.text(
            hi / 1.4,
            tflops * 1.15,
            f"{name}: {tflops:.3g} TFLOP/s",
            ha="right",
            va="bottom",
            fontsize=NOTE_SIZE,
            color=c,
        )
        ax.text(
            r * 1.1,
            bottom * 1.4,
            f"ridge: {r:.3g} FLOP/byte",
            rotation=90,
            va="bottom",
            ha="left",
            fontsize=NOTE_SIZE,
            color=c,
            gid=f"ridge-label:{name}",
        )
    labels = _plot_points(ax, pts, color)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)", fontsize=LABEL_SIZE)
    ax.set_ylabel("attainable TFLOP/s", fontsize=LABEL_SIZE)
    ax.tick_params(labelsize=NOTE_SIZE)
    ax.grid(True, which="major", color=GRID)
    ax.spines[["top", "right"]].set_visible(False)
    set_title(ax, f"Roofline — {device_label}" if device_label else "Roofline", fontsize=10)
    if pts:
        ax.legend(loc="upper left", fontsize=NOTE_SIZE, framealpha=0.9)
    keep_inside(fig)
    place_labels(fig, labels)
    return fig


#: points closer than this (decades, on both axes) share one label: "2, 11"
_SAME_SPOT = 0.06


def _numbers(pts: list) -> list[str]:
    """Each point's number as its label; points drawn on the same spot share the first one's label
    ("2, 11") and the others get none, so no two numbers sit on top of each other."""
    labels: list[list[str]] = []
    spots: list[tuple[float, float]] = []
    owner: list[int] = []
    for i, p in enumerate(pts):
        y = p[4] if p[2] is None else p[2]
        spot = (math.log10(p[1]), math.log10(y))
        close = [j for j, s in enumerate(spots) if max(abs(s[0] - spot[0]), abs(s[1] - spot[1])) < _SAME_SPOT]
        near = close[0] if close else None
        if near is None:
            spots.append(spot)
            labels.append([str(i + 1)])
            owner.append(i)
        else:
            labels[near].append(str(i + 1))
    out = [""] * len(pts)
    for i, shared in zip(owner, labels, strict=True):
        out[i] = ", ".join(shared)
    return out


def _draw_key(ax, names: list[str], rows: int) -> None:
    """The names of numbered points, two columns, in an axes of their own under the chart."""
    ax.axis("off")
    for i, name in enumerate(names):
        col, row = divmod(i, rows)
        ax.text(0.5 * col, 1 - (row + 0.5) / rows, f"{i + 1:>2}  {name}", transform=ax.transAxes,
                fontsize=NOTE_SIZE, color=INK, va="center", ha="left", gid=f"key:{i + 1}")  # fmt: skip


def _point(p, default: str, peak: dict[str, float], bandwidth_GBps: float) -> tuple:
    """(name, intensity, achieved, ceiling, height of its roof there), checked."""
    name, intensity, achieved, *rest = p
    ceiling = rest[0] if rest and rest[0] is not None else default
    if ceiling not in peak:
        raise ValueError(f"{name}: no ceiling called {ceiling!r}; the ceilings are {', '.join(peak)}")
    if not intensity > 0:
        raise ValueError(f"{name}: arithmetic intensity must be > 0 FLOP/byte for a log axis, got {intensity}")
    return name, intensity, achieved, ceiling, roofline_tflops(intensity, peak[ceiling], bandwidth_GBps)


def _plot_points(ax, pts: list, color: dict[str, str]) -> list:
    """Measured points filled, predicted ones hollow on their roof, in the colour of that roof; returns
    the labels, for ``place_labels`` to move clear of each other once the figure is laid out."""
    seen, labels = set(), []
    for name, intensity, achieved, ceiling, on_roof in pts:
        y = on_roof if achieved is None else achieved
        kind = "predicted (on its roof)" if achieved is None else "measured"
        c = color[ceiling]
        ax.plot(
            [intensity],
            [y],
            "o",
            ms=8,
            gid=f"point:{name}",
            color=c,
            mfc="white" if achieved is None else c,
            mew=2,
            zorder=3,
        )
        if kind not in seen:  # the legend shows the two kinds in grey, whichever roof they are under
            ax.plot([], [], "o", ms=8, mew=2, color=MUTED, mfc="white" if achieved is None else MUTED, label=kind)
            seen.add(kind)
        if achieved is not None and achieved < on_roof:  # the gap to the roof is what is left to win
            ax.plot([intensity, intensity], [achieved, on_roof], color=c, ls=":", lw=1)
        if not name:  # a numbered point on the same spot as another, named in that one's label
            continue
        label = ax.annotate(name, (intensity, y), xytext=(7, -7), textcoords="offset points", ha="left", va="top")
        label.set(fontsize=NOTE_SIZE, color=INK, annotation_clip=False)
        labels.append(label)
    return labels
