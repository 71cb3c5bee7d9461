"""Samplers of masked-diffusion language models, shared by evaluation, ES and RL training.

A completion is a canvas of ``gen_length`` mask tokens after the prompt. It is decoded in
blocks of ``block_length`` from left to right (semi-autoregressive, as LLaDA and SDAR): inside
the current block, each step predicts every masked position at once and commits some of them;
later blocks stay masked until their turn. Which positions and how many a step commits is a
registered *commit rule* over one typed input (``CommitInput``):

- ``low_confidence`` (LLaDA, Nie et al. 2025, "low-confidence remasking"): a fixed number of
  steps per block; step s commits the ``k_s`` most confident masked positions, with the
  block's tokens spread evenly over its steps (the first steps take the remainder).
- ``tau_budget`` (SLIM-RL's ``tau_budget_dynamic`` decoder): among masked positions whose
  confidence exceeds tau, sorted by confidence, take the longest prefix whose summed
  uncertainty ``sum(1 - conf)`` fits the budget ``m (1 - tau)``; commit
  ``min(max(k_budget, k_static), #masked)`` positions, so at least the static count.
  ``m = 0`` means m = the static count. Steps per block are therefore dynamic.

Confidence is the probability the model gives the token it predicts (softmax of the raw
logits), as in LLaDA; the predicted token is drawn from ``softmax(logits / T)`` (Gumbel-max
with an explicit generator) or the argmax at T = 0. Every sampler records the step at which
each canvas position was committed (``step_map``, what TraceRL trains on) and, on request,
the canvas after every step (the intermediate states dOPSD's teacher views come from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from es_llm.config import check_choices, choice
from es_llm.errors import BadInput
from populations.registry import Registry


@dataclass(frozen=True)
class DiffusionSampling:
    # Commit rule: low_confidence (fixed steps) or tau_budget (confidence budget).
    kind: str = choice("low_confidence", lambda: COMMIT_RULES)
    # Canvas length of a completion in tokens (EOS fills what the answer does not use).
    gen_length: int = 64
    # Semi-autoregressive block size; gen_length for one block over the whole canvas.
    block_length: int = 16
    # Denoising steps over the whole canvas (split evenly across blocks). For tau_budget it
    # sets the static per-step count, block_length / (steps / blocks).
    steps: int = 32
    # tau_budget: confidence threshold tau and budget multiplier m (0 = the static count).
    tau: float = 0.9
    budget_m: float = 1.0

    def __post_init__(self):
        check_choices(self, "diffusion sampler ")
        if self.gen_length < 1 or self.block_length < 1 or self.gen_length % self.block_length:
            raise BadInput(f"diffusion gen_length ({self.gen_length}) must be a positive "
                           f"multiple of block_length ({self.block_length}).")
        blocks = self.gen_length // self.block_length
        if self.steps < blocks or self.steps % blocks or self.steps > self.gen_length:
            raise BadInput(f"diffusion steps ({self.steps}) must be a multiple of the number of "
                           f"blocks ({blocks}) and at most gen_length ({self.gen_length}).")
        if not 0.0 < self.tau < 1.0 or self.budget_m < 0:
            raise BadInput(f"diffusion tau must lie in (0, 1) and budget_m be >= 0, got "
                           f"tau={self.tau}, budget_m={self.budget_m}.")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks


def transfer_schedule(block_length: int, steps: int) -> list[int]:
    """Tokens committed at each of a block's ``steps`` steps: ``block_length / steps`` each,
    the remainder one more on the first steps (LLaDA's ``get_num_transfer_tokens``).
    E.g. (10, 4) -> [3, 3, 2, 2]."""
    base, extra = divmod(block_length, steps)
    return [base + (1 if s < extra else 0) for s in range(steps)]


@dataclass(frozen=True)
class CommitInput:
    """What a commit rule sees at one step: ``conf_B_L`` is the confidence of every canvas
    position, -inf where it may not be committed (already committed or outside the current
    block); ``masked_B`` counts the committable positions; ``step_in_block`` counts the steps
    taken in this block so far."""

    conf_B_L: torch.Tensor
    masked_B: torch.Tensor
    step_in_block: int
    cfg: DiffusionSampling


def low_confidence_count(x: CommitInput) -> torch.Tensor:
    """k per row: the fixed schedule's count at this step (never more than is masked)."""
    schedule = transfer_schedule(x.cfg.block_length, x.cfg.steps_per_block)
    k = schedule[min(x.step_in_block, len(schedule) - 1)]
    # A block must be finished by its last scheduled step, whatever is left.
    if x.step_in_block >= len(schedule) - 1:
        return x.masked_B
    return torch.clamp(torch.full_like(x.masked_B, k), max=x.masked_B)


def tau_budget_count(x: CommitInput) -> torch.Tensor:
    """k per row under SLIM-RL's uncertainty budget (see the module docstring)."""
    cfg = x.cfg
    k_static = max(1, cfg.block_length // cfg.steps_per_block)
    m = cfg.budget_m if cfg.budget_m > 0 else float(k_static)
    conf_sorted_B_L = x.conf_B_L.sort(dim=-1, descending=True).values
    above_B_L = conf_sorted_B_L > cfg.tau
    spent_B_L = torch.cumsum(torch.where(above_B_L, 1.0 - conf_sorted_B_L, 0.0), dim=-1)
    fits_B_L = above_B_L & (spent_B_L <= m * (1.0 - cfg.tau) + 1e-12)
    # Above-tau positions come first in the sort, so the fitting ones form a prefix.
    k_budget_B = fits_B_L.sum(dim=-1)
    return torch.minimum(torch.clamp(k_budget_B, min=k_static), x.masked_B)


COMMIT_RULES: Registry[Callable[[CommitInput], torch.Tensor]] = Registry("commit rule")
COMMIT_RULES.register("low_confidence")(low_confidence_count)
COMMIT_RULES.register("tau_budget")(tau_budget_count)


def predict(logits_B_L_V: torch.Tensor, temperature: float, generator: torch.Generator):
    """Predicted token and its confidence at every position: ``x0`` drawn from
    softmax(logits / T) by Gumbel-max (argmax at T = 0), ``conf`` = softmax(logits)[x0]."""
    logits = logits_B_L_V.float()
    if temperature == 0:
        x0_B_L = logits.argmax(dim=-1)
    else:
        u = torch.rand(logits.shape, generator=generator, device=generator.device)
        exponential = (-torch.log(u.clamp_min(1e-20))).clamp_min(1e-20)
        gumbel = -torch.log(exponential)
        x0_B_L = (logits / temperature + gumbel.to(logits.device)).argmax(dim=-1)
    conf_B_L = torch.softmax(logits, dim=-1).gather(-1, x0_B_L[..., None])[..., 0]
    return x0_B_L, conf_B_L


def commit(conf_B_L: torch.Tensor, k_B: torch.Tensor) -> torch.Tensor:
    """Boolean B x L: each row's ``k`` highest-confidence positions (ties by position)."""
    order_B_L = conf_B_L.argsort(dim=-1, descending=True, stable=True)
    rank_B_L = torch.empty_like(order_B_L)
    rank_B_L.scatter_(-1, order_B_L, torch.arange(conf_B_L.shape[-1]).expand_as(order_B_L))
    return (rank_B_L < k_B[:, None]) & torch.isfinite(conf_B_L)


@dataclass
class Canvas:
    """A batch being decoded: ``ids_B_T`` = right-padded [prompt][canvas][pad]; ``start_B``
    the canvas offset of each row; ``step_map_B_L`` the commit step of every canvas position
    (-1 while masked); ``states`` the canvases after each step when recorded."""

    ids_B_T: torch.Tensor
    attention_B_T: torch.Tensor
    start_B: torch.Tensor
    step_map_B_L: torch.Tensor
    states: list[torch.Tensor] | None

    def canvas_index(self, L: int) -> torch.Tensor:
        """B x L positions of the canvas inside ``ids_B_T``."""
        return self.start_B[:, None] + torch.arange(L)[None, :]


def make_canvas(prompts: list[list[int]], gen_length: int, mask_id: int, pad_id: int,
                record_states: bool) -> Canvas:
    B = len(prompts)
    lengths = torch.tensor([len(p) for p in prompts])
    T = int(lengths.max()) + gen_length
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p, dtype=torch.long)
        ids[i, len(p):len(p) + gen_length] = mask_id
        attention[i, :len(p) + gen_length] = 1
    return Canvas(ids, attention, lengths, torch.full((B, gen_length), -1, dtype=torch.long),
                  [] if record_states else None)


@torch.no_grad()
def sample(denoise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], prompts: list[list[int]],
           cfg: DiffusionSampling, temperature: float, generator: torch.Generator, mask_id: int,
           pad_id: int, record_states: bool = False) -> Canvas:
    """Decode a canvas after every prompt (token ids) with the configured commit rule.

    ``denoise(ids_B_T, attention_B_T)`` returns logits ``B x T x V``. Returns the finished
    ``Canvas``: every canvas position committed, ``step_map_B_L`` in 0..(steps taken - 1)."""
    rule = COMMIT_RULES.get(cfg.kind)
    canvas = make_canvas(prompts, cfg.gen_length, mask_id, pad_id, record_states)
    L = cfg.gen_length
    index_B_L = canvas.canvas_index(L)
    step = 0
    for block in range(cfg.num_blocks):
        in_block_L = torch.zeros(L, dtype=torch.bool)
        in_block_L[block * cfg.block_length:(block + 1) * cfg.block_length] = True
        for step_in_block in range(cfg.block_length):  # at least one commit per step
            masked_B_L = (canvas.step_map_B_L < 0) & in_block_L
            if not masked_B_L.any():
                break
            logits = denoise(canvas.ids_B_T, canvas.attention_B_T)
            x0_B_T, conf_B_T = predict(logits, temperature, generator)
            x0_B_L = x0_B_T.gather(1, index_B_L)
            conf_B_L = conf_B_T.gather(1, index_B_L).masked_fill(~masked_B_L, float("-inf"))
            k_B = rule(CommitInput(conf_B_L, masked_B_L.sum(-1), step_in_block, cfg))
            chosen_B_L = commit(conf_B_L, k_B)
            canvas.ids_B_T.scatter_(1, index_B_L, torch.where(
                chosen_B_L, x0_B_L, canvas.ids_B_T.gather(1, index_B_L)))
            canvas.step_map_B_L[chosen_B_L] = step
            if canvas.states is not None:
                canvas.states.append(canvas.ids_B_T.gather(1, index_B_L).clone())
            step += 1
    return canvas
