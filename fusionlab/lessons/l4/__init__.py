"""Lesson 4: its benchmark suite (``suite``) and exercise checkers (``checkers``)."""

from __future__ import annotations

from ... import bench
from ...ledger import human_bytes
from ...measure import recorded
from . import suite

SUITE = "lesson4"


def measure(on_result=None, **case_kwargs) -> bench.SuiteRun:
    """This lesson's timings: measured here on a GPU, the recorded run elsewhere (``KeyError`` while no
    recording holds this lesson's suite yet)."""
    return bench.measure_suite(SUITE, suite.cases, on_result=on_result, **case_kwargs)


# -- the counters: bytes that reached HBM against the L2's (the trips suite: fusionlab.measure.recorded) --------
def describe_counters(part: recorded.Part) -> str:
    """A part's cases as a table: the schedule's ledger, the bytes HBM read and wrote, their ratio to the
    ledger, the bytes through L2 over the ledger, the kernels and their time under the profiler."""
    lines = [
        f"{'case':<30} {'ledger':>10} {'HBM read':>10} {'written':>10} {'HBM/ledger':>10} {'L2/ledger':>9} "
        f"{'kernels':>7} {'µs':>7}"
    ]
    for name in part.names():
        c, k = part.case(name), part.counted(name)
        lines.append(
            f"{name:<30} {human_bytes(c['schedule_bytes']):>10} {human_bytes(k['dram_read']):>10} "
            f"{human_bytes(k['dram_write']):>10} {part.over_schedule(name):9.2f}x {part.l2_over_schedule(name):8.2f}x "
            f"{len(k['kernels']):>7} {k['time_ns'] / 1e3:7.1f}"
        )
    return "\n".join(lines) + "\n(caches flushed before each kernel) " + part.label


#: HBM bytes within this share of the ledger count as the ledger's trips (the writes may fall short by
#: what L2 still holds when the kernel ends, the reads exceed by a few KiB of its arguments)
SAME_TRIPS = 0.05


def eager_softmax_verdict(part: recorded.Part, rows: int, n: int) -> str:
    """What the counters say of ``torch.softmax``'s excess over its prediction at ``rows x n``: more HBM
    trips than the ledger's, or the ledger's trips taking longer."""
    shape = suite.shape_name(rows, n)
    eager, fused = f"torch.softmax {shape}", f"softmax fused {shape}"
    r, l2 = part.over_schedule(eager), part.l2_over_schedule(eager)
    te, tf = (part.counted(x)["time_ns"] for x in (eager, fused))
    head = (
        f"Counted ({part.meta['device']}, {part.meta['date']}): `torch.softmax` at {rows} × {n} moved "
        f"{r:.2f}× the ledger's bytes to and from HBM and {l2:.2f}× through L2; the package's kernel "
        f"{part.over_schedule(fused):.2f}× and {part.l2_over_schedule(fused):.2f}×. "
    )
    if abs(r - 1) <= SAME_TRIPS:
        return head + (
            f"So eager makes the ledger's trips: its excess is time, not bytes — under the profiler its kernel "
            f"took {te / tf:.2f}× the fused kernel's for the same trips."
        )
    return head + f"So part of eager's excess is trips the ledger does not count: {r:.2f}× its HBM bytes."


def cliff_table(part: recorded.Part, l2_bytes: int, sms: int) -> str:
    """Lesson 4's re-read cliff from the counters, as markdown: per row width, the rows in flight against
    the L2, and how many times each schedule read ``x`` from HBM (one program a row reads each row twice,
    the split schedule once) and through the L2."""
    lines = [
        "| width | in flight (at least) | fits L2 | one program a row: x from HBM | through L2 | split: x from HBM |",
        "|---:|---:|:---:|---:|---:|---:|",
    ]
    for name in part.names("softmax"):
        c = part.case(name)
        if not name.startswith("softmax one program a row"):
            continue
        n, x_bytes = c["n"], c["rows"] * c["row_bytes"]
        split = f"softmax split rows n={n}"
        read = part.counted(name)["dram_read"] / x_bytes
        through = part.counted(name)["l2_bytes"] / x_bytes
        s = part.counted(split) if split in part.cases else None
        split_read = f"{s['dram_read'] / x_bytes:.2f}×" if s else "—"
        flight = sms * c["row_bytes"]
        lines.append(
            f"| {n} | {human_bytes(flight)} | {'yes' if flight <= l2_bytes else 'no'} | {read:.2f}× | "
            f"{through:.2f}× | {split_read} |"
        )
    return "\n".join(lines)
