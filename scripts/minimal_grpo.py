"""GRPO in one page: the trainer's registered maths (advantages, policy loss, aggregation)
on a tiny random language model, without vLLM, transformers or the task layer. The reward
is the share of a chosen token in each sampled completion.

    python scripts/minimal_grpo.py [--steps 30]

Prints the mean greedy reward of the initial and the final weights as one JSON line. The
real trainer (``gradient/loop/trainer.py``) adds what this leaves out: prompts from a task, a
generation backend, birth stages (frozen behaviour log-probs, replay, distillation) and the
other loss terms, several epochs and mini-batches, checkpoints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from gradient.maths.advantages import AdvantageInput, compute_advantages  # noqa: E402
from gradient.maths.aggregation import aggregate  # noqa: E402
from gradient.maths.losses import LossInput, compute_loss  # noqa: E402
from minimal_es import LENGTH, TARGET, VOCAB, TinyLM, greedy_reward_P  # noqa: E402


def sample(model: TinyLM, prompts_P: torch.Tensor, G: int, generator: torch.Generator):
    """G completions per prompt at temperature 1: ``(ids_B_T, logp_B_T)``, B = P G."""
    ids_B = prompts_P.repeat_interleave(G)
    ids, logps = [], []
    for _ in range(LENGTH):
        logp_B_V = model(ids_B).log_softmax(-1)
        ids_B = torch.multinomial(logp_B_V.exp(), 1, generator=generator)[:, 0]
        ids.append(ids_B)
        logps.append(logp_B_V.gather(-1, ids_B[:, None])[:, 0])
    return torch.stack(ids, 1), torch.stack(logps, 1)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per prompt (G)")
    parser.add_argument("--seed", type=int, default=0, help="model and sampling seed")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    model = TinyLM(torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    generator = torch.Generator().manual_seed(args.seed + 1)
    prompts_P, G = torch.arange(VOCAB), args.group_size
    before = float(greedy_reward_P(model, dict(model.named_parameters()), prompts_P).mean())
    for _ in range(args.steps):
        with torch.no_grad():
            ids_B_T, old_logp_B_T = sample(model, prompts_P, G, generator)
        rewards_P_G = (ids_B_T == TARGET).double().mean(1).view(-1, G)
        adv_P_G = compute_advantages("grpo", AdvantageInput(rewards_P_G))
        # Teacher-forced log-probs of the sampled tokens under the current weights: a one-
        # token context model reads each token's predecessor.
        context_B_T = torch.cat([prompts_P.repeat_interleave(G)[:, None], ids_B_T[:, :-1]], 1)
        logp_B_T = model(context_B_T).log_softmax(-1).gather(-1, ids_B_T[..., None])[..., 0]
        mask_B_T = torch.ones_like(logp_B_T)
        loss_B_T, _ = compute_loss("ppo_clip", LossInput(
            logp_B_T=logp_B_T, old_logp_B_T=old_logp_B_T,
            adv_B_T=adv_P_G.reshape(-1, 1).float() * mask_B_T, mask_B_T=mask_B_T, clip_low=0.2,
            clip_high=0.2))
        loss = aggregate(loss_B_T, mask_B_T, "token-mean", global_tokens=float(mask_B_T.sum()),
                         global_seqs=float(len(mask_B_T)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = float(greedy_reward_P(model, dict(model.named_parameters()), prompts_P).mean())
    result = {"before": before, "after": after, "steps": args.steps,
              "last_reward_mean": float(rewards_P_G.mean())}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
