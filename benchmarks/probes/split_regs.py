"""Registers and spills of the package's split cross-entropy kernel, by dtype and part size (GPU).

PYTHONPATH=. python3 benchmarks/probes/split_regs.py
"""

import torch
import triton

from fusionlab.kernels import cross_entropy as ce

print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for block in (8192, 16384):
        vocab = 128256
        x = torch.randn(64, vocab, device="cuda").to(dtype)
        t = torch.randint(0, vocab, (64,), device="cuda")
        grad = torch.empty_like(x)
        cfg = dict(ce.cross_entropy_config(vocab, dtype))
        cfg.update(SPLIT=triton.cdiv(vocab, block), SPLIT_BLOCK=block, SPLIT_WARPS=4, SPLIT_EARLY=True)
        sync = ce._prologue(t, -100, count=True, n_rows_split=64)
        loss = torch.empty(64, dtype=torch.float32, device="cuda")
        k = ce._launch_split(x, t, grad, loss, sync, -100, 0.0, cfg, True)
        print(f"  {str(dtype)[6:]:8s} part {block:5d} w4: {k.n_regs} registers, {k.n_spills} spills", flush=True)
