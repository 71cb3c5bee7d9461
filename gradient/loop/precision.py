"""Mixed-precision training: float32 master weights and optimizer state, compute in the
run's ``runtime.dtype``.

The policy is loaded in float32 and AdamW keeps float32 moments, so an update smaller than a
bfloat16 spacing is not lost (the failure es-llm's ES engine avoids the same way with its
float32 master copy). Forward passes run under ``torch.autocast`` to ``runtime.dtype``;
log-softmax and the losses' reductions autocast to float32. Backward passes run outside the
autocast context, as torch recommends. float16 has a narrow exponent range, so its
gradients are scaled up before the backward pass and back down before clipping (torch's
``GradScaler``): a step whose scaled gradients overflowed is skipped and the scale halved,
which is the scaler's calibration, not a divergence.
"""

from __future__ import annotations

import math

import torch

from es_llm.runtime import Runtime


class Precision:
    """One trainer's mixed-precision state: the autocast context and float16's loss scale."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.scaler = runtime.grad_scaler()

    def compute(self):
        """The context of every forward pass that trains or samples the policy."""
        return self.runtime.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Gradients back at their true size, before they are clipped and their norm read."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def overflowed(self, grad_norm: float) -> bool:
        """Whether this step's scaled float16 gradients overflowed (the step is skipped);
        always False without a loss scale, where a non-finite norm is a divergence."""
        return self.scaler is not None and not math.isfinite(grad_norm)

    def step(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer step (skipped by the scaler after an overflow) and the loss scale
        it leaves, as metrics."""
        if self.scaler is None:
            optimizer.step()
            return {}
        self.scaler.step(optimizer)
        self.scaler.update()
        return {"loss_scale": float(self.scaler.get_scale())}

    def state_dict(self) -> dict | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, saved: dict | None) -> None:
        if self.scaler is not None and saved:
            self.scaler.load_state_dict(saved)


def load_policy(model_class, path: str, runtime: Runtime):
    """A model to train: float32 master weights on ``runtime.device``, with the configured
    attention implementation and, when asked, gradient checkpointing."""
    model = model_class.from_pretrained(path, dtype=torch.float32,
                                        **runtime.attention_kwargs()).to(runtime.device)
    if runtime.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model
