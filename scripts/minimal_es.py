"""ES in one page: the engine's maths (``populations.es``) on a tiny random language model,
without MPI, vLLM or transformers. The reward is the share of a chosen token in a greedy
completion, so the policy has something to learn in a few seconds.

    python scripts/minimal_es.py [--iterations 30]

Prints the mean reward of the initial and the final weights as one JSON line. The real
engine (``es_llm/es/engine.py``) adds what this leaves out: prompts from a task, a
generation backend serving the members, ranks exchanging rewards, the ledger, checkpoints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from populations import es  # noqa: E402

VOCAB, WIDTH, LENGTH, TARGET = 16, 32, 8, 7


class TinyLM(torch.nn.Module):
    """A next-token model that sees only the previous token (embedding -> MLP -> logits)."""

    def __init__(self, generator: torch.Generator):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.hidden = torch.nn.Linear(WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)

    def forward(self, ids_B: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(self.embed(ids_B))))


@torch.no_grad()
def greedy_reward_P(model: TinyLM, params: dict, prompts_P: torch.Tensor) -> torch.Tensor:
    """Share of ``TARGET`` tokens in each prompt's greedy completion under ``params``."""
    ids_P, hits_P = prompts_P, torch.zeros(len(prompts_P))
    for _ in range(LENGTH):
        logits_P_V = torch.func.functional_call(model, params, (ids_P,))
        ids_P = logits_P_V.argmax(-1)
        hits_P += (ids_P == TARGET).float()
    return hits_P / LENGTH


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=30, help="ES iterations")
    parser.add_argument("--population", type=int, default=16, help="members per iteration")
    parser.add_argument("--seed", type=int, default=0, help="model and noise seed")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    model = TinyLM(torch.Generator().manual_seed(args.seed))
    cfg = es.ESConfig(population=args.population, sigma=0.1, antithetic=True,
                      shaping="centered_rank", optimizer="sgd", lr=0.05)
    state = es.init(cfg, dict(model.named_parameters()), args.seed)
    prompts_P = torch.arange(VOCAB)  # every token once as a one-token prompt
    before = float(greedy_reward_P(model, state.params, prompts_P).mean())
    for _ in range(args.iterations):
        # Every member is the master plus its keyed noise; only its rewards leave it.
        rewards_N_P = torch.stack([greedy_reward_P(model, es.perturbed_params(cfg, state, m),
                                                   prompts_P)
                                   for m in es.ask(cfg, state)])
        state, metrics = es.tell(cfg, state, rewards_N_P)
    after = float(greedy_reward_P(model, state.params, prompts_P).mean())
    result = {"before": before, "after": after, "iterations": args.iterations,
              "last_reward_mean": metrics["reward_mean"]}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
