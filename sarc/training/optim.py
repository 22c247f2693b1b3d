"""sarc's optimizer: ``torch.optim.Adam`` without torch's compiler.

Every ``torch.optim`` optimizer imports ``torch._dynamo`` on its first call (its methods
are wrapped to keep ``torch.compile`` out of them, and ``step`` marks graph breaks),
which imports ``torch._inductor`` and Triton: ~110 MiB of RSS per process with torch
2.13, and a ``torchinductor_<user>`` directory in ``TMPDIR``. A worker runs in eager
mode and never compiles, and at P workers on one machine that runtime is paid P times.

``EagerAdam`` is ``torch.optim.Adam`` (its options, state and ``state_dict``, so that
checkpoints pass between the two) whose methods run unwrapped, and whose step is
``torch.optim.Adam``'s single-tensor update (``foreach=False``; the default on the CPU)
written out, operation for operation, so that its results are torch's bit for bit.
"""
from __future__ import annotations

import torch

UNSUPPORTED = ("amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused",
               "decoupled_weight_decay")
"""Adam's options ``EagerAdam.step`` does not implement (each must be off)."""


def _unwrapped(method):
    """``method`` without torch's ``_disable_dynamo`` wrapper, whose first call imports
    ``torch._dynamo`` (to turn off a compiler that eager mode does not run)."""
    return getattr(method, "__wrapped__", method)


class EagerAdam(torch.optim.Adam):
    """``torch.optim.Adam(params, lr=..., weight_decay=...)``, importing no compiler (see
    the module doc). The options of ``UNSUPPORTED`` are refused."""

    add_param_group = _unwrapped(torch.optim.Optimizer.add_param_group)
    zero_grad = _unwrapped(torch.optim.Optimizer.zero_grad)
    state_dict = _unwrapped(torch.optim.Optimizer.state_dict)
    load_state_dict = _unwrapped(torch.optim.Optimizer.load_state_dict)

    def __init__(self, params, **options):
        for name in UNSUPPORTED:
            if options.get(name):
                raise ValueError(f"EagerAdam does not implement Adam's {name}={options[name]!r}")
        super().__init__(params, **options)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            on = [name for name in UNSUPPORTED if group.get(name)]
            if on:
                raise ValueError(f"EagerAdam does not implement Adam's {on[0]}")
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, param: torch.Tensor, group: dict) -> None:
        """``torch.optim.adam._single_tensor_adam`` for one real parameter, with
        ``amsgrad``, ``maximize``, ``capturable`` and ``differentiable`` off."""
        grad = param.grad
        if grad.is_sparse:
            raise RuntimeError("Adam does not support sparse gradients, please consider "
                               "SparseAdam instead")
        if torch.is_complex(param):
            raise ValueError("EagerAdam does not implement complex parameters")
        state = self.state[param]
        if not state:
            scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            state["step"] = torch.tensor(0.0, dtype=scalar)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        lr, (beta1, beta2) = group["lr"], group["betas"]
        if any(torch.is_tensor(v) for v in (lr, beta1, beta2)):
            raise ValueError("EagerAdam takes lr and betas as numbers, not tensors")
        exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
        step_t += 1
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = step_t.item()
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
        param.addcdiv_(exp_avg, denom, value=-step_size)
