"""The course's pictures: the memory-trip animation, live timing bars, the roofline, sweep charts.

Core ipywidgets only, no JavaScript of our own, so the same code runs on Colab (ipywidgets 7.7) and on
ipywidgets 8. Each chart has one renderer: matplotlib (Agg, no pyplot) for the charts, shown as a PNG;
SVG for the animation, which changes frame by frame. Every displayed object's bundle carries the live
widget plus that same picture (``image/png`` or ``text/html``) and a short, deterministic
``text/plain``, so a notebook saved without widget state still shows a picture on GitHub and nbviewer.

    fl.viz.TripAnimation(ledger, title=...)            # step through the HBM trips, unfused beside fused
    bars = fl.viz.TimingBars(title, label=...); bars.show(); bench.run(cases, on_result=bars.add_result)
    fl.viz.show(fl.viz.roofline_figure(copy_GBps, [(name, TFLOP/s), ...], points, device_label))
    fl.viz.show(fl.viz.line_chart({name: (xs, ys)}, x_label, y_label, title, label))
    fl.viz.Table(rows, header=(...))                    # a printed table: HTML in a notebook, text elsewhere
"""

from ._style import COUNTED_LABEL, show
from .bars import TimingBars
from .lines import line_chart, regimes_chart
from .roofline import roofline_figure
from .tables import Table
from .trips import TripAnimation, measured_figure, trips_figure

__all__ = [
    "COUNTED_LABEL",
    "Table",
    "TimingBars",
    "TripAnimation",
    "line_chart",
    "regimes_chart",
    "roofline_figure",
    "show",
    "trips_figure",
    "measured_figure",
]
