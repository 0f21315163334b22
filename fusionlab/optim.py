"""``fusionlab.optim.AdamW``: a ``torch.optim.Optimizer`` whose step is one Triton launch a param group.

Drop it in where ``torch.optim.AdamW`` was::

    opt = fusionlab.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ...
    loss.backward(); opt.step(); opt.zero_grad()

Same hyper-parameters and defaults as torch's AdamW (lr, betas, eps, weight_decay decoupled, bias
correction, maximize, capturable; no amsgrad), same state (``step``, ``exp_avg``, ``exp_avg_sq``) and the
same state dict: one saved by either loads into the other. The update is
:func:`fusionlab.kernels.adamw.multi_tensor_adamw`: one launch for all tensors of a param group (of one
dtype). ``master_weights=True`` (fp16/bf16 params) keeps an fp32 copy of each param in its state
(``master``) and updates that. ``capturable=True`` keeps the step count on the device (one float32 a
param, as torch's ``capturable``), so ``step()`` can be recorded in a CUDA graph.
"""

from __future__ import annotations

import math

import torch

from .kernels import KernelInputError
from .kernels.adamw import make_plan, multi_tensor_adamw, run_plan


class AdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        maximize: bool = False,
        capturable: bool = False,
        master_weights: bool = False,
    ):
        if isinstance(lr, torch.Tensor) or not 0.0 <= lr:
            raise KernelInputError(f"AdamW: lr={lr!r} must be a number >= 0.")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise KernelInputError(f"AdamW: betas={betas!r} must be in [0, 1).")
        if not 0.0 <= eps or not 0.0 <= weight_decay:
            raise KernelInputError("AdamW: eps and weight_decay must be >= 0.")
        # the keys torch's AdamW keeps in a param group, so that state dicts load both ways
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=False, maximize=maximize,
            foreach=None, capturable=capturable, differentiable=False, fused=None,
            decoupled_weight_decay=True, master_weights=master_weights,
        )  # fmt: skip
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:  # a state dict saved by torch's AdamW lacks this key
            group.setdefault("master_weights", False)
            if group.get("amsgrad"):
                raise KernelInputError("AdamW: amsgrad is not supported.")
            if not group.setdefault("decoupled_weight_decay", True):
                raise KernelInputError(
                    "AdamW: a state dict of Adam with L2 weight decay (decoupled_weight_decay=False)."
                )

    def _state(self, p: torch.Tensor, group: dict) -> dict:
        state = self.state[p]
        if len(state) == 0 or "exp_avg" not in state:
            step_device = p.device if group["capturable"] else "cpu"
            state["step"] = torch.zeros((), dtype=torch.float32, device=step_device)
            state["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            state["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        if group["master_weights"] and p.dtype != torch.float32 and "master" not in state:
            state["master"] = p.detach().float()
        if state["exp_avg"].dtype != torch.float32:  # a torch state dict of a bf16 param keeps bf16 moments
            state["exp_avg"] = state["exp_avg"].float()
            state["exp_avg_sq"] = state["exp_avg_sq"].float()
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            grads = [p.grad for p in group["params"]]
            fast = group.get("_fast")
            if fast is not None and fast.run(grads, group):
                continue
            if fast is not None:  # off the fast path: its host count back into each param's state first
                self._flush_group(group)
            group["_fast"] = None
            by_dtype: dict = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise KernelInputError("AdamW: sparse gradients are not supported.")
                if not p.is_contiguous():
                    raise KernelInputError("AdamW: parameters must be contiguous (the kernel walks memory in order).")
                by_dtype.setdefault(p.dtype, []).append(p)
            for dtype, ps in by_dtype.items():
                self._step_group(group, ps, dtype)
            if len(by_dtype) == 1 and all(g is not None for g in grads):
                group["_fast"] = _Fast.make(self, group)
        return loss

    def _step_group(self, group: dict, ps: list, dtype: torch.dtype) -> None:
        states = [self._state(p, group) for p in ps]
        master = group["master_weights"] and dtype != torch.float32
        grads = []
        for p in ps:
            g = p.grad
            if g.is_neg() or g.is_conj() or not g.is_contiguous() or g.dtype != dtype:
                g = g.resolve_neg().resolve_conj().contiguous().to(dtype)
            grads.append(g)
        beta1, beta2 = group["betas"]
        kw = dict(
            lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=group["eps"],
            weight_decay=group["weight_decay"], maximize=group["maximize"],
            masters=[s["master"] for s in states] if master else None,
        )  # fmt: skip
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        if group["capturable"]:
            steps = self._device_steps(group, ps, states)
            multi_tensor_adamw(ps, grads, exp_avgs, exp_avg_sqs, step=steps, ticket=group["_ticket"], **kw)
            return
        counts = {}
        for i, s in enumerate(states):
            if s["step"].is_cuda:  # loaded from a capturable state dict: back to the host (one sync)
                s["step"] = s["step"].cpu()
            s["step"] += 1
            counts.setdefault(int(s["step"].item()), []).append(i)
        for t, idx in counts.items():  # one launch unless the tensors' counts differ (a loaded state)
            pick = [ps[i] for i in idx]
            pick_kw = dict(kw, masters=[kw["masters"][i] for i in idx] if master else None)
            multi_tensor_adamw(pick, [grads[i] for i in idx], [exp_avgs[i] for i in idx],
                               [exp_avg_sqs[i] for i in idx], step=t, **pick_kw)  # fmt: skip

    def _device_steps(self, group, ps, states) -> torch.Tensor:
        """Each param's step as a view into one float32 device buffer the kernel reads and advances
        (made once; rebuilt when the set of params changes)."""
        key = tuple(id(p) for p in ps)
        if group.get("_steps_key") != key or any(
            s["step"].data_ptr() != group["_steps"][i : i + 1].data_ptr() for i, s in enumerate(states)
        ):
            buf = torch.stack([s["step"].to(ps[0].device, torch.float32).reshape(()) for s in states])
            for i, s in enumerate(states):
                s["step"] = buf[i]
            group["_steps"], group["_steps_key"] = buf, key
            group["_ticket"] = torch.tensor([0, len(ps)], dtype=torch.int32, device=ps[0].device)
        return group["_steps"]

    def _flush_group(self, group):
        """Write the fast path's host count into each param's ``step`` (it skips the per-tensor update)."""
        fast = group.get("_fast")
        if fast is not None and fast.count is not None:
            for p in fast.params:
                self.state[p]["step"] = torch.tensor(float(fast.count), dtype=torch.float32)

    def _flush_steps(self):
        for group in self.param_groups:
            self._flush_group(group)

    def state_dict(self):
        self._flush_steps()
        sd = super().state_dict()
        for g in sd["param_groups"]:
            for k in ("_steps", "_steps_key", "_ticket", "_fast"):
                g.pop(k, None)
        return sd

    def load_state_dict(self, state_dict):
        for group in self.param_groups:
            group["_fast"] = None
        super().load_state_dict(state_dict)


class _Fast:
    """A param group's step once it has run the checked path: every param has a contiguous gradient of
    its dtype, and (not capturable) one shared step count, kept here on the host. A step then costs
    the host a list of the gradients' addresses (the table is cached by them) and one launch."""

    def __init__(self, params, m, v, masters, count, steps, ticket):
        self.params, self.m, self.v, self.masters = params, m, v, masters
        self.count, self.steps, self.ticket = count, steps, ticket
        self.plans: dict = {}

    @staticmethod
    def make(opt, group):
        ps = group["params"]
        states = [opt.state[p] for p in ps]
        if any(g.dtype != p.dtype or not g.is_contiguous() or g.is_neg() for p, g in ((p, p.grad) for p in ps)):
            return None
        if any(p.numel() == 0 for p in ps):
            return None
        master = group["master_weights"] and ps[0].dtype != torch.float32
        if group["capturable"]:
            count, steps, ticket = None, group["_steps"], group["_ticket"]
        else:
            counts = {float(s["step"]) for s in states}
            if len(counts) != 1:
                return None
            count, steps, ticket = int(counts.pop()), None, None
        return _Fast(
            ps, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
            [s["master"] for s in states] if master else None, count, steps, ticket,
        )  # fmt: skip

    def run(self, grads, group) -> bool:
        """One step, or False (nothing done) when the group no longer fits the fast path."""
        if group["params"] is not self.params and list(group["params"]) != self.params:
            return False
        try:
            key = tuple(g.data_ptr() for g in grads)
        except AttributeError:  # a param without a gradient this step
            return False
        plan = self.plans.get(key)
        if plan is None:
            if any(
                g.dtype != p.dtype or not g.is_contiguous() or g.is_neg()
                for p, g in zip(self.params, grads, strict=True)
            ):
                return False
            if len(self.plans) > 8:
                self.plans.clear()
            plan = self.plans[key] = make_plan(self.params, grads, self.m, self.v, self.masters)
        beta1, beta2 = group["betas"]
        lr = float(group["lr"])
        if self.steps is not None:
            step_size = inv = 0.0
        else:
            self.count += 1
            step_size = lr / (1 - beta1**self.count)
            inv = 1 / math.sqrt(1 - beta2**self.count)
        run_plan(plan, self.steps, self.ticket, lr, beta1, beta2, group["eps"], group["weight_decay"],
                 group["maximize"], step_size, inv)  # fmt: skip
        return True
