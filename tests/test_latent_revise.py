"""LatentRevise: the Frank-Wolfe maths by hand, the soft prefix against the model itself, the
cut of a rollout, the recovery command end to end, SFT on its output and GRPO's recovered
rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from es_llm.cli import main
from own_process import run_check
from es_llm.tasks import Problem
from es_llm.errors import BadInput
from gradient.commands.recovery import (ANCHORS, ReviseSettings, prefix_steps, split_rollout,
                                        step_spans)
from gradient.loop.batch import Rollout, RolloutBatch
from es_llm.testbed.standins import ARCHITECTURES
from gradient.maths.latent_revise import (AWAY_TERMS, RevisionProblem, continuation_logp,
                                          frank_wolfe_step, hard_decode, revise, revise_loss)
from soft_prompts import one_hot_soft

ROOT = Path(__file__).resolve().parents[1]


# --- Frank-Wolfe by hand ------------------------------------------------------------------------

def test_frank_wolfe_step_on_a_three_token_vocabulary():
    w = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    grad = torch.tensor([[0.5, -1.0, 0.2], [0.3, 0.1, 0.9]])
    # k = 0: the textbook step size 2/2 = 1 goes all the way to the minimising vertex.
    assert torch.equal(frank_wolfe_step(w, grad, 0), torch.tensor([[0.0, 1.0, 0.0],
                                                                   [0.0, 1.0, 0.0]]))
    # k = 1: gamma = 2/3; row 0 moves toward token 1, row 1 toward token 1 as well.
    got = frank_wolfe_step(w, grad, 1)
    assert torch.allclose(got, torch.tensor([[1 / 3, 2 / 3, 0.0], [0.0, 2 / 3, 1 / 3]]))
    # k = 2 from there, gamma = 1/2, with token 1 not allowed: row 0 goes to token 2 (0.2 <
    # 0.5), row 1 to token 0 (0.3 < 0.9).
    allowed = torch.tensor([True, False, True])
    got2 = frank_wolfe_step(got, grad, 2, allowed)
    assert torch.allclose(got2, torch.tensor([[1 / 6, 1 / 3, 1 / 2], [1 / 2, 1 / 3, 1 / 6]]))
    assert hard_decode(got2) == [2, 0]
    # Ties go to the lower id.
    assert hard_decode(torch.tensor([[0.5, 0.5, 0.0]])) == [0]


def test_iterates_stay_on_the_simplex_after_every_step():
    g = torch.Generator().manual_seed(0)
    w = torch.nn.functional.one_hot(torch.tensor([3, 0, 7, 2]), 9).double()
    allowed = torch.ones(9, dtype=torch.bool)
    allowed[[0, 5]] = False
    for k in range(60):
        w = frank_wolfe_step(w, torch.randn(4, 9, generator=g, dtype=torch.float64), k, allowed)
        assert torch.all(w >= 0)
        assert torch.allclose(w.sum(-1), torch.ones(4, dtype=torch.float64), atol=1e-12)
    # A vertex that is not allowed is never moved toward: row 1 started on token 0, and the
    # first step (size 1) left it there with no weight.
    assert float(w[1, 0]) == 0.0


# --- the soft prefix against the model ----------------------------------------------------------

@pytest.fixture(scope="module")
def ci_model(ci_testbed):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(ci_testbed, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(ci_testbed)


def _logp(model, ids: list[int], start: int) -> float:
    """Summed log-probability of ids[start:] given ids[:start], by ordinary teacher forcing."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return float(sum(lp[t - 1, ids[t]] for t in range(start, len(ids))))


def test_one_hot_soft_prefix_gives_exactly_the_original_logits(ci_model):
    model, tok = ci_model
    prompt = tok("nums 7 3 4 make 25\n").input_ids
    prefix = tok("7*3=21 21+", add_special_tokens=False).input_ids
    E = model.get_input_embeddings().weight
    w = torch.nn.functional.one_hot(torch.tensor(prefix), E.shape[0]).float()
    with torch.no_grad():
        soft = torch.cat([model.get_input_embeddings()(torch.tensor([prompt])), (w @ E)[None]], 1)
        assert torch.equal(model(inputs_embeds=soft).logits,
                           model(torch.tensor([prompt + prefix])).logits)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_embeddings_prefill_at_the_one_hot_start_continues_as_the_token_prefix(arch, standin):
    """The soft-prefix continuation's entry point: prompt + one-hot prefix as embeddings
    (Gemma's scaled embeddings included) gives the greedy ids of the token prompt, in a
    batch whose rows differ in length (left padding) and mix embeddings with token ids."""
    from es_llm.backends.hf import HFBackend
    from es_llm.backends.base import SamplingParams

    hf = HFBackend(str(standin(arch)))
    tok, model = hf.tokenizer, hf.model
    prompts = [tok("nums 7 3 4 make 25\n").input_ids + tok("7*3=21", add_special_tokens=False)
               .input_ids, tok("nums 2 9 make 11\n").input_ids]
    soft = one_hot_soft(model, prompts)
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=12, seed=0, logprobs=True)
    by_ids = hf.generate(prompts, greedy)
    assert [r[0].token_ids for r in hf.generate(soft, greedy)] == [
        r[0].token_ids for r in by_ids]
    assert hf.generate([soft[0], prompts[1]], greedy)[1][0].token_ids == by_ids[1][0].token_ids
    # Off the vertices the model reads the embeddings given, not the tokens they came from.
    noisy = soft[0] + torch.randn(soft[0].shape, generator=torch.Generator().manual_seed(0))
    assert hf.generate([noisy], greedy)[0][0].logprobs != by_ids[0][0].logprobs


@pytest.mark.vllm
def test_vllm_prompt_embeddings_at_the_one_hot_start_continue_as_the_token_prefix(ci_testbed):
    pytest.importorskip("vllm")
    result = run_check("vllm_embeds_check.py", str(ci_testbed), timeout=300)
    assert result == {"equal": [True] * 4, "noisy_differs": [True] * 4}


def test_an_engine_without_prompt_embeddings_refuses_a_soft_prefix():
    from es_llm.backends.vllm_backend import VLLMBackend

    engine = object.__new__(VLLMBackend)  # the check reads one flag, not the engine
    engine.prompt_embeds = False
    assert engine._input([3, 4]) == {"prompt_token_ids": [3, 4]}
    with pytest.raises(BadInput, match="enable_prompt_embeds"):
        engine._input(torch.zeros(2, 8))


def test_loss_pulls_toward_gold_and_pushes_away_from_the_failure(ci_model):
    model, tok = ci_model
    prompt = tok("nums 7 3 4 make 25\n").input_ids
    prefix = tok("7*3=21 ", add_special_tokens=False).input_ids
    gold = tok("21+4=25 <answer>7*3+4</answer>", add_special_tokens=False).input_ids
    fail = tok("21-4=17 <answer>7*3-4</answer>", add_special_tokens=False).input_ids
    E = model.get_input_embeddings().weight
    w = torch.nn.functional.one_hot(torch.tensor(prefix), E.shape[0]).float()
    with torch.no_grad():
        p_emb = model.get_input_embeddings()(torch.tensor([prompt]))
        want_g = _logp(model, prompt + prefix + gold, len(prompt + prefix))
        want_f = _logp(model, prompt + prefix + fail, len(prompt + prefix))
        losses = {}
        for lam in (0.0, 0.5, 2.0):
            loss, g, f = revise_loss(model, p_emb, w, gold, fail, lam)
            assert float(g) == pytest.approx(want_g, rel=1e-5)
            assert float(f) == (pytest.approx(want_f, rel=1e-5) if lam else 0.0)
            assert float(loss) == pytest.approx(-want_g + lam * want_f, rel=1e-5)
            losses[lam] = float(loss)
        # The gold term enters with a minus: at lambda 0 the loss is the gold's negative
        # log-likelihood (> 0). The failed term enters with +lambda: as its log-likelihood is
        # negative, a larger lambda lowers the loss by exactly lambda times it.
        assert losses[0.0] > 0
        assert losses[2.0] - losses[0.5] == pytest.approx(1.5 * want_f, rel=1e-4)
        assert losses[2.0] < losses[0.5] < losses[0.0]
        assert float(continuation_logp(model, p_emb, [])) == 0.0


def test_revision_lowers_its_loss_and_counts_its_token_passes(ci_model):
    model, tok = ci_model
    prompt = tok("nums 7 3 4 make 25\n").input_ids
    problem = RevisionProblem(prompt, tok("7*4=28 ", add_special_tokens=False).input_ids,
                              tok("21+4=25 <answer>7*3+4</answer>",
                                  add_special_tokens=False).input_ids + [tok.eos_token_id],
                              tok("28-3=25", add_special_tokens=False).input_ids)
    allowed = torch.ones(model.get_input_embeddings().weight.shape[0], dtype=torch.bool)
    allowed[tok.all_special_ids] = False
    rev = revise(model, problem, steps=6, lam=0.5, first_step=4, allowed_V=allowed)
    assert len(rev.losses) == 7 and len(rev.prefix_ids) == len(problem.prefix_ids)
    assert torch.allclose(rev.weights_T_V.sum(-1), torch.ones(len(problem.prefix_ids)))
    assert not set(rev.prefix_ids) & set(tok.all_special_ids)
    assert all(p.grad is None for p in model.parameters())
    # Each of the 6 steps reads the context (prompt + prefix) twice, then the gold and the
    # failed continuation, forward (1x) and backward (2x); one more forward pass measures.
    context = len(problem.prompt_ids) + len(problem.prefix_ids)
    per_step = 2 * context + len(problem.gold_ids) + len(problem.fail_ids)
    assert rev.token_passes == (3 * 6 + 1) * per_step
    assert min(rev.losses[1:]) < rev.losses[0]


def test_log_likelihoods_after_the_hard_prefix_are_written_and_match_the_tokens(tiny_qwen2):
    model = tiny_qwen2
    problem = RevisionProblem([1, 5, 9], [12, 30, 7, 44], [3, 17, 2], [40, 41, 2])
    # From k = 0 one step of size 1 lands on a vertex; from k = 6 four steps stay inside.
    one, inside = (revise(model, problem, steps=k, lam=0.5, first_step=k0)
                   for k0, k in ((0, 1), (6, 4)))
    for rev in (one, inside):
        ids = problem.prompt_ids + rev.prefix_ids
        assert rev.hard_gold_logp == pytest.approx(
            _logp(model, ids + problem.gold_ids, len(ids)), rel=1e-5)
        assert rev.hard_fail_logp == pytest.approx(
            _logp(model, ids + problem.fail_ids, len(ids)), rel=1e-5)
    # At the vertex the soft prefix is exactly one-hot: the soft and hard figures agree.
    assert torch.equal(one.weights_T_V, torch.nn.functional.one_hot(
        torch.tensor(one.prefix_ids), 64).float())
    assert one.hard_gold_logp == pytest.approx(one.gold_logp[-1], rel=1e-6)
    assert one.hard_fail_logp == pytest.approx(one.fail_logp[-1], rel=1e-6)
    assert inside.weights_T_V.max() < 1
    # Without the away term the failed continuation is read under neither prefix.
    assert revise(model, problem, steps=1, lam=0.0).hard_fail_logp == 0.0


# --- cutting a rollout ----------------------------------------------------------------------

def _problem(numbers, target, reference) -> Problem:
    return Problem(id="p", prompt=f"nums {' '.join(map(str, numbers))} make {target}\n",
                   gold={"numbers": numbers, "target": target}, difficulty=len(numbers),
                   meta={"reference": reference})


def test_a_rollout_is_cut_through_its_first_rejected_step():
    ref = "7*3=21 21+4=25 <answer>7*3+4</answer>"
    p = _problem([7, 3, 4], 25, ref)
    failed = "7*3=21 21+3=24 <answer>7*3+3</answer>"
    assert [failed[a:b] for a, b in step_spans(failed)] == ["7*3=21", "21+3=24",
                                                            "<answer>7*3+3</answer>"]
    # Step 2 uses the 3 twice: the prefix keeps it so the revision can repair it.
    through = ReviseSettings(cut="first_wrong")
    steps = prefix_steps(failed, p, through)
    assert steps == 2
    assert split_rollout(failed, ref, steps) == ("7*3=21 21+3=24 ", "<answer>7*3+3</answer>",
                                                 "<answer>7*3+4</answer>")
    # A wrong first step: prefix = that step, gold = the reference from its second step.
    wrong = "7*4=28 28-3=25 <answer>7*4-3</answer>"
    assert prefix_steps(wrong, _problem([7, 3, 5], 25, ref), through) == 1
    assert split_rollout(wrong, ref, 1) == ("7*4=28 ", "28-3=25 <answer>7*4-3</answer>",
                                            "21+4=25 <answer>7*3+4</answer>")
    # Fractions of the S steps (the answer counting as one), rounded up, at least one.
    assert prefix_steps(failed, p, ReviseSettings(cut="fraction", cut_fraction=0.5)) == 2
    assert prefix_steps(failed, p, ReviseSettings(cut="fraction", cut_fraction=0.1)) == 1
    assert prefix_steps(failed, p, ReviseSettings(cut="fraction", cut_fraction=1.0)) == 3
    assert split_rollout(failed, ref, 3) == (failed, "", "<answer>7*3+4</answer>")
    assert prefix_steps("   ", p, through) == 0
    # A line before the trace (the verifier reads the last line): its words come first.
    facts = "7*3=21 3+4=7\n" + failed
    assert prefix_steps(facts, p, through) == 4
    assert split_rollout(facts, ref, 4)[0] == "7*3=21 3+4=7\n7*3=21 21+3=24 "


def test_the_cut_before_the_first_wrong_step_keeps_no_rejected_step():
    from es_llm.tasks.countdown_roles import first_wrong_step

    ref = "7*3=21 21+4=25 <answer>7*3+4</answer>"
    before = ReviseSettings(cut="before_first_wrong")
    # Step 2 uses the 3 twice; step 3 of the second trace ends off the target (the verifier
    # labels the last step); the third has a line of facts before its trace.
    for numbers, failed, kept in [
            ([7, 3, 4], "7*3=21 21+3=24 <answer>7*3+3</answer>", "7*3=21 "),
            ([7, 3, 4], "7*3=21 21-4=17 <answer>7*3-4</answer>", "7*3=21 "),
            ([7, 3, 4], "7*3=21 3+4=7\n7*3=21 21+3=24 <answer>7*3+3</answer>",
             "7*3=21 3+4=7\n7*3=21 ")]:
        p = _problem(numbers, 25, ref)
        steps = prefix_steps(failed, p, before)
        assert split_rollout(failed, ref, steps)[0] == kept
        # One step fewer than the cut through the error, which keeps the rejected step.
        assert steps == prefix_steps(failed, p, ReviseSettings(cut="first_wrong")) - 1
        wrong = first_wrong_step(numbers, 25, failed)
        assert len(step_spans(kept.split("\n")[-1])) == wrong - 1
    # A rejected first step is kept all the same (documented): nothing else to revise.
    wrong = "7*4=28 28-3=25 <answer>7*4-3</answer>"
    assert prefix_steps(wrong, _problem([7, 3, 5], 25, ref), before) == 1


def test_the_answer_anchor_holds_only_the_answer_block():
    ref = "7*3=21\n7*3=21 21+4=25 <answer>7*3+4</answer>"
    failed = "7*3=21 21+3=24 <answer>7*3+3</answer>"
    for steps in (1, 2, 3):
        prefix, fail, gold = split_rollout(failed, ref, steps, ANCHORS.get("answer"))
        assert gold == "<answer>7*3+4</answer>"
        assert prefix + fail == failed
    # The spliced tail (the ablation, today's default) teacher-forces the reference's steps.
    assert split_rollout(failed, ref, 1, ANCHORS.get("spliced_tail"))[2] == (
        "7*3=21 21+4=25 <answer>7*3+4</answer>")
    assert ANCHORS.get("answer")("3+4", 1) == "3+4"


def test_unlikelihood_away_term_by_hand():
    lp = torch.log(torch.tensor([0.5, 0.25, 1e-3]))
    got = AWAY_TERMS.get("unlikelihood")(lp)
    want = [-torch.log(torch.tensor(x)).item() for x in (0.5, 0.75, 0.999)]
    assert got.tolist() == pytest.approx(want, rel=1e-5)
    # Bounded: >= 0 everywhere, finite even where the failure is certain (log p = 0).
    assert float(AWAY_TERMS.get("unlikelihood")(torch.tensor(0.0))) == pytest.approx(
        -torch.log(torch.tensor(1e-7)).item(), rel=1e-3)
    assert torch.equal(AWAY_TERMS.get("log")(lp), lp)


@pytest.mark.parametrize("field, value", [("cut", "middle"), ("anchor", "tail"),
                                          ("away", "hinge")])
def test_an_unknown_choice_is_bad_input_naming_the_valid_ones(field, value):
    with pytest.raises(BadInput, match=f"revise.{field}"):
        ReviseSettings(**{field: value})


@pytest.mark.parametrize("override, words", [
    ("revise.steps=0", "at least 1"), ("revise.away_weight=-0.5", ">= 0"),
    ("revise.cut_fraction=1.5", "beyond"), ("revise.cut_fraction=0", "beyond"),
    ("revise.cut=middle", "middle"), ("revise.anchor=tail", "spliced_tail"),
    ("revise.away=hinge", "unlikelihood"), ("search.n=0", "at least 1"),
])
def test_bad_settings_exit_2_before_anything_is_written(override, words, ci_testbed, tmp_path,
                                                       capsys):
    out = tmp_path / "lr"
    assert main(["latent-revise", "--model", str(ci_testbed), "--out", str(out),
                 "--no-progress", override]) == 2
    assert not out.exists()
    assert words in capsys.readouterr().err


def test_a_model_without_a_usable_embedding_matrix_is_refused(ci_diffusion, ci_testbed,
                                                              tmp_path, capsys):
    out = tmp_path / "lr"
    assert main(["latent-revise", "--model", str(ci_diffusion / "diffusion"), "--out",
                 str(out), "--no-progress"]) == 2
    assert "causal LM" in capsys.readouterr().err
    assert main(["latent-revise", "--model", str(ci_testbed), "--task", "arithmetic",
                 "--out", str(out), "--no-progress"]) == 2
    assert "revise.cut=fraction" in capsys.readouterr().err
    assert not out.exists()


# --- resampling at matched token passes ----------------------------------------------------------

def test_break_even_passes_by_hand():
    from gradient.commands.recovery_metrics import break_even_passes

    # p = 0.5 per sample: two samples recover 75% of prompts; 10 passes a sample.
    assert break_even_passes(0.75, 0.5, 10.0) == pytest.approx(20.0)
    assert break_even_passes(0.5, 0.5, 10.0) == pytest.approx(10.0)
    assert break_even_passes(0.0, 0.2, 10.0) == 0.0
    assert break_even_passes(0.3, 0.0, 10.0) is None  # resampling never succeeds
    assert break_even_passes(1.0, 0.5, 10.0) is None  # no finite n reaches certainty


def test_resampling_gets_the_revisions_token_passes_and_none_without_a_revision():
    from types import SimpleNamespace as NS

    from gradient.commands.recovery import LatentReviseConfig, _resample

    class Tokenizer:  # one token per character
        def __call__(self, text):
            return NS(input_ids=list(range(len(text))))

    class Sampler:  # every sample 6 tokens long; only prompt "b" is ever solved
        def __init__(self):
            self.calls = []

        def generate(self, prompts, params, keys):
            self.calls.append((list(prompts), params.n))
            return [[NS(text=f"{p}{k}", token_ids=[0] * 6) for k in range(params.n)]
                    for p in prompts]

    class Task:
        def score_many(self, pairs):
            return [NS(correct=text == "bbbb2") for _, text in pairs]

    problems = [Problem(id=x, prompt=x * 4, gold=0) for x in "abc"]
    outs = [[NS(token_ids=[0] * 6)] * 2] * 3  # a sample costs 4 + 6 = 10 token passes
    sampler = Sampler()
    # a: 0 passes (nothing to revise), b: 34 -> 3 samples, c: 4 -> rounds to none.
    found, spent, tally, _ = _resample(LatentReviseConfig(model="m"), Task(), problems, outs,
                                       [0, 1, 2], {0: 0, 1: 34, 2: 4}, Tokenizer(), sampler)
    assert sampler.calls == [(["bbbb"], 3)]
    assert spent == {0: 0, 1: 30, 2: 0}
    assert tally == {"samples": 3, "correct": 1}
    assert found[0] is None and found[2] is None
    assert found[1]["completion"] == "bbbb2" and found[1]["source"] == "resample"


# --- the command end to end, SFT and GRPO on its output -----------------------------------------

@pytest.fixture(scope="module")
def recovery(ci_testbed, tmp_path_factory):
    out = tmp_path_factory.mktemp("lr") / "run"
    assert main(["latent-revise", "--model", str(ci_testbed), "--out", str(out),
                 "--no-progress", "--limit", "40", "backend=hf", "search.n=8",
                 "revise.steps=4", "revise.first_step=6", "revise.continuations=4",
                 "bootstrap=50"]) == 0
    return out


@pytest.mark.slow
def test_recovery_files_agree_with_each_other_and_the_verifier(recovery, ci_testbed):
    from es_llm.tasks import TaskConfig, build_task

    m = json.loads((recovery / "metrics.json").read_text())
    attempts = [json.loads(x) for x in (recovery / "attempts.jsonl").open()]
    recovered = [json.loads(x) for x in (recovery / "recovered.jsonl").open()]
    resampled = [json.loads(x) for x in (recovery / "resampled.jsonl").open()]
    base = [json.loads(x) for x in (recovery / "base_rollouts.jsonl").open()]
    assert m["problems"] == 40 and m["zero_hit"] == len({a["problem_id"] for a in attempts})
    assert m["zero_hit"] > 5
    # The run's arm is the soft continuation, written with the rollout's original prefix.
    assert m["latent_revise"]["continue_from"] == "soft"
    hits = {a["problem_id"] for a in attempts
            if any(c["correct"] for c in a["soft_continuations"])}
    assert {r["id"] for r in recovered} == hits
    assert m["latent_revise"]["recovered"] == len(hits)
    for arm in ("soft", "hard"):
        conts = [c for a in attempts for c in a[f"{arm}_continuations"]]
        assert len(conts) == 4 * len(attempts) == m["latent_revise"]["arms"][arm][
            "continuations"]
        assert m["latent_revise"]["arms"][arm]["per_sample_rate"] == pytest.approx(
            sum(c["correct"] for c in conts) / len(conts))
        # A hard continuation is judged with the tokens it followed, a soft one with the
        # original prefix (revise.train_prefix).
        key = "correct_original" if arm == "soft" else "correct_hard"
        assert all(c["correct"] == c[key] for c in conts)
    hard_hits = {a["problem_id"] for a in attempts
                 if any(c["correct"] for c in a["hard_continuations"])}
    assert m["latent_revise"]["arms"]["hard"]["recovered"] == len(hard_hits)
    assert m["resample"]["recovered"] == len(resampled)
    assert len(base) == min(len(recovered), 40 - m["zero_hit"])
    assert not {r["id"] for r in base} & {a["problem_id"] for a in attempts}
    rate = m["latent_revise"]["recovery_rate"]["value"]
    assert rate == pytest.approx(len(hits) / m["zero_hit"])
    # Every written trajectory passes the verifier; a recovered one starts with its revised
    # prefix; each arm's cost is what its rows say.
    task = build_task(TaskConfig(name="countdown", data=str(ci_testbed / "data" /
                                                            "countdown_rl.jsonl")))
    by_id = {p.id: p for p in task.problems()}
    rows = recovered + resampled + base
    assert all(s.correct for s in task.score_many([(by_id[r["id"]], r["completion"])
                                                   for r in rows]))
    task.close()
    prefixes = {a["problem_id"]: a["prefix"] for a in attempts}
    for r in recovered:
        assert r["completion"].startswith(r["prefix"]) and r["prefix"] == prefixes[r["id"]]
    # The verdict reads the answer alone; how many written traces also check step by step.
    from es_llm.tasks.countdown_roles import first_wrong_step
    checked = [first_wrong_step(r["numbers"], r["target"], r["completion"]) is None
               for r in resampled]
    assert m["resample"]["checked_steps_share"] == pytest.approx(sum(checked) / len(checked))
    # Both log-likelihoods after the hard prefix are written beside the soft ones.
    hard_gain = [a["hard_gold_logp"] - a["gold_logp"][0] for a in attempts]
    assert m["latent_revise"]["hard_gold_logp_gain_mean"] == pytest.approx(
        sum(hard_gain) / len(hard_gain))
    assert all("hard_fail_logp" in a for a in attempts)
    spent = sum(a["revision_passes"] + a["soft_passes"] for a in attempts)
    assert m["latent_revise"]["token_passes_mean"] == pytest.approx(spent / m["zero_hit"])
    report = (recovery / "report.md").read_text()
    assert f"| LatentRevise, soft continuation (the run's) | {len(hits)} |" in report
    assert f"| LatentRevise, hard continuation | {len(hard_hits)} |" in report
    assert f"| plain resampling | {len(resampled)} |" in report


@pytest.mark.slow
def test_sft_on_trajectories_raises_their_likelihood(recovery, ci_testbed, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = recovery / "resampled.jsonl"
    rows = [json.loads(x) for x in data.open()]
    assert len(rows) >= 4
    out = tmp_path / "sft"
    assert main(["sft", "--config", str(ROOT / "configs" / "sft_countdown.yaml"), "--out",
                 str(out), "--no-progress", f"model={ci_testbed}", f"data={data}", "epochs=4",
                 "optim.lr=1e-3"]) == 0
    tok = AutoTokenizer.from_pretrained(ci_testbed)

    def nll(folder) -> float:
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        return -sum(_logp(model, tok(r["prompt"]).input_ids + tok(
            r["completion"], add_special_tokens=False).input_ids + [tok.eos_token_id],
            len(tok(r["prompt"]).input_ids)) for r in rows)

    assert nll(out / "checkpoints" / "final") < 0.8 * nll(ci_testbed)
    steps = [json.loads(x) for x in (out / "metrics.jsonl").open()]
    assert len(steps) == 4 * -(-len(rows) // 16)
    assert (out / "checkpoints" / "final" / "data" / "countdown_eval.jsonl").is_file()


def test_sft_refuses_a_bad_data_file(ci_testbed, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "nums 1 2 make 3\\n", "completion": "1+2=3"}\n{"prompt": 3}\n')
    out = tmp_path / "sft"
    assert main(["sft", "--model", str(ci_testbed), "--data", str(bad), "--out", str(out),
                 "--no-progress"]) == 2
    assert "line 2" in capsys.readouterr().err and not out.exists()


def _rollout(problem, reward, group, correct=False):
    return Rollout(prompt_ids=[1, 5], completion_ids=[6, 2], engine_logp=[-0.1, -0.2],
                   reward=reward, correct=correct, problem=problem, group=group)


def test_recovered_row_joins_only_a_group_without_success_with_its_advantages_by_hand():
    from dataclasses import replace
    from types import SimpleNamespace

    from gradient.config import GRPORunConfig, RecoveredSettings
    from gradient.loop.birth_stages import StageInput, recovered_rows
    from gradient.loop.plan import plan

    a, b = (Problem(id=i, prompt="x", gold=None, difficulty=0) for i in ("a", "b"))
    batch = RolloutBatch.of([_rollout(a, 0.0, 0) for _ in range(4)]
                            + [_rollout(b, 1.0, 1, True)] + [_rollout(b, 0.0, 1)] * 3)
    cfg = GRPORunConfig(model="m")
    edges = SimpleNamespace(recovered={"a": ([1, 5], [7, 8, 2], 1.0), "b": ([1, 5], [9, 2], 1.0)})
    out, m = recovered_rows(StageInput(edges, cfg, SimpleNamespace(step=0)), batch)
    assert len(out) == 9 and m == {"recovered/rows": 1.0, "recovered/zero_hit_groups": 1.0}
    # Group a: rewards 0,0,0,0,1: mean 0.2, Bessel std sqrt(0.8 / 4); b is untouched.
    std = (0.8 / 4) ** 0.5
    assert [r.adv for r in out[:5]] == pytest.approx([-0.2 / std] * 4 + [0.8 / std], rel=1e-5)
    extra = out[4]
    assert extra.correct and extra.engine_logp is None
    assert extra.completion_ids == [7, 8, 2] and extra.group == 0 and extra.problem is a
    assert [r.adv for r in out[5:]] == [0.0] * 4
    # The plan has the stage only when the run names a recovered set.
    edges = SimpleNamespace(teachers={}, ref_model=None)
    named = GRPORunConfig(model="m", algo=replace(cfg.algo, recovered=RecoveredSettings("f")))
    assert "recovered_rows" in plan(named, edges).birth
    assert "recovered_rows" not in plan(cfg, edges).birth


@pytest.mark.slow
def test_grpo_trains_on_recovered_rows(recovery, ci_testbed, tmp_path):
    out = tmp_path / "grpo"
    data = recovery / "resampled.jsonl"
    assert main(["grpo", "--config", str(ROOT / "configs" / "grpo_latent_revise_countdown.yaml"),
                 "--out", str(out), "--no-progress", f"model={ci_testbed}",
                 f"algo.recovered.data={data}", "task.limit=40", "steps=3", "backend=hf",
                 "rollout.prompts_per_step=8", "rollout.group_size=4",
                 "rollout.max_tokens=32"]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").open()]
    assert sum(r["recovered/rows"] for r in rows) > 0
    assert all(r["recovered/rows"] <= r["recovered/zero_hit_groups"] for r in rows)


def test_grpo_refuses_a_recovered_file_the_verifier_rejects(ci_testbed, tmp_path, capsys):
    rl = [json.loads(x) for x in (ci_testbed / "data" / "countdown_rl.jsonl").open()]
    bad = tmp_path / "recovered.jsonl"
    bad.write_text(json.dumps({**rl[0], "completion": "<answer>1+1</answer>"}) + "\n")
    out = tmp_path / "grpo"
    assert main(["grpo", "--config", str(ROOT / "configs" / "grpo_latent_revise_countdown.yaml"),
                 "--out", str(out), "--no-progress", f"model={ci_testbed}", "backend=hf",
                 f"algo.recovered.data={bad}"]) == 2
    assert "fail the task's verifier" in capsys.readouterr().err and not out.exists()
    assert main(["grpo", "--config", str(ROOT / "configs" / "grpo_latent_revise_countdown.yaml"),
                 "--out", str(out), "--no-progress", f"model={ci_testbed}", "backend=hf",
                 f"algo.recovered.data={bad}", "algo.dynamic_sampling.enabled=true"]) == 2
    assert "dynamic sampling drops" in capsys.readouterr().err and not out.exists()
