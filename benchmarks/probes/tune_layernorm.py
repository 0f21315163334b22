"""LayerNorm's forward at the hidden sizes where it fell short (notes_norms.md, 2026-11-24): launch
configurations side by side, bf16, weights and bias bf16.

    PYTHONPATH=. python3 benchmarks/probes/tune_layernorm.py

Shapes: rows 4096 and 32768 x hidden 4096 (a reference that runs near copy), 5120, 11008, 16384.
Per shape: the package default, then the same tile with 16 warps, and the two-pass path (tiles of 4096
and 8192: x read twice, the second time mostly from L2). Each checked against F.layer_norm, then timed
with do_bench (median, L2 flushed); % of copy by the ledger of what that configuration moves.
"""

import torch
import torch.nn.functional as F

from fusionlab import bench
from fusionlab.kernels import layernorm as ln

DT = torch.bfloat16


def main():
    copy = bench.measure_copy_bandwidth()
    print(f"copy {copy:.0f} GB/s", flush=True)
    for rows in (4096, 32768):
        for n in (4096, 5120, 11008, 16384):
            g = torch.Generator(device="cuda").manual_seed(n)
            x = torch.randn(rows, n, device="cuda", generator=g).to(DT)
            w, b = (torch.randn(n, device="cuda", generator=g).to(DT) for _ in range(2))
            ref = F.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5)
            d = ln.layernorm_config(rows, n, DT)
            variants = {"default": None, "16 warps": {"num_warps": 16}}
            for bn in (4096, 8192):
                if bn < n:
                    variants[f"two-pass {bn}"] = {"BLOCK_N": bn, "BLOCK_M": 1, "num_warps": bn // 512}
            for name, cfg in variants.items():
                with torch.no_grad():
                    y = ln.layernorm(x, w, b, fwd_config=cfg)
                    err = (y.float() - ref).abs().max().item()
                    ms = bench.time_ms(lambda cfg=cfg, x=x, w=w, b=b: ln.layernorm(x, w, b, fwd_config=cfg))
                block = (cfg or {}).get("BLOCK_N", d["BLOCK_N"])
                nbytes = ln.layernorm_ledger(rows, n, DT, block=block).fused_bytes
                two = 2 * rows * n * 2
                print(
                    f"{rows:>6}x{n:<6} {name:<15} {ms:7.4f} ms {nbytes / ms / 1e6 / copy:6.1%} of copy "
                    f"(by 2 trips {two / ms / 1e6 / copy:6.1%})  max err {err:.3f}",
                    flush=True,
                )
            # the backward (dx, dw, db), the GPU's time alone (calls queued ahead: bench.queued_ms)
            xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
            dy = torch.randn(rows, n, device="cuda", generator=g).to(DT)
            d_b = ln.layernorm_config(rows, n, DT, backward=True)
            bvars = {"default": None, "16 warps": {"num_warps": 16}, "8 warps": {"num_warps": 8}}
            if n > 4096:
                bvars["two-pass 4096"] = {"BLOCK_N": 4096, "BLOCK_M": 1, "num_warps": 8}
            for name, cfg in bvars.items():
                try:
                    y = ln.layernorm(xg, wg, bg, bwd_config=cfg)
                    ms = bench.queued_ms(lambda y=y: torch.autograd.grad(y, (xg, wg, bg), dy, retain_graph=True))
                except Exception as e:  # noqa: BLE001  a configuration that does not compile is a result
                    print(f"{rows:>6}x{n:<6} bwd {name}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                    continue
                full = {**d_b, **(cfg or {})}
                single = full["BLOCK_N"] >= n
                programs = d_b["programs"]
                nbytes = ln.layernorm_ledger(
                    rows, n, DT, backward=True, programs=programs, block=None if single else full["BLOCK_N"]
                ).fused_bytes
                share = nbytes / ms / 1e6 / copy
                print(f"{rows:>6}x{n:<6} bwd {name:<15} {ms:7.4f} ms {share:6.1%} of copy", flush=True)
            torch.cuda.empty_cache()


def rms_backward():
    """Residual + RMSNorm's backward at the same widths: the default against the two-pass path."""
    from fusionlab.kernels import rmsnorm as rn
    from fusionlab.kernels._launch import sm_count
    from fusionlab.lessons.l4.suite import rms_inputs

    copy = bench.measure_copy_bandwidth()
    sms = sm_count()
    for rows in (4096, 32768):
        for n in (5120, 11008, 16384):
            x, r, dy, dh, w = rms_inputs(rows, n)
            xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
            base = rn.rmsnorm_config(rows, n, DT, backward=True)
            variants = {"default": None}
            for bn, nw in ((4096, 8), (8192, 16)):
                for per_sm in (1, 2):
                    variants[f"two-pass {bn} p{per_sm}"] = {"BLOCK_N": bn, "num_warps": nw, "programs": sms * per_sm}
            for name, cfg in variants.items():
                y, h = rn.rmsnorm(xg, wg, 1e-6, rg, bwd_config=cfg)
                ms = bench.queued_ms(
                    lambda y=y, h=h: torch.autograd.grad((y, h), (xg, wg, rg), (dy, dh), retain_graph=True)
                )
                full = {**base, **(cfg or {})}
                led = rn.rmsnorm_ledger(rows, n, DT, backward=True, grad_h=True, programs=min(full["programs"], rows))
                share = led.fused_bytes / ms / 1e6 / copy
                print(
                    f"rms {rows:>6}x{n:<6} bwd {name:<18} {ms:7.4f} ms {share:6.1%} of copy (one-tile ledger)",
                    flush=True,
                )


if __name__ == "__main__":
    import sys

    if "rms" in sys.argv[1:]:
        rms_backward()
        sys.exit()
    main()
