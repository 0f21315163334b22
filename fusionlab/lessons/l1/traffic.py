"""Lesson 1's evidence from the profiler: where each kernel's bytes went, HBM or only the L2.

A timing says how long a kernel took, not where its bytes came from. The trips suite
(``benchmarks/record_trips.py``, its ``regimes`` and ``large`` parts) runs eager ``x.cos().cos()``, the
fused ``cos_cos`` and one eager cos under Nsight Compute, from 4 MiB (inside the L2) to 1 GiB, each
twice in a row, and records per kernel the bytes read from and written to HBM and the bytes through the
L2 (:mod:`fusionlab.measure.recorded`). This module reads that recording; it measures nothing.
"""

from __future__ import annotations

from ... import benchcli
from ...ledger import human_bytes
from ...measure import recorded as _recorded

PART = "regimes"
SCRIPT = _recorded.SCRIPT
CASES = ("eager cos().cos()", "fused cos_cos", "eager cos")


class Traffic(_recorded.Part):
    """The recorded regimes: each case at each size, its first call (after a kernel that filled the L2
    with other data) and the call right after it (``"again"``: what every repetition of a timing loop
    meets), caches flushed by ncu (:data:`FLUSHED`) or not (:data:`WARM`)."""

    def sizes(self) -> list[int]:
        return sorted({c["tensor_bytes"] for c in self.cases.values() if "tensor_bytes" in c})

    def inside_l2(self) -> list[int]:
        """The sizes at which eager's input and intermediate fit the L2 together (its L2 band)."""
        return [b for b in self.sizes() if 2 * b <= self.meta["L2_bytes"]]

    def name_of(self, case: str, nbytes: int, call: str = "again") -> str:
        for name, c in self.cases.items():
            if c.get("group") == case and c.get("tensor_bytes") == nbytes and c.get("call") == call:
                return name
        raise KeyError(f"no recorded {case!r} at {nbytes} bytes ({call})")

    def intermediate_from_hbm(self, nbytes: int, mode: str = _recorded.WARM) -> float:
        """The share of eager's intermediate ``t1`` that its second kernel read from HBM, on the call a
        timing loop repeats (1.0: all of it; near 0: the L2 served it)."""
        second = self._need(self.name_of("eager cos().cos()", nbytes), mode)["kernels"][1]
        return second["dram_read"] / nbytes

    def hbm_over_ledger(self, case: str, nbytes: int, mode: str = _recorded.WARM, call: str = "again") -> float:
        """HBM bytes (read + written, all the case's kernels) over the ledger's count of its schedule:
        one read and one write of the tensor for the fused kernel and one cos, two of each for eager."""
        return self.over_schedule(self.name_of(case, nbytes, call), mode)

    def kernel_rows(self, sizes, mode: str = _recorded.WARM) -> list[tuple[str, int, float]]:
        """``(kernel, ledger bytes, HBM bytes)`` of eager's two kernels and the fused one at each size, on
        the repeated call: what :func:`fusionlab.viz.measured_figure` draws per kernel. Each of these
        kernels reads one tensor and writes one, so its ledger is twice the tensor's bytes."""
        out = []
        for nbytes in sizes:
            for case in ("eager cos().cos()", "fused cos_cos"):
                kernels = self._need(self.name_of(case, nbytes), mode)["kernels"]
                for i, k in enumerate(kernels):
                    which = f"eager kernel {i + 1}" if len(kernels) > 1 else "fused"
                    out.append((f"{which}, {human_bytes(nbytes)}", 2 * nbytes, k["dram_read"] + k["dram_write"]))
        return out

    def l2_over_ledger(self, case: str, nbytes: int, mode: str = _recorded.WARM, call: str = "again") -> float:
        return self.l2_over_schedule(self.name_of(case, nbytes, call), mode)


def here_or_recorded(device: str | None = None) -> Traffic | None:
    """Counted here under ncu where it can read this GPU's counters (about two minutes: flushed and not),
    else :func:`recorded`."""
    part = benchcli.counters_here_or_recorded(PART, device, controls=_recorded.CACHE_CONTROLS)
    return None if part is None else Traffic(**vars(part))


def recorded(device: str | None = None, directory=None) -> Traffic | None:
    """The newest recording of the regimes on a device whose name contains ``device`` (any if None), or
    None while there is none."""
    part = _recorded.newest(PART, device, directory)
    return None if part is None else Traffic(**vars(part))
