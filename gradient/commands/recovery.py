"""``es-llm latent-revise``: find a model's zero-hit prompts, revise failed rollouts of each
with LatentRevise (``gradient.maths.latent_revise``), continue from the revised prefixes, and
write the verified trajectories as a training data file, beside plain resampling at the same
cost.

1. **Search.** ``search.n`` (k) samples per training prompt; a prompt none of them
   solves is zero-hit.
2. **Revise.** For each zero-hit prompt, its first ``revise.rollouts_per_prompt`` failed
   samples that have a step are cut into prefix, failed continuation and gold continuation
   (``split_rollout``: the registered cut ``revise.cut`` and anchor ``revise.anchor``; the
   defaults are the source's, ``before_first_wrong`` and ``answer``) and revised by
   ``revise.steps`` Frank-Wolfe steps.
3. **Continue**, in two arms from every revision (``ARMS``), ``revise.continuations``
   samples each: ``soft``, from the revised soft prefix itself, prefilled as input
   embeddings (the source's; vLLM's prompt embeddings or the transformers prefill), and
   ``hard``, from its argmax tokens (the ablation). A hard
   continuation is judged by the task's verifier as hard prefix + continuation; a soft one
   has no prefix text, so it is judged with both the rollout's original prefix and the hard
   prefix, and written with ``revise.train_prefix``'s. A prompt is recovered in an arm when
   one of its continuations is accepted; ``revise.continue_from`` picks the arm whose
   recoveries are the training data.
4. **Resample.** The same prompts get plain samples, as many as cost the same token passes
   as the prompt's revision and the chosen arm's continuations (forward tokens, backward at
   twice that; see ``gradient.maths.latent_revise``); a prompt is recovered when one of them
   is correct.

Writes ``recovered.jsonl`` (one verified trajectory per recovered prompt: the problem's
record plus ``completion``, a task data file and an SFT file at once), ``resampled.jsonl``
(the resampling arm's first correct sample per prompt), ``base_rollouts.jsonl`` (as many
correct search samples of other prompts as were recovered, one per prompt: the SFT control
"the same number of base-model rollouts"), ``attempts.jsonl`` (every revision and both arms'
continuations), and ``metrics.json``, ``report.md`` and ``report.html``
(``gradient.commands.recovery_metrics``: each arm's recovery with a 95% bootstrap interval
over the zero-hit prompts, its per-sample rate, paired difference to resampling and
break-even, token passes and seconds).

A prompt whose failed samples have no step at all (an empty completion) cannot be cut and
counts as not recovered by LatentRevise.
"""

from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from es_llm.backends import (BACKEND_NAMES, BackendSpec, check_device, choose_backend,
                             make_backend)
from es_llm.backends.base import SamplingParams
from es_llm.backends.diffusion import is_diffusion_model
from es_llm.config import check_choices, choice, run_config_yaml
from es_llm.errors import BadInput
from es_llm.evaluate import SamplingConfig
from es_llm.io import write_json_atomic, write_jsonl_atomic, write_text_atomic
from es_llm.models import check_model_path, resolve_training_data
from es_llm.report import write_report
from es_llm.run_folder import check_out_path
from es_llm.runtime import Runtime
from es_llm.tasks import TaskConfig, build_task
from es_llm.tasks.chat import render_prompts
from es_llm.testbed.train import record
from gradient.commands.recovery_metrics import arm_cost, recovery_metrics, report_blocks
from gradient.loop.seeds import derive_seed
from gradient.maths.latent_revise import (AWAY_TERMS, RevisionProblem, revise,
                                          soft_embeddings)
from populations.registry import Registry

# A cut: (the rollout's step spans, its text, the problem, the settings) -> steps kept.
CUTS: Registry[Callable[[list, str, Any, "ReviseSettings"], int]] = Registry("revise cut")
# Cuts that read the Countdown verifier's label of each step.
VERIFIER_CUTS = ("first_wrong", "before_first_wrong")
# An anchor: (the reference solution, the prefix's step count) -> the gold continuation.
ANCHORS: Registry[Callable[[str, int], str]] = Registry("revise anchor")
# Where a revision's continuations start: (the attempt row, the prompt's ids, the prompt's
# and the soft prefix's input embeddings (L, D)) -> the sampler's prompt.
ARMS: Registry[Callable[[dict, list[int], torch.Tensor], Any]] = Registry("revise arm")
# The prefix a soft continuation's trajectory is written with: the attempt row's field.
TRAIN_PREFIXES = {"original": "prefix", "hard": "revised_prefix"}
_SPAN_RE = re.compile(r"\S+")


@dataclass(frozen=True)
class ReviseSettings:
    # Frank-Wolfe steps per failed rollout (K), the model frozen.
    steps: int = 10
    # lambda: weight of the away term (revise.away) of the failed continuation, which the
    # loss lowers.
    away_weight: float = 0.1
    # Index of the first step of the 2/(k+2) schedule (0: the textbook schedule, whose first
    # step goes all the way to a vertex; larger keeps more of the rollout's own prefix). 8
    # and lambda 0.1 were chosen on the default testbed (docs/benchmarks.md, "LatentRevise").
    first_step: int = 8
    # Where the prefix ends: before_first_wrong (Countdown: the steps before the first one
    # the verifier rejects, at least one: the source's cut before the error), first_wrong
    # (through that step, keeping the error for the revision to repair: the ablation the
    # first recorded figures used) or fraction (the first ceil(cut_fraction x S) of the
    # rollout's S steps, the answer counting as one).
    cut: str = choice("before_first_wrong", lambda: CUTS.names())
    # The share of the rollout's steps that revise.cut=fraction keeps.
    cut_fraction: float = 0.5
    # What the revision pulls toward: answer (the reference's answer block and EOS: the
    # source's gold-answer anchor) or spliced_tail (the reference's steps after the prefix's
    # step count, then its answer: teacher forcing toward the reference's own steps; the
    # ablation the first recorded figures used).
    anchor: str = choice("answer", lambda: ANCHORS.names())
    # The push away from the failed continuation, weighted by away_weight: log (+lambda log
    # p(fail), unbounded below; the default) or unlikelihood (-lambda log(1 - p(fail)) of
    # the whole continuation: >= 0, zero once the failure is impossible).
    away: str = choice("log", lambda: AWAY_TERMS.names())
    # Which arm's recoveries are the run's training data and its headline: soft (sampled
    # after the revised soft prefix itself, prefilled as input embeddings: the source's) or
    # hard (after its argmax tokens: the ablation). Both arms run from every revision.
    continue_from: str = choice("soft", lambda: ARMS.names())
    # The text a soft continuation's trajectory is written and verified with, since the soft
    # prefix has none: original (the rollout's own prefix, which the cut keeps) or hard (the
    # argmax tokens of the revised prefix). Both verdicts are written.
    train_prefix: str = choice("original", lambda: sorted(TRAIN_PREFIXES))
    # Failed rollouts revised per zero-hit prompt, and continuations sampled from each
    # revised prefix in each arm.
    rollouts_per_prompt: int = 1
    continuations: int = 4

    def __post_init__(self):
        check_choices(self, "revise.")
        if self.steps < 1:
            raise BadInput(f"revise.steps (K, Frank-Wolfe steps) must be at least 1, got "
                           f"{self.steps}.")
        if not (self.away_weight >= 0 and math.isfinite(self.away_weight)):
            raise BadInput(f"revise.away_weight (lambda) must be a finite number >= 0 (0 = only "
                           f"pull toward the gold answer), got {self.away_weight}.")
        if not 0 < self.cut_fraction <= 1:
            raise BadInput(f"revise.cut_fraction must lie in (0, 1]: a cut beyond the rollout's "
                           f"last step (or before its first) leaves nothing to revise; got "
                           f"{self.cut_fraction}.")
        if self.first_step < 0 or self.rollouts_per_prompt < 1 or self.continuations < 1:
            raise BadInput("revise.first_step must be >= 0, and revise.rollouts_per_prompt and "
                           "revise.continuations at least 1.")


@dataclass(frozen=True)
class LatentReviseConfig:
    # The model (a causal LM whose input embedding matrix spans its vocabulary).
    model: str = ""
    # Training prompts with reference solutions; without data, a testbed model's
    # data/<task>_rl.jsonl.
    task: TaskConfig = field(default_factory=lambda: TaskConfig(name="countdown"))
    # Sampler of the search, continuations and resamples: auto (vLLM when installed), hf or
    # vllm; the revision itself always runs in transformers.
    backend: str = choice("auto", lambda: BACKEND_NAMES)
    # Device and precision of the revision and the samplers: the model stays float32 and
    # the revision's passes and the HF sampler compute in runtime.dtype under autocast.
    runtime: Runtime = field(default_factory=Runtime)
    # Bootstrap resamples over zero-hit prompts for the 95% intervals.
    bootstrap: int = 1000
    # The search's samples per prompt (k: a prompt none of them solves is zero-hit), their
    # temperature, nucleus and length, which continuations and resamples share; its seed
    # seeds every sampling stream of the run and the bootstrap.
    search: SamplingConfig = field(default_factory=lambda: SamplingConfig(n=16))
    revise: ReviseSettings = field(default_factory=ReviseSettings)

    def __post_init__(self):
        check_choices(self)
        if self.bootstrap < 10:
            raise BadInput(f"bootstrap must be at least 10 resamples, got {self.bootstrap}.")


# --- cutting a rollout (pure) -------------------------------------------------------------------

def step_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of a trajectory's steps (words before ``<answer>``) and its answer
    block (``<answer>`` to the end)."""
    cut = text.find("<answer>")
    body = text if cut < 0 else text[:cut]
    spans = [(m.start(), m.end()) for m in _SPAN_RE.finditer(body)]
    if cut >= 0:
        spans.append((cut, len(text)))
    return spans


def prefix_steps(completion: str, problem, settings: ReviseSettings) -> int:
    """How many of the rollout's steps the prefix keeps (>= 1; 0 when it has none), by the
    registered cut ``settings.cut``."""
    spans = step_spans(completion)
    return CUTS.get(settings.cut)(spans, completion, problem, settings) if spans else 0


def _first_wrong_span(spans, completion: str, problem) -> int | None:
    """The 1-based index among ``spans`` of the first step the Countdown verifier rejects
    (None when it rejects none)."""
    from es_llm.tasks.countdown_roles import first_wrong_step, trace_part

    wrong = first_wrong_step(problem.gold["numbers"], problem.gold["target"], completion)
    if wrong is None:
        return None
    # The verifier numbers the words of the last line only (trace_part); the spans count
    # every word, so the earlier lines' words come first.
    start = completion.rfind(trace_part(completion).strip("\n"))
    return min(len(spans), sum(1 for s, _ in spans if s < start) + wrong)


@CUTS.register("fraction")
def _cut_fraction(spans, completion, problem, settings) -> int:
    return min(len(spans), max(1, math.ceil(settings.cut_fraction * len(spans))))


@CUTS.register("first_wrong")
def _cut_through_first_wrong(spans, completion, problem, settings) -> int:
    """Through the first rejected step: the prefix holds the error (the ablation)."""
    wrong = _first_wrong_span(spans, completion, problem)
    return len(spans) if wrong is None else wrong


@CUTS.register("before_first_wrong")
def _cut_before_first_wrong(spans, completion, problem, settings) -> int:
    """The steps before the first rejected one (the source's cut before the error). A trace
    whose first step is rejected keeps that step all the same: an empty prefix leaves
    nothing to revise."""
    wrong = _first_wrong_span(spans, completion, problem)
    return len(spans) if wrong is None else max(1, wrong - 1)


@ANCHORS.register("spliced_tail")
def spliced_tail(reference: str, steps: int) -> str:
    """The reference after its first ``steps`` steps (at least its answer block): the gold
    continuation as if the reference had written the rollout's prefix (the ablation)."""
    ref = step_spans(reference)
    return reference[ref[min(steps, len(ref) - 1)][0] if ref else 0:]


@ANCHORS.register("answer")
def answer_block(reference: str, steps: int) -> str:
    """The reference's answer block alone (``<answer>`` to the end; the whole reference when
    it has none): the source's gold-answer anchor, whatever steps lead there."""
    return reference[max(reference.find("<answer>"), 0):]


def split_rollout(completion: str, reference: str, steps: int,
                  anchor: Callable[[str, int], str] = spliced_tail) -> tuple[str, str, str]:
    """``(prefix, failed continuation, gold continuation)``: the rollout through its first
    ``steps`` steps, the rest of it, and the anchor's text of the reference."""
    spans = step_spans(completion)
    at = spans[steps][0] if steps < len(spans) else len(completion)
    return completion[:at], completion[at:], anchor(reference, steps)


# --- the command --------------------------------------------------------------------------------

def _check(cfg: LatentReviseConfig):
    """The task, its problems and the revision model, after every input check."""
    check_model_path(cfg.model)
    if is_diffusion_model(cfg.model):
        raise BadInput(f"{cfg.model} is a masked-diffusion model; LatentRevise revises the "
                       f"input embeddings of a causal LM's prefix, so give a causal LM folder.")
    if cfg.revise.cut in VERIFIER_CUTS and cfg.task.name != "countdown":
        raise BadInput(f"revise.cut={cfg.revise.cut} reads Countdown steps; task "
                       f"{cfg.task.name!r} needs revise.cut=fraction.")
    check_device(cfg.runtime.device)
    choose_backend(cfg.backend, cfg.model)
    cfg = resolve_training_data(cfg)
    task = build_task(cfg.task)
    problems = task.problems()
    missing = [p.id for p in problems if not p.meta.get("reference")]
    if not problems or missing:
        task.close()
        raise BadInput(f"LatentRevise needs training problems with reference solutions (the "
                       f"gold continuation); {len(missing)} of {len(problems)} problems of "
                       f"{cfg.task.data!r} have none. Use a file with a 'reference' field "
                       f"(a testbed's data/*_rl.jsonl).")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    problems = render_prompts(problems, tokenizer, cfg.task.chat, cfg.model)
    model = AutoModelForCausalLM.from_pretrained(
        cfg.model, dtype=torch.float32, **cfg.runtime.attention_kwargs()).to(cfg.runtime.device)
    embed = model.get_input_embeddings()
    if not isinstance(embed, torch.nn.Embedding) or embed.weight.shape[0] < len(tokenizer):
        task.close()
        raise BadInput(f"{cfg.model} has no input embedding matrix with a row per token of its "
                       f"tokenizer ({len(tokenizer)} tokens), which the simplex over the "
                       f"vocabulary needs.")
    return cfg, task, problems, model.eval(), tokenizer


def _sampler(cfg: LatentReviseConfig, model, tokenizer):
    """The run's sampler; a vLLM engine is built to take prompt embeddings (the soft arm's
    prefill), which transformers always takes."""
    return make_backend(BackendSpec(cfg.model, backend=cfg.backend, runtime=cfg.runtime,
                                    seed=cfg.search.seed, model=model, tokenizer=tokenizer,
                                    engine_args={"enable_prompt_embeds": True}))


def _allowed(tokenizer, vocab: int, device) -> torch.Tensor:
    """The vertices a revised position may take: ordinary tokens, never a special one."""
    allowed = torch.zeros(vocab, dtype=torch.bool, device=device)
    allowed[:len(tokenizer)] = True
    allowed[torch.tensor(tokenizer.all_special_ids, device=device)] = False
    return allowed


def _params(search: SamplingConfig, n: int, stream: str) -> SamplingParams:
    """The search's sampling settings with ``n`` samples per prompt on a stream of its own."""
    return replace(search.params(), n=n, seed=derive_seed(search.seed, stream))


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def latent_revise(cfg: LatentReviseConfig, out: str | Path, progress: bool = True, echo=print,
                  on_folder=None) -> dict:
    """The whole of ``es-llm latent-revise``; returns the metrics it writes."""
    out = check_out_path(out)
    cfg, task, problems, model, tokenizer = _check(cfg)
    sampler = _sampler(cfg, model, tokenizer)
    s = cfg.search
    try:
        # Float32 weights; the revision's passes and the HF sampler compute in runtime.dtype.
        with cfg.runtime.autocast():
            t0 = time.perf_counter()
            params = _params(s, s.n, "search")
            outs = sampler.generate([p.prompt for p in problems], params, progress=progress,
                                    keys=[p.id for p in problems])
            scores = task.score_many([(p, c.text) for p, row in zip(problems, outs)
                                      for c in row])
            correct = np.array([sc.correct for sc in scores]).reshape(len(problems), s.n)
            zero = [i for i in range(len(problems)) if not correct[i].any()]
            echo(f"{len(zero)} of {len(problems)} prompts are zero-hit in {s.n} samples")
            seconds = {"search_s": time.perf_counter() - t0}
            attempts, soft, revise_cost, seconds["revision_s"] = _revise_all(
                cfg, task, problems, outs, zero, model, tokenizer, progress)
            for arm in ARMS.names():
                seconds[f"{arm}_s"] = _continue(cfg, task, problems, attempts, soft, sampler,
                                                arm)
            # Resampling gets the token passes of the revision and the chosen arm.
            budget = arm_cost(attempts, revise_cost, cfg.revise.continue_from)
            resampled, rs_cost, rs_tally, seconds["resample_s"] = _resample(
                cfg, task, problems, outs, zero, budget, tokenizer, sampler)
    finally:
        sampler.close()
        task.close()
    for a in attempts:
        del a["prompt_ids"]
    recovered = _recovered_rows(problems, attempts, cfg.revise.continue_from)
    base = _base_rollouts(cfg, problems, outs, correct, zero, len(recovered))
    metrics = recovery_metrics(cfg, ARMS.names(), problems, zero, attempts, recovered, resampled,
                               revise_cost, rs_cost, rs_tally, seconds, len(base))
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "config.yaml", run_config_yaml(cfg))
    write_jsonl_atomic(out / "attempts.jsonl", attempts)
    write_jsonl_atomic(out / "recovered.jsonl", recovered)
    write_jsonl_atomic(out / "resampled.jsonl", [row for row in resampled.values() if row])
    write_jsonl_atomic(out / "base_rollouts.jsonl", base)
    write_json_atomic(out / "metrics.json", metrics)
    text = write_report(out, report_blocks(metrics))
    if on_folder is not None:
        on_folder(out)
    echo(text.rstrip())
    return metrics


def _revise_all(cfg, task, problems, outs, zero, model, tokenizer, progress):
    """Every revision: the attempt rows, each one's prompt and soft prefix as input
    embeddings ``(L, D)``, each zero-hit prompt's revision token passes, and the seconds."""
    r = cfg.revise
    t0 = time.perf_counter()
    embed = model.get_input_embeddings()
    allowed = _allowed(tokenizer, embed.weight.shape[0], cfg.runtime.device)
    attempts, soft, cost = [], [], {i: 0 for i in zero}
    for i in tqdm(zero, desc="revise", unit="prompt", disable=not progress):
        p = problems[i]
        prompt_ids = list(tokenizer(p.prompt).input_ids)
        failed = [c.text for c in outs[i] if step_spans(c.text)][:r.rollouts_per_prompt]
        for j, text in enumerate(failed):
            steps = prefix_steps(text, p, r)
            prefix, fail, gold = split_rollout(text, p.meta["reference"], steps,
                                               ANCHORS.get(r.anchor))
            eos = [tokenizer.eos_token_id]
            rp = RevisionProblem(prompt_ids, _ids(tokenizer, prefix), _ids(tokenizer, gold) + eos,
                                 _ids(tokenizer, fail) + eos)
            rev = revise(model, rp, r.steps, r.away_weight, r.first_step, allowed,
                         AWAY_TERMS.get(r.away))
            with torch.no_grad():
                soft.append(torch.cat([embed(torch.tensor(prompt_ids, device=embed.weight.device)),
                                       soft_embeddings(model, rev.weights_T_V)]))
            cost[i] += rev.token_passes
            attempts.append({"problem_id": p.id, "index": i, "rollout": j, "failed": text,
                             "prefix_steps": steps, "prefix": prefix,
                             "revised_prefix": tokenizer.decode(rev.prefix_ids),
                             "revised_ids": rev.prefix_ids, "prompt_ids": prompt_ids,
                             "changed_tokens": sum(a != b for a, b in
                                                   zip(rp.prefix_ids, rev.prefix_ids)),
                             "prefix_tokens": len(rp.prefix_ids), "loss": rev.losses,
                             "gold_logp": rev.gold_logp, "fail_logp": rev.fail_logp,
                             "hard_gold_logp": rev.hard_gold_logp,
                             "hard_fail_logp": rev.hard_fail_logp,
                             "revision_passes": rev.token_passes})
    return attempts, soft, cost, time.perf_counter() - t0


@ARMS.register("soft")
def _from_soft_prefix(attempt: dict, prompt_ids: list[int], soft_L_D: torch.Tensor):
    """The prompt's and the revised soft prefix's embeddings: the source's continuation."""
    return soft_L_D


@ARMS.register("hard")
def _from_hard_prefix(attempt: dict, prompt_ids: list[int], soft_L_D: torch.Tensor):
    """The prompt's and the hard-decoded prefix's token ids: the ablation."""
    return prompt_ids + attempt["revised_ids"]


def _continue(cfg, task, problems, attempts, soft, sampler, arm: str) -> float:
    """``revise.continuations`` samples after every revision in ``arm``, written into each
    attempt row as ``<arm>_continuations`` with the verdict on every prefix text the arm
    can write its trajectory with (``correct_<text>``; ``correct``: the one it does write)
    and as ``<arm>_passes`` (prompt and prefix plus continuation, per sample); the
    seconds."""
    t0 = time.perf_counter()
    r = cfg.revise
    texts = sorted(TRAIN_PREFIXES)
    # A hard continuation was sampled after the argmax tokens, so its trajectory is written
    # with them; a soft one's prefix has no text and the setting picks one.
    written = {"soft": r.train_prefix, "hard": "hard"}[arm]
    params = _params(cfg.search, r.continuations, f"continue-{arm}")
    prompts = [ARMS.get(arm)(a, a["prompt_ids"], e) for a, e in zip(attempts, soft)]
    rows = sampler.generate(prompts, params, keys=[f"{a['problem_id']}:{a['rollout']}"
                                                   for a in attempts]) if attempts else []
    pairs = [(problems[a["index"]], a[TRAIN_PREFIXES[t]] + c.text)
             for a, row in zip(attempts, rows) for c in row for t in texts]
    verdicts = iter(task.score_many(pairs)) if pairs else iter(())
    context = [len(a["prompt_ids"]) + len(a["revised_ids"]) for a in attempts]
    for a, n, row in zip(attempts, context, rows):
        conts = []
        for c in row:
            ok = {f"correct_{t}": next(verdicts).correct for t in texts}
            conts.append({"text": c.text, "tokens": len(c.token_ids), **ok,
                          "written": written,
                          "correct": ok[f"correct_{written}"]})
        a[f"{arm}_continuations"] = conts
        a[f"{arm}_passes"] = sum(n + len(c.token_ids) for c in row)
    return time.perf_counter() - t0


def _resample(cfg, task, problems, outs, zero, budget, tokenizer, sampler):
    """Plain samples of each zero-hit prompt at its revision's token passes: the first correct
    one per prompt (None if none), each prompt's passes spent, the samples drawn and how many
    of them the verifier accepted, and the seconds. The sample
    count is the budget over a sample's passes, rounded to the nearest, so a prompt whose
    revision cost under half a sample (none of its rollouts had a step to cut) gets none."""
    t0 = time.perf_counter()
    draws: dict[int, list[int]] = {}
    for i in zero:
        plen = len(tokenizer(problems[i].prompt).input_ids)
        mean_len = np.mean([len(c.token_ids) for c in outs[i]])
        draws.setdefault(round(budget[i] / (plen + mean_len)), []).append(i)
    draws.pop(0, None)
    found: dict[int, dict | None] = {i: None for i in zero}
    spent = {i: 0 for i in zero}
    tally = {"samples": 0, "correct": 0}
    for n, idx in sorted(draws.items()):
        params = _params(cfg.search, n, "resample")
        rows = sampler.generate([problems[i].prompt for i in idx], params,
                                keys=[problems[i].id for i in idx])
        verdicts = iter(task.score_many([(problems[i], c.text)
                                         for i, row in zip(idx, rows) for c in row]))
        for i, row in zip(idx, rows):
            plen = len(tokenizer(problems[i].prompt).input_ids)
            for c in row:
                spent[i] += plen + len(c.token_ids)
                ok = next(verdicts).correct
                tally["samples"] += 1
                tally["correct"] += ok
                if ok and found[i] is None:
                    found[i] = {**record(problems[i]), "completion": c.text,
                                "source": "resample"}
    return found, spent, tally, time.perf_counter() - t0


def _recovered_rows(problems, attempts, arm: str) -> list[dict]:
    """One verified trajectory per prompt ``arm`` recovered: the prefix its continuation is
    written with (the hard prefix, or for a soft continuation ``revise.train_prefix``'s)
    plus the continuation, which the verifier accepted as that text."""
    rows, done = [], set()
    for a in attempts:
        for c in a[f"{arm}_continuations"]:
            if c["correct"] and a["index"] not in done:
                done.add(a["index"])
                prefix = a[TRAIN_PREFIXES[c["written"]]]
                rows.append({**record(problems[a["index"]]), "completion": prefix + c["text"],
                             "source": f"latent_revise_{arm}", "prefix": prefix})
    return rows


def _base_rollouts(cfg, problems, outs, correct, zero, count: int) -> list[dict]:
    """``count`` correct search samples, one per prompt, of prompts that were not zero-hit
    (a seeded choice of prompts and of the sample)."""
    rng = random.Random(f"{cfg.search.seed}:base-rollouts")
    solved = [i for i in range(len(problems)) if i not in set(zero)]
    rng.shuffle(solved)
    rows = []
    for i in solved[:count]:
        k = rng.choice(np.flatnonzero(correct[i]).tolist())
        rows.append({**record(problems[i]), "completion": outs[i][k].text, "source": "base"})
    return rows
