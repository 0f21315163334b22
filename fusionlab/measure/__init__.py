"""Measured trips: the bytes a kernel actually moves, beside the ledger's prediction.

- :mod:`.interpreter`: the logical trips of a Triton kernel, every ``tl.load`` and ``tl.store`` counted
  in Triton's interpreter (a laptop, no GPU);
- :mod:`.torch_ops`: the bytes each aten op of torch code reads and writes (any device);
- :mod:`.ncu`: DRAM and L2 bytes and time per kernel from Nsight Compute's counters (a GPU with ``ncu``);
- :mod:`.own`: a learner's own kernel, written in a notebook, run under ``ncu`` in a process of its own;
- :mod:`.recorded`: those counters as recorded on a GPU by ``benchmarks/record_trips.py``, read anywhere;
- :mod:`.exercises`: the checkers that hold a learner's ledger against their own kernel's counted trips
  (the interpreter's count on a CPU, the GPU's counters where ncu can read them).
"""
