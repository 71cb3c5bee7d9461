"""Registered log-probability estimators: how the trainer scores a rollout under its model.

An autoregressive LM has an exact per-token log-probability; a masked-diffusion LM does not,
and each diffusion RL method differs mainly in the masked inputs it reads its log-probs
from (``gradient.dllm.masks``). Every estimator takes one ``EstimateInput`` and returns an
``Estimate`` over the rollout's completion tokens (T = the longest completion in the
batch), so the rest of the loop (ratios, clipping, aggregation, KL) is shared:

- ``autoregressive``: teacher-forced log-probs (``gradient.maths.logprobs``);
- ``mean_field`` (d1 / diffu-GRPO): one forward pass with the whole canvas masked and each
  prompt token masked with probability ``p_mask_prompt``; the mask depends on the row's seed
  and the inner iteration (``view``), so old, new and reference passes of one iteration see
  the same input (``per_view = True``: the trainer freezes old log-probs per iteration);
- ``trace`` (TraceRL): each token is scored in the state the sampler committed it from
  (``masks.trace_rows``);
- ``quadrature`` (SLIM-RL): a row carries one Gauss-Legendre level; the masks are drawn at
  that level with the decreasing per-block schedule, frozen per rollout and level;
- ``student_view`` (dOPSD): the student's distributions at the masked positions of one
  intermediate state of its own trajectory (the teacher side is ``teacher_view_targets``).

Canvas inputs use the sampler's layout, ``[prompt][canvas][pad]`` right-padded, so positions
match generation. Every diffusion estimator scores the canvas block by block the way the
sampler decoded it: earlier blocks clean, later blocks fully masked (a bidirectional encoder
would otherwise see tokens that did not exist yet when the block was decoded).
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np
import torch

from gradient.dllm.masks import (block_mask_schedule, gauss_legendre, mean_field_masks,
                                 sample_block_masks, trace_rows)
from gradient.loop.seeds import derive_seed
from gradient.maths.logprobs import completion_logits, token_stats
from populations.registry import Registry


@dataclass(frozen=True)
class EstimateInput:
    """B rollouts to score (``gradient.loop.batch.Rollout``): ``prompt_ids``, ``completion_ids``
    (the canvas up to and including its first EOS), and for diffusion estimators ``trace``
    (a ``DiffusionTrace``) and ``mask_seed``; quadrature rows also ``level``."""

    model: torch.nn.Module
    rows: Sequence
    temperature: float
    pad_id: int
    mask_id: int
    # gradient.config.DiffusionRLSettings (and, for student_view, the dOPSD settings).
    settings: object
    block_length: int = 1
    # The inner iteration (epoch) for estimators whose masks change with it.
    view: int = 0
    # Also return the full distributions (divergence methods) and the entropy.
    full: bool = False
    with_entropy: bool = True
    dopsd: object = None


@dataclass
class Estimate:
    logp_B_T: torch.Tensor
    entropy_B_T: torch.Tensor | None
    mask_B_T: torch.Tensor
    logp_B_T_V: torch.Tensor | None = None


@dataclass(frozen=True)
class EstimatorSpec:
    fn: Callable[[EstimateInput], Estimate]
    # True when the masks change with the inner iteration (old log-probs frozen per view).
    per_view: bool = False
    # True for estimators of masked-diffusion models (rollouts carry a trace).
    diffusion: bool = True
    # How many tokens of the rows the estimate scores, without running the model (the
    # global token count of token-mean aggregation); None = every completion token.
    count: Callable[[EstimateInput], int] | None = None
    # The rows the estimator scores per rollout, made at birth from the step's
    # ``RolloutBatch`` and ``DiffusionRLSettings``; None = one row per rollout.
    expand: Callable | None = None


_ESTIMATORS: Registry[EstimatorSpec] = Registry("log-prob estimator")


def estimator_names() -> list[str]:
    return _ESTIMATORS.names()


def estimator_spec(name: str) -> EstimatorSpec:
    return _ESTIMATORS.get(name)


def estimate(name: str, inp: EstimateInput) -> Estimate:
    return _ESTIMATORS.get(name).fn(inp)


def scored_tokens(name: str, inp: EstimateInput) -> int:
    """The number of tokens ``estimate(name, inp)`` puts in its mask."""
    count = _ESTIMATORS.get(name).count
    if count is None:
        return sum(len(r.completion_ids) for r in inp.rows)
    return count(inp)


def _register(name: str, **declaration):
    def decorator(fn):
        _ESTIMATORS.register(name)(EstimatorSpec(fn, **declaration))
        return fn
    return decorator


@_register("autoregressive", diffusion=False)
def autoregressive(inp: EstimateInput) -> Estimate:
    """Exact teacher-forced log-probs of a causal LM (``gradient.maths.logprobs``)."""
    prompts = [r.prompt_ids for r in inp.rows]
    comps = [r.completion_ids for r in inp.rows]
    T = max((len(c) for c in comps), default=0)
    logp_B_T_V, targets_B_T, mask_B_T, _ = completion_logits(inp.model, prompts, comps, T,
                                                             inp.temperature, inp.pad_id)
    logp_B_T, entropy_B_T = token_stats(logp_B_T_V, targets_B_T, mask_B_T, inp.with_entropy)
    return Estimate(logp_B_T, entropy_B_T, mask_B_T, logp_B_T_V if inp.full else None)


# --- canvas plumbing shared by the diffusion estimators -------------------------------------

def canvas_logp(model, prompts: list[list[int]], canvases_N_L: torch.Tensor, pad_id: int,
                temperature: float, prompt_masked: list[torch.Tensor] | None = None,
                mask_id: int | None = None) -> torch.Tensor:
    """``log_softmax(logits / T)`` at the canvas positions of N inputs ``[prompt][canvas]``
    (right-padded), shape ``N x L x V``; ``prompt_masked[i]`` masks prompt tokens of row i."""
    device = next(model.parameters()).device
    N, L = canvases_N_L.shape
    width = max(len(p) for p in prompts) + L
    ids = torch.full((N, width), pad_id, dtype=torch.long)
    attention = torch.zeros((N, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        prompt = torch.tensor(p, dtype=torch.long)
        if prompt_masked is not None:
            prompt = torch.where(prompt_masked[i], torch.full_like(prompt, mask_id), prompt)
        ids[i, :len(p)] = prompt
        ids[i, len(p):len(p) + L] = canvases_N_L[i]
        attention[i, :len(p) + L] = 1
    logits = model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
    index_N_L = torch.tensor([len(p) for p in prompts])[:, None] + torch.arange(L)[None, :]
    at_canvas = logits.gather(1, index_N_L.to(device)[..., None].expand(-1, -1, logits.shape[-1]))
    return torch.log_softmax(at_canvas.float() / temperature, dim=-1)


def _gather(rows, logp_B_L_V: torch.Tensor, scored_B_L: torch.Tensor, inp: EstimateInput
            ) -> Estimate:
    """Completion-token log-probs (T = longest completion) from canvas distributions;
    ``scored_B_L`` marks which positions enter the estimate."""
    T = max(len(r.completion_ids) for r in rows)
    device = logp_B_L_V.device
    targets_B_T = torch.zeros((len(rows), T), dtype=torch.long)
    mask_B_T = torch.zeros((len(rows), T))
    for i, r in enumerate(rows):
        n = len(r.completion_ids)
        targets_B_T[i, :n] = torch.tensor(r.completion_ids, dtype=torch.long)
        mask_B_T[i, :n] = scored_B_L[i, :n].float()
    targets_B_T, mask_B_T = targets_B_T.to(device), mask_B_T.to(device)
    logp_B_T_V = logp_B_L_V[:, :T]
    logp_B_T, entropy_B_T = token_stats(logp_B_T_V, targets_B_T, mask_B_T, inp.with_entropy)
    return Estimate(logp_B_T, entropy_B_T, mask_B_T, logp_B_T_V if inp.full else None)


def _canvas_B_L(rows) -> torch.Tensor:
    return torch.tensor([list(r.trace.canvas_L) for r in rows], dtype=torch.long)


def _row_generator(*parts) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*parts))


def _blockwise(inp: EstimateInput, noisy_B_L: torch.Tensor, scored_B_L: torch.Tensor
               ) -> Estimate:
    """Score ``scored_B_L`` positions block by block: for block b, an input whose earlier
    blocks are clean, block b noised by ``noisy_B_L`` and later blocks fully masked; each
    position's distribution comes from its own block's input. One forward pass over all
    (row, block) inputs that score anything."""
    rows, bl = inp.rows, inp.block_length
    canvas_B_L = _canvas_B_L(rows)
    B, L = canvas_B_L.shape
    block_L = torch.arange(L) // bl
    owners, inputs, keeps = [], [], []
    for b in range(-(-L // bl)):
        in_block_L = block_L == b
        for i in range(B):
            keep_L = scored_B_L[i] & in_block_L
            if not keep_L.any():
                continue
            masked_L = (noisy_B_L[i] & in_block_L) | (block_L > b)
            inputs.append(torch.where(masked_L, torch.full_like(canvas_B_L[i], inp.mask_id),
                                      canvas_B_L[i]))
            owners.append(i)
            keeps.append(keep_L)
    logp_B_L_V, _ = _score_inputs(inp, owners, inputs, keeps, B, L)
    return _gather(rows, logp_B_L_V, scored_B_L, inp)


def _score_inputs(inp: EstimateInput, owners: list[int], inputs: list[torch.Tensor],
                  keeps: list[torch.Tensor], B: int, L: int):
    """One forward pass over N canvas inputs, input n belonging to row ``owners[n]`` and
    scoring the positions ``keeps[n]``; each scored position is kept by exactly one input,
    so a masked sum puts it in place. Returns ``(logp_B_L_V, scored_B_L)``."""
    logp_N_L_V = canvas_logp(inp.model, [inp.rows[i].prompt_ids for i in owners],
                             torch.stack(inputs), inp.pad_id, inp.temperature)
    device = logp_N_L_V.device
    keep_N_L = torch.stack(keeps)
    owner_N = torch.tensor(owners)
    logp_B_L_V = torch.zeros((B, L, logp_N_L_V.shape[-1]), device=device).index_add(
        0, owner_N.to(device), logp_N_L_V * keep_N_L.to(device)[..., None])
    scored_B_L = torch.zeros((B, L), dtype=torch.long).index_add(
        0, owner_N, keep_N_L.long()).bool()
    return logp_B_L_V, scored_B_L


@_register("mean_field", per_view=True)
def mean_field(inp: EstimateInput) -> Estimate:
    """d1's one-step estimate: ``log p(o_k | prompt~, all-masked canvas)`` for every
    completion token; the prompt mask is drawn per row from (row seed, inner iteration).

    Departure: d1 masks the prompt tokens with one draw for the whole batch per iteration;
    here each row draws its own from its seed, so a row's mask does not depend on which
    micro-batch it lands in (the ratio still compares identical perturbations)."""
    rows = inp.rows
    canvas_B_L = _canvas_B_L(rows)
    masked_prompts = []
    for r in rows:
        n = len(r.prompt_ids)
        masked = mean_field_masks(torch.ones(1, n, dtype=torch.bool),
                                  torch.zeros(1, n, dtype=torch.bool),
                                  inp.settings.p_mask_prompt,
                                  derive_seed(r.mask_seed, "mean-field", inp.view))
        masked_prompts.append(masked[0])
    logp_B_L_V = canvas_logp(inp.model, [r.prompt_ids for r in rows],
                             torch.full_like(canvas_B_L, inp.mask_id), inp.pad_id,
                             inp.temperature, masked_prompts, inp.mask_id)
    return _gather(rows, logp_B_L_V, torch.ones_like(canvas_B_L, dtype=torch.bool), inp)


@_register("trace")
def trace(inp: EstimateInput) -> Estimate:
    """TraceRL: every completion token scored from the canvas the sampler committed it from
    (``masks.trace_rows``: its block's positions committed at that step or later masked,
    earlier blocks clean, later blocks masked). ``settings.shrink`` merges steps."""
    rows = inp.rows
    canvas_B_L = _canvas_B_L(rows)
    B, L = canvas_B_L.shape
    owners, inputs, keeps = [], [], []
    for i, r in enumerate(rows):
        n = len(r.completion_ids)
        for targets_L, masked_L in trace_rows(list(r.trace.step_map_L), inp.block_length,
                                              inp.settings.shrink):
            if not targets_L[:n].any():  # only the EOS fill after the completion
                continue
            owners.append(i)
            keeps.append(targets_L)
            inputs.append(torch.where(masked_L, torch.full_like(canvas_B_L[i], inp.mask_id),
                                      canvas_B_L[i]))
    logp_B_L_V, scored_B_L = _score_inputs(inp, owners, inputs, keeps, B, L)
    return _gather(rows, logp_B_L_V, scored_B_L, inp)


def quadrature_levels(points: int) -> tuple[np.ndarray, np.ndarray]:
    """The mask levels ``t_K`` and weights ``w_K`` (sum 1) of SLIM-RL's quadrature."""
    return gauss_legendre(points)


def quadrature_masks(inp: EstimateInput) -> torch.Tensor:
    """``B x L`` boolean: each row's Bernoulli masks at its level (see ``quadrature``)."""
    s = inp.settings
    L = len(inp.rows[0].trace.canvas_L)
    levels, _ = quadrature_levels(s.quadrature_points)
    blocks = -(-L // inp.block_length)
    noisy = []
    for r in inp.rows:
        p_K = block_mask_schedule(float(levels[r.level]), blocks, s.spread_cap)
        noisy.append(sample_block_masks(torch.ones(1, L, dtype=torch.bool), inp.block_length,
                                        p_K, _row_generator(r.mask_seed, "quadrature",
                                                            r.level))[0])
    return torch.stack(noisy)


def _count_in_completion(scored_B_L: torch.Tensor, rows) -> int:
    return sum(int(scored_B_L[i, :len(r.completion_ids)].sum()) for i, r in enumerate(rows))


def _count_quadrature(inp: EstimateInput) -> int:
    return _count_in_completion(quadrature_masks(inp), inp.rows)


def quadrature_rows(batch, settings):
    """SLIM-RL's deterministic quadrature: each rollout becomes one row per Gauss-Legendre
    level j with weight ``K w_j``, so sequence-mean aggregation over the B K rows gives
    ``(1/B) sum_b sum_j w_j L_bj``."""
    _, w_K = quadrature_levels(settings.quadrature_points)
    K = len(w_K)
    return type(batch).of([replace(r, level=j, row_weight=float(K * w_K[j]))
                           for r in batch for j in range(K)])


@_register("quadrature", count=_count_quadrature, expand=quadrature_rows)
def quadrature(inp: EstimateInput) -> Estimate:
    """SLIM-RL: the row's level ``t_j`` (``row.level``) gives per-block mask
    probabilities (``masks.block_mask_schedule``, decreasing across blocks, mean t_j);
    Bernoulli masks over the canvas from (row seed, level), so old and new passes see the
    same masks; the masked completion tokens are scored block by block."""
    noisy_B_L = quadrature_masks(inp)
    n_B = torch.tensor([len(r.completion_ids) for r in inp.rows])
    in_completion_B_L = torch.arange(noisy_B_L.shape[1])[None, :] < n_B[:, None]
    return _blockwise(inp, noisy_B_L, noisy_B_L & in_completion_B_L)


# --- dOPSD: student and teacher views of one trajectory ---------------------------------------

def trajectory_state(trace, i: int, mask_id: int) -> torch.Tensor:
    """The canvas after step ``i`` (``i = -1``: before the first step, all masked): the
    recorded state when the sampler kept them, else rebuilt from the step map (committed
    tokens never change, so the two agree)."""
    if i >= 0 and trace.states_S_L is not None:
        return trace.states_S_L[i].clone()
    canvas_L = torch.tensor(trace.canvas_L)
    step_L = torch.tensor(trace.step_map_L)
    return torch.where((step_L <= i) & (step_L >= 0), canvas_L, torch.full_like(canvas_L, mask_id))


def view_pair(row, dopsd) -> tuple[int, list[int]]:
    """The student's state index and the teacher's state indices for one rollout.

    Candidates for the student are the states (``-1 .. S-2``) whose masked fraction of the
    completion exceeds ``mask_threshold``; ``step_select`` picks the most masked, the least
    masked, or one at random from the row's seed. The teacher sees ``gap`` steps later
    (``snapshot``, capped at the final state), the final state (``final``), or every later
    state (``all_future``)."""
    step_L = torch.tensor(row.trace.step_map_L)
    n = len(row.completion_ids)
    S = int(step_L.max()) + 1
    frac = [float((step_L[:n] > i).float().mean()) for i in range(-1, S - 1)]
    candidates = [i - 1 for i, f in enumerate(frac) if f > dopsd.mask_threshold] or [-1]
    if dopsd.step_select == "most":
        i = candidates[0]
    elif dopsd.step_select == "least":
        i = candidates[-1]
    else:
        g = _row_generator(row.mask_seed, "dopsd-view")
        i = candidates[int(torch.randint(len(candidates), (1,), generator=g))]
    if dopsd.teacher_view == "snapshot":
        return i, [min(i + dopsd.gap, S - 1)]
    if dopsd.teacher_view == "final":
        return i, [S - 1]
    return i, list(range(i + 1, S))


def student_states(inp: EstimateInput) -> torch.Tensor:
    """``B x L``: each rollout's student state (``view_pair``)."""
    return torch.stack([trajectory_state(r.trace, view_pair(r, inp.dopsd)[0], inp.mask_id)
                        for r in inp.rows])


def _count_student_view(inp: EstimateInput) -> int:
    return _count_in_completion(student_states(inp) == inp.mask_id, inp.rows)


@_register("student_view", count=_count_student_view)
def student_view(inp: EstimateInput) -> Estimate:
    """dOPSD's student side: the model's distributions on one intermediate state of the
    rollout's own trajectory (``view_pair``), at the completion positions masked there."""
    states_B_L = student_states(inp)
    logp_B_L_V = canvas_logp(inp.model, [r.prompt_ids for r in inp.rows], states_B_L,
                             inp.pad_id, inp.temperature)
    return _gather(inp.rows, logp_B_L_V, states_B_L == inp.mask_id, inp)


@torch.no_grad()
def teacher_view_targets(model, rows: Sequence, T: int, temperature: float, pad_id: int,
                         mask_id: int, dopsd) -> torch.Tensor:
    """dOPSD's teacher side, ``B x T x V`` log-probs: at each completion position, the mean
    over the teacher's states of its distribution there, where a state still has the
    position masked, or the committed token (one-hot) where it has decoded it.

    Reading (the paper's code was not available): an encoder's output at an unmasked
    position is not a prediction, so a decoded position contributes the token the trajectory
    committed; with ``final`` the target is therefore the rollout's own token (self-SFT),
    with ``snapshot`` and ``all_future`` it mixes the later predictions and commitments."""
    owners, states = [], []
    for i, r in enumerate(rows):
        _, views = view_pair(r, dopsd)
        owners += [i] * len(views)
        states += [trajectory_state(r.trace, j, mask_id) for j in views]
    states_N_L = torch.stack(states)
    logp_N_L_V = canvas_logp(model, [rows[i].prompt_ids for i in owners], states_N_L, pad_id,
                             temperature)
    device, V = logp_N_L_V.device, logp_N_L_V.shape[-1]
    canvas_N_L = _canvas_B_L([rows[i] for i in owners])
    onehot_N_L_V = torch.nn.functional.one_hot(canvas_N_L, V).float().to(device)
    masked_N_L_1 = (states_N_L == mask_id).to(device)[..., None]
    p_N_L_V = torch.where(masked_N_L_1, logp_N_L_V.exp(), onehot_N_L_V)
    owner_N = torch.tensor(owners, device=device)
    count_B = torch.zeros(len(rows), device=device).index_add(0, owner_N, torch.ones_like(
        owner_N, dtype=torch.float32))
    p_B_L_V = torch.zeros((len(rows), *p_N_L_V.shape[1:]), device=device).index_add(
        0, owner_N, p_N_L_V) / count_B[:, None, None]
    return p_B_L_V[:, :T].clamp_min(1e-30).log()
