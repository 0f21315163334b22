"""One look for every chart: colours, font sizes, and the helpers that turn a figure into a PNG.

Figures are ``matplotlib.figure.Figure`` objects with an Agg canvas, never pyplot: no global figure
list to leak into, no second copy drawn by the notebook's inline backend, and the PNG is the same
whatever backend the notebook chose.
"""

from __future__ import annotations

import html
import io
import textwrap

import ipywidgets as widgets
from IPython import get_ipython
from IPython.display import Image, display
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation, Text

# -- colours: one palette for the SVG animation and every matplotlib chart --------------------------------
READ_COLOR = "#1f77b4"  # HBM -> chip
WRITE_COLOR = "#ff7f0e"  # chip -> HBM
STAY_COLOR = "#2ca02c"  # made on chip, never written to HBM
MEASURED_COLOR = "#4c72b0"
PREDICTED_COLOR = "#c0392b"
INK = "#222222"
MUTED = "#777777"
GRID = "#e3e3e3"
#: series colours of the line charts, in order (colour-blind-safe Tableau order, darker first)
SERIES_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]
#: the roofline's ceilings, highest first: tensor cores dark, vector units green
CEILING_COLORS = [INK, "#2e8b57", "#8172b3", "#937860"]
#: the regimes of a size sweep: launch-bound, L2-resident, HBM-bound
REGION_COLORS = ["#f3e6f5", "#e8f1e4", "#e6edf7"]

# -- sizes ----------------------------------------------------------------------------------------------
DPI = 100
TITLE_SIZE = 11
LABEL_SIZE = 9  # axis labels, bar names, values
NOTE_SIZE = 8  # labels inside the axes, legends
FOOTER_SIZE = 7  # where the numbers come from

#: what the trip pictures say instead of a device: bytes are counted from the ledger, not measured
COUNTED_LABEL = "counted from the ledger, not measured: the same bytes on every device"

# Average glyph width of DejaVu Sans in em, rounded up: how many characters fit a line before wrapping.
_EM_PER_CHAR = 0.62


def esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def byte_unit(nbytes: float) -> tuple[int, str]:
    """The binary unit that keeps ``nbytes`` below 1024 of it (matches ``ledger.human_bytes``)."""
    div = 1
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 * div or unit == "GiB":
            return div, unit
        div *= 1024
    raise AssertionError("unreachable")


def short_bytes(n: float) -> str:
    """``4 MiB``, ``256 KiB``: a tick label for a power-of-two byte axis."""
    div, unit = byte_unit(n)
    v = n / div
    return f"{v:.0f} {unit}" if v == round(v) else f"{v:.3g} {unit}"


def fmt(v: float) -> str:
    """A measured number to three significant digits, with thousands separators past 1000."""
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def new_figure(width: float, height: float, *, constrained: bool = True) -> Figure:
    """A figure with an Agg canvas attached, so text can be measured before it is saved."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained" if constrained else None)
    FigureCanvasAgg(fig)
    return fig


def wrap(text: str, width_in: float, fontsize: float) -> str:
    """``text`` wrapped to lines that fit ``width_in`` inches at ``fontsize`` points."""
    chars = max(20, int(width_in * 72 / (fontsize * _EM_PER_CHAR)))
    return "\n".join(textwrap.wrap(text, chars)) or text


def set_title(ax, text: str, fontsize: float = TITLE_SIZE) -> None:
    """An axes title wrapped to the figure's width: a long device label never runs off the canvas."""
    width = ax.figure.get_figwidth() - 0.4
    ax.set_title("\n".join(wrap(line, width, fontsize) for line in text.split("\n")), fontsize=fontsize, color=INK)


def footer(fig: Figure, text: str) -> None:
    """Where the numbers come from, bottom right; supxlabel takes part in the layout, so no overlap."""
    fig.supxlabel(
        wrap(text, fig.get_figwidth() - 0.3, FOOTER_SIZE), x=0.99, ha="right", fontsize=FOOTER_SIZE, color=MUTED
    )


def keep_inside(fig: Figure, pad_px: float = 3) -> None:
    """Move every text drawn in an axes (labels, annotations) back inside that axes' box.

    Those texts sit in data coordinates, so the layout does not see them; lay the figure out first,
    then shift each one by its overflow. A label then never runs over a spine or off the canvas.
    """
    for ax in fig.axes:
        for t in ax.texts:
            t.set_in_layout(False)  # the layout must not make room for a text we are about to move in
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for t in ax.texts:
            if t.get_visible() and t.get_text():
                _nudge(t, ax.bbox, t.get_window_extent(renderer), pad_px, fig.dpi)


#: where a point's label may go, in order of preference: below right first, away from a roof or slope above
_CORNERS = [
    ((7, -7), "left", "top"),
    ((-7, 7), "right", "bottom"),
    ((7, 7), "left", "bottom"),
    ((-7, -7), "right", "top"),
]


def place_labels(fig: Figure, labels: list[Annotation], pad_px: float = 3) -> None:
    """Give each point label (an annotation in offset points) the first corner around its point where it
    overlaps no other text and stays inside its axes; a label with no free corner keeps the first one,
    moved inside. Call after ``keep_inside``, which lays the figure out."""
    renderer = fig.canvas.get_renderer()
    mine = {id(t) for t in labels}
    taken = [
        t.get_window_extent(renderer) for ax in fig.axes for t in ax.texts if t.get_visible() and id(t) not in mine
    ]
    for t in labels:
        box = t.axes.bbox
        for xy, ha, va in [*_CORNERS, _CORNERS[0]]:  # the last try restores the first corner
            t.xyann = xy
            t.set(ha=ha, va=va)
            ext = t.get_window_extent(renderer)
            inside = box.x0 + pad_px <= ext.x0 and ext.x1 <= box.x1 - pad_px
            inside = inside and box.y0 + pad_px <= ext.y0 and ext.y1 <= box.y1 - pad_px
            if inside and not any(ext.overlaps(o) for o in taken):
                break
        else:
            _nudge(t, box, ext, pad_px, fig.dpi)
        taken.append(t.get_window_extent(renderer))


def _nudge(t: Text, box, ext, pad_px: float, dpi: float) -> None:
    dx = _overflow(ext.x0, ext.x1, box.x0 + pad_px, box.x1 - pad_px)
    dy = _overflow(ext.y0, ext.y1, box.y0 + pad_px, box.y1 - pad_px)
    if dx or dy:
        _shift(t, dx, dy, dpi)


def _overflow(lo: float, hi: float, lo_ok: float, hi_ok: float) -> float:
    if lo < lo_ok:
        return lo_ok - lo
    if hi > hi_ok:
        return max(hi_ok - hi, lo_ok - lo)  # a text wider than the box keeps its start visible
    return 0.0


def _shift(t: Text, dx: float, dy: float, dpi: float) -> None:
    """Move a text by (dx, dy) display pixels, in whichever coordinates it was placed."""
    if isinstance(t, Annotation) and t.anncoords in ("offset points", "offset pixels"):
        k = 72 / dpi if t.anncoords == "offset points" else 1.0
        x, y = t.xyann
        t.xyann = (x + dx * k, y + dy * k)
        return
    tr = t.get_transform()
    x, y = tr.transform(t.get_position())
    t.set_position(tuple(tr.inverted().transform((x + dx, y + dy))))


def png(fig: Figure) -> bytes:
    """Render a figure to PNG bytes with Agg, independent of the notebook's matplotlib backend."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def widget_view(widget: widgets.Widget) -> dict:
    """The widget-view entry of a display bundle, written out by hand: ``Widget._repr_mimebundle_``
    differs between ipywidgets 7 and 8, this dict is what both frontends read."""
    return {
        "application/vnd.jupyter.widget-view+json": {
            "version_major": 2,
            "version_minor": 0,
            "model_id": widget.model_id,
        }
    }


def show(fig: Figure) -> Image | None:
    """Display a figure as a PNG, wherever the call stands in a cell (several in one cell each show).
    Our figures are built without pyplot, so the notebook's inline backend does not draw them by itself.
    Outside IPython (a script), nothing is displayed: the picture is returned instead.

    IPython is imported at module level: ipywidgets depends on it, so it is there wherever viz is.
    """
    img = Image(data=png(fig), format="png")
    if get_ipython() is None:
        return img
    display(img)
    return None
