"""Every generation a test-time method makes, drawn through the shared ``Backend``, scored
with the task's verifier and counted in tokens per problem.

Methods never call the backend themselves: they ask ``Generations.draw`` for completions of
(problem, prompt) jobs and ``Generations.score_tokens`` for log-probabilities of given
continuations, so the token ledger (generated tokens, and tokens read in forward passes
that score a text) is complete by construction. A draw marked ``control`` is recorded with
its tokens but is not part of the method's cost (the self-repair control of the review
protocols).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence

import torch

from es_llm.backends.base import SamplingParams
from es_llm.tasks import Problem
from es_llm.tasks.countdown_roles import answer_value


def countdown_value(problem: Problem, completion: str) -> Fraction | None:
    """A Countdown answer's exact value: answers agree when their values are equal."""
    return answer_value(problem.gold["numbers"], completion)


@dataclass(frozen=True)
class Gen:
    """One completion: its text, tokens generated (EOS included when it ended one), per-token
    logprobs when asked for, and, for answer-bearing stages, the verifier's verdict and the
    answer's value (the task's answer equivalence, ``Generations``' ``value``; None for no
    valid answer)."""

    text: str
    num_tokens: int
    logprobs: tuple[float, ...] | None
    finish_reason: str
    correct: bool
    value: object
    answer: str | None = None


class Generations:
    """Draws, scores and records completions for one test-time run.

    ``backend``: the shared generation interface; ``task``: the verifier; ``scorer``: an
    ``HFScorer`` for teacher-forced log-probabilities (only the methods that localise need
    it); ``temperature`` and ``seed`` apply to every draw; ``value(problem, completion)``
    is the answer's value, by which votes count answers as equal (Countdown's exact value
    of the expression by default).
    """

    def __init__(self, backend, task, temperature: float, seed: int, scorer=None,
                 progress: bool = False,
                 value: Callable[[Problem, str], object] = countdown_value):
        self.backend, self.task, self.scorer, self.value = backend, task, scorer, value
        self.temperature, self.seed, self.progress = temperature, seed, progress
        self.rows: list[dict] = []
        self.generated: dict[tuple, int] = defaultdict(int)
        self.scored: dict[tuple, int] = defaultdict(int)
        self._index: dict[tuple, int] = defaultdict(int)

    def draw(self, label: tuple[str, int], stage: str, jobs: Sequence[tuple[Problem, str]],
             n: int, max_tokens: int, *, stop: tuple[str, ...] = (), logprobs: bool = False,
             answers: bool = True, control: bool = False,
             prefixes: Sequence[str] | None = None, stream: str | None = None,
             temperature: float | None = None) -> list[list[Gen]]:
        """``n`` completions for each ``(problem, prompt)`` job of method run ``label``
        (method, budget). ``answers``: score the texts as task answers (False for reviews,
        whose rows carry the verdict text instead). ``prefixes[i]``: text the job's prompt
        already ends with that belongs to the answer (a kept prefix of a trajectory): the
        verdict and the recorded completion are of prefix + continuation, the tokens counted
        are the continuation's. ``stream``: the name the sampling streams are keyed by in
        place of the method's (methods that must draw the same samples share one);
        ``temperature``: this draw's, in place of the run's."""
        if not jobs:
            return []
        params = SamplingParams(n=n, max_tokens=max_tokens, stop=stop, seed=self.seed,
                                temperature=self.temperature if temperature is None
                                else temperature, logprobs=logprobs)
        keys = [f"{stream or label[0]}:{label[1]}:{stage}:{p.id}" for p, _ in jobs]
        outs = self.backend.generate([prompt for _, prompt in jobs], params,
                                     progress=self.progress, keys=keys)
        heads = list(prefixes) if prefixes is not None else [""] * len(jobs)
        pairs = [(p, head + c.text) for (p, _), head, row in zip(jobs, heads, outs) for c in row]
        scores = iter(self.task.score_many(pairs) if answers else [None] * len(pairs))
        result = []
        for (problem, prompt), head, row in zip(jobs, heads, outs):
            gens = []
            for c in row:
                score, text = next(scores), head + c.text
                gen = Gen(text=text, num_tokens=len(c.token_ids), logprobs=c.logprobs,
                          finish_reason=c.finish_reason,
                          correct=bool(score.correct) if score is not None else False,
                          value=self.value(problem, text) if score is not None else None,
                          answer=score.answer if score is not None else None)
                self._record(label, stage, problem, prompt, gen, score, control)
                gens.append(gen)
            result.append(gens)
        return result

    def _record(self, label, stage, problem, prompt, gen: Gen, score, control: bool) -> None:
        key = (*label, problem.id)
        if not control:
            self.generated[key] += gen.num_tokens
        row = {"method": label[0], "budget": label[1], "problem_id": problem.id,
               "sample_index": self._index[key], "stage": stage, "control": control,
               "prompt": prompt, "completion": gen.text, "num_tokens": gen.num_tokens,
               "finish_reason": gen.finish_reason, "difficulty": problem.difficulty}
        self._index[key] += 1
        if score is not None:
            row.update(reward=score.reward, correct=bool(score.correct),
                       **score.details())
        else:
            # No task answer (a review's verdict, a plan line): the text is the row's answer.
            row.update(reward=0.0, correct=False, answer=gen.text.strip())
        self.rows.append(row)

    def score_tokens(self, label: tuple[str, int], jobs: Sequence[tuple[Problem, str, str]]
                     ) -> list[list[float]]:
        """Per-token log-probabilities of each job's continuation after its context
        (``(problem, context, continuation)``); every scored token counts as cost."""
        if self.scorer is None:
            raise RuntimeError("this method needs a scorer (teacher-forced log-probabilities)")
        out = self.scorer.token_logprobs([c for _, c, _ in jobs], [t for _, _, t in jobs])
        for (problem, _, _), lps in zip(jobs, out):
            self.scored[(*label, problem.id)] += len(lps)
        return out

    def cost(self, label: tuple[str, int], problem_id: str) -> tuple[int, int]:
        """(generated tokens, scored tokens) of ``problem_id`` under method run ``label``."""
        key = (*label, problem_id)
        return self.generated.get(key, 0), self.scored.get(key, 0)


class HFScorer:
    """Teacher-forced per-token log-probabilities of continuations under a transformers
    causal LM (the raw log-softmax, as the backends' ``logprobs_mode="raw"``)."""

    def __init__(self, model_path: str, batch_size: int = 64, model=None, tokenizer=None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
        self.model = (model or AutoModelForCausalLM.from_pretrained(model_path)).eval()
        self.batch_size = batch_size

    @torch.no_grad()
    def token_logprobs(self, contexts: Sequence[str], continuations: Sequence[str]
                       ) -> list[list[float]]:
        """``log p(token_t | context, continuation_<t)`` for every continuation token."""
        tok, out = self.tokenizer, []
        for start in range(0, len(contexts), self.batch_size):
            ctx = [tok(c).input_ids for c in contexts[start:start + self.batch_size]]
            cont = [tok(t, add_special_tokens=False).input_ids
                    for t in continuations[start:start + self.batch_size]]
            rows = [a + b for a, b in zip(ctx, cont)]
            L = max(len(r) for r in rows)
            ids_B_L = torch.full((len(rows), L), tok.pad_token_id, dtype=torch.long)
            mask_B_L = torch.zeros((len(rows), L), dtype=torch.long)
            for i, r in enumerate(rows):
                ids_B_L[i, :len(r)] = torch.tensor(r)
                mask_B_L[i, :len(r)] = 1
            device = next(self.model.parameters()).device
            logp_B_L_V = torch.log_softmax(self.model(
                input_ids=ids_B_L.to(device),
                attention_mask=mask_B_L.to(device)).logits.float(), -1).cpu()
            for i, (a, b) in enumerate(zip(ctx, cont)):
                # Token at position p is predicted by the logits at p - 1.
                pos = torch.arange(len(a), len(a) + len(b))
                out.append(logp_B_L_V[i, pos - 1, torch.tensor(b, dtype=torch.long)].tolist()
                           if b else [])
        return out
