"""Lesson 4b on a GPU: residual + dropout + norm, and one AdamW step over a model's parameter list.

- Residual + dropout (p = 0.1) + LayerNorm at 32768 × 4096 bf16, forward and backward (the backward
  alone, on a kept graph, on the GPU's clock: ``queued_ms``): eager (dropout writes its mask, an add,
  ``F.layer_norm``), compiled, fused. ``nbytes``: the fused ledger (:func:`dropout_norm_ledger`);
  ``predicted_ms``: the bytes each schedule moves over the copy bandwidth.
- AdamW, one step, fp32, over GPT-2 small's 148 tensors and a Llama-style 1B's 146: a per-tensor loop
  (``foreach=False``, GPT-2 only; case "loop"), ``foreach``, ``fused=True`` (case "torch kernel") and
  fusionlab's one launch (case "ours").
  ``nbytes``: the fused ledger's 7 trips an element (:func:`adamw_ledger`).

Memory: about 45 GB of GPU memory at the largest moment (the 1B list: p, g, m, v in fp32); on a GPU
with less free memory the 1B list is left out, with a line that says so (:func:`adamw_cases`).
"""

from __future__ import annotations

import math

import torch

from ...bench import Case, queued_ms
from ...kernels.adamw import adamw_ledger
from ...kernels.dropout_norm import dropout_norm, dropout_norm_eager, dropout_norm_ledger
from ...optim import AdamW

DTYPE = torch.bfloat16
NORM_SHAPE = (32768, 4096)
P = 0.1
HP = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def gpt2_small_shapes() -> list[tuple[int, ...]]:
    """GPT-2 small's parameters (Radford et al. 2019; Hugging Face ``GPT2LMHeadModel``, tied head)."""
    d, v, t, layers = 768, 50257, 1024, 12
    s: list[tuple[int, ...]] = [(v, d), (t, d)]
    for _ in range(layers):
        s += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return s + [(d,), (d,)]


def llama_1b_shapes() -> list[tuple[int, ...]]:
    """A Llama-3.2-1B-shaped list: hidden 2048, 16 layers, grouped KV (512), MLP 8192, tied 128256 vocabulary."""
    d, kv, f, v, layers = 2048, 512, 8192, 128256, 16
    s: list[tuple[int, ...]] = [(v, d)]
    for _ in range(layers):
        s += [(d, d), (kv, d), (kv, d), (d, d), (f, d), (f, d), (d, f), (d,), (d,)]
    return s + [(d,)]


MODELS = {"gpt2-small": gpt2_small_shapes, "llama-1b": llama_1b_shapes}


def _predict(led, copy_GBps, fused: bool):
    return led.predict_ms(copy_GBps, fused=fused) if copy_GBps else None


def norm_cases(copy_GBps: float | None = None, device="cuda") -> list[Case]:
    rows, n = NORM_SHAPE
    gen = torch.Generator(device=device).manual_seed(0)
    x, r, gy, gh = (torch.randn(rows, n, device=device, dtype=DTYPE, generator=gen) for _ in range(4))
    w, b = (torch.randn(n, device=device, dtype=DTYPE, generator=gen) for _ in range(2))
    ins = [t.requires_grad_() for t in (x, r, w, b)]
    fwd, bwd = dropout_norm_ledger(rows, n, DTYPE), dropout_norm_ledger(rows, n, DTYPE, backward=True)

    def eager(x, r, w, b):
        return dropout_norm_eager(x, r, w, b, P)

    def fused(x, r, w, b):
        return dropout_norm(x, r, w, b, P)

    fns = {"eager": eager, "compiled": torch.compile(eager, dynamic=False), "fused": fused}
    out = []
    for name, fn in fns.items():
        plain = [t.detach() for t in ins]
        with torch.no_grad():
            fn(*plain)  # compile the inference graph
        y, h = fn(*ins)  # and the training graph
        torch.autograd.grad((y, h), ins, (gy, gh), retain_graph=True)
        is_fused = name == "fused"
        out.append(
            Case(f"dropout+ln fwd {name}", lambda fn=fn, plain=plain: _no_grad(fn, plain), fwd.fused_bytes,
                 group="dropout+ln fwd", predicted_ms=_predict(fwd, copy_GBps, is_fused))
        )  # fmt: skip
        out.append(
            Case(f"dropout+ln bwd {name}",
                 lambda y=y, h=h: torch.autograd.grad((y, h), ins, (gy, gh), retain_graph=True),
                 bwd.fused_bytes, group="dropout+ln bwd", predicted_ms=_predict(bwd, copy_GBps, is_fused),
                 timer=lambda f: queued_ms(f, calls=10))
        )  # fmt: skip
    return out


def _no_grad(fn, args):
    with torch.no_grad():
        return fn(*args)


def adamw_bytes(shapes: list[tuple[int, ...]], ways: int) -> int:
    """GPU memory one parameter list's cases hold at once: p and g, and each way's m and v (fp32)."""
    return 4 * (2 + 2 * ways) * sum(math.prod(s) for s in shapes)


def adamw_cases(
    copy_GBps: float | None = None, device="cuda", models=MODELS, free_bytes: int | None = None
) -> list[Case]:
    """AdamW four ways (three at the 1B list). A list whose tensors and moments would not fit the memory
    free on the device (``free_bytes``; default: what CUDA reports, with a tenth kept back) is left out
    with a line that says so, rather than stopping the run out of memory: the 1B list holds about 40 GB."""
    out = []
    for model, shapes in models.items():
        ways = 4 if model == "gpt2-small" else 3
        need = adamw_bytes(shapes(), ways)
        free = free_bytes
        if free is None and torch.device(device).type == "cuda":
            free = int(0.9 * torch.cuda.mem_get_info(torch.device(device))[0])
        if free is not None and need > free:
            print(f"adamw {model}: left out, its {ways} optimizers need {need / 1e9:.1f} GB of GPU memory and "
                  f"{free / 1e9:.1f} GB is free here")  # fmt: skip
            continue
        gen = torch.Generator(device=device).manual_seed(1)
        ps = [torch.nn.Parameter(0.02 * torch.randn(s, device=device, generator=gen)) for s in shapes()]
        for p in ps:
            p.grad = 1e-3 * torch.randn(p.shape, device=device, generator=gen)
        led = adamw_ledger([p.numel() for p in ps])
        # names: "ours" is fusionlab's one launch; "torch kernel" is torch's fused=True (one CUDA kernel a
        # group of tensors), not called "fused" here because the suite's tests read that word as ours
        ways = {
            "ours": AdamW(ps, **HP),
            "torch kernel": torch.optim.AdamW(ps, fused=True, **HP),
            "foreach": torch.optim.AdamW(ps, foreach=True, **HP),
        }
        if model == "gpt2-small":
            ways["loop"] = torch.optim.AdamW(ps, foreach=False, **HP)
        for name, opt in ways.items():
            opt.step()  # state allocated, kernels compiled
            out.append(
                Case(f"adamw {model} {name}", opt.step, led.fused_bytes, group=f"adamw {model}",
                     predicted_ms=_predict(led, copy_GBps, fused=name != "loop"))
            )  # fmt: skip
    return out


def cases(copy_GBps: float | None = None, device="cuda") -> list[Case]:
    """All lesson 4b cases (each carries ``predicted_ms`` given the measured copy bandwidth)."""
    return [*norm_cases(copy_GBps, device), *adamw_cases(copy_GBps, device)]


def bars(results) -> list[tuple[str, bool, str]]:
    """The issue's bars at this suite's sizes, read off a run: ``(bar, met, detail)``."""
    r = {x.name: x for x in results}
    out = []
    for d in ("fwd", "bwd"):
        f, c = r[f"dropout+ln {d} fused"], r[f"dropout+ln {d} compiled"]
        out.append((f"dropout+ln {d} >= 90% of copy", f.frac_copy >= 0.90, f"{f.frac_copy:.1%}"))
        out.append((f"dropout+ln {d} >= 1.0x compiled", c.ms >= f.ms, f"{c.ms / f.ms:.2f}x"))
    for model in MODELS:
        ours = r.get(f"adamw {model} ours")
        if ours is None:
            continue
        for other, label, want in (("torch kernel", "fused=True", 1.0), ("foreach", "foreach", 1.5)):
            o = r[f"adamw {model} {other}"]
            out.append((f"adamw {model} >= {want}x {label}", o.ms >= want * ours.ms, f"{o.ms / ours.ms:.2f}x"))
    big = r.get("adamw llama-1b ours")
    if big is not None:
        out.append(("adamw llama-1b >= 85% of copy", big.frac_copy >= 0.85, f"{big.frac_copy:.1%}"))
    return out
