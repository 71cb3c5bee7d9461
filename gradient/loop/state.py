"""What the loop works on, below every stage and term that reads it: its edges (the models,
optimizer, sampler and task it is handed) and the state a step carries to the next."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from es_llm.runtime import Runtime
from gradient.loop.precision import Precision
from gradient.maths.adaprefix import PrefixState
from gradient.maths.replay import AdvantageReplayBuffer


@dataclass
class Edges:
    """What the loop is handed: the policy and its optimizer, the sampler and its weight
    sync, the task, and the frozen reference model (None without a KL term)."""

    model: torch.nn.Module
    tokenizer: object
    backend: object
    task: object
    optimizer: torch.optim.Optimizer
    ref_model: torch.nn.Module | None = None
    # Pushes the policy's weights into the sampler after an update (None: the sampler is
    # the policy itself).
    sync: object = None
    # Frozen models of on-policy distillation by role (teacher, base, positive, negative);
    # empty without distillation.
    teachers: dict = field(default_factory=dict)
    # A diffusion policy's sampler block length (its estimators score block by block).
    block_length: int = 1
    # LatentRevise's recovered trajectories by problem id: (prompt ids, completion ids with
    # EOS, reward), verified at set-up; empty without algo.recovered.data.
    recovered: dict = field(default_factory=dict)
    # Mixed precision: the autocast of the forward passes and float16's loss scale (float32
    # throughout by default).
    precision: Precision = field(default_factory=lambda: Precision(Runtime()))


@dataclass
class TrainerState:
    step: int = 0
    # Rollouts generated so far (dropped groups included): the budget compared across methods.
    samples: int = 0
    # The adaptive prefix controller (None without algo.prefix) and the replay buffer (None
    # without algo.replay).
    prefix: PrefixState | None = None
    replay: AdvantageReplayBuffer | None = None
    # What a distillation method keeps from step to step, by problem id (RSTG: the teacher's
    # solve rate and shortest correct trajectory).
    distill_memo: dict = field(default_factory=dict)
