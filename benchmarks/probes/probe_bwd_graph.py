"""Which way of timing the residual + RMSNorm backward without its host work works here?

    PYTHONPATH=. python3 benchmarks/probes/probe_bwd_graph.py

For eager, compiled and fused, at lesson 4's backward shapes: capture one ``torch.autograd.grad`` in a
CUDA graph (variants: the gradients made on the capture stream or not), and, as a second clock, the
"host ahead" timing (``fusionlab.bench.queued_ms``: a sleep kernel holds the stream while the host
queues 20 calls, which then run back to back). Prints each variant's ms or its error. A probe for
lesson 4's suite (2026-11-24): on torch 2.11 every capture failed, the queued timing worked.
"""

import torch

from fusionlab.kernels.rmsnorm import rmsnorm, rmsnorm_eager
from fusionlab.lessons.l4 import suite


def capture(forward, inputs, grads, clone_grads: bool, mode: str = "global"):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        if clone_grads:
            grads = tuple(g.clone() for g in grads)
        outputs = forward()
        for _ in range(2):
            torch.autograd.grad(outputs, inputs, grads, retain_graph=True)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode=mode):
            torch.autograd.grad(outputs, inputs, grads, retain_graph=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph.keep = (outputs, grads)
    return graph.replay


def main():
    import sys

    from fusionlab import bench

    schedule, variant = sys.argv[1], sys.argv[2]  # a failed capture can spoil the process: one each
    forward = {"eager": rmsnorm_eager, "compiled": torch.compile(rmsnorm_eager, dynamic=False), "fused": rmsnorm}
    for rows, n in suite.RMS_SHAPES:
        x, r, dy, dh, w = suite.rms_inputs(rows, n)
        xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
        f = forward[schedule]
        with suite._no_donated_buffers():
            outs = f(xg, wg, suite.EPS, rg)
            call = suite._grad_thunk(outs, (xg, wg, rg), (dy, dh))
            call()
            line = f"{rows}x{n} {schedule:<9} call {bench.time_ms(call):.4f} ms | "
            try:
                if variant == "host":  # what the suite uses: calls queued behind a sleep
                    line += f"host-ahead {bench.queued_ms(call):.4f} ms"
                else:
                    mode = "relaxed" if "relaxed" in variant else "global"
                    replay = capture(lambda: f(xg, wg, suite.EPS, rg), (xg, wg, rg), (dy, dh), "clone" in variant, mode)
                    line += f"{variant} {bench.time_ms(replay):.4f} ms"
            except Exception as e:  # noqa: BLE001
                line += f"{variant} failed: {type(e).__name__}: {str(e)[:200]}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
