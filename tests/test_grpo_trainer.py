"""The GRPO trainer end to end on the ci testbed: the run folder, the reward rising with both
backends, exact resume, micro-batch invariance of the gradient, distillation, and bad input
(every shipped variant config: tests/test_configs_bitwise.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from es_llm.cli import main
from es_llm.config import load_config
from es_llm.io import read_jsonl
from es_llm.models import resolve_training_data
from gradient.config import GRPORunConfig

ROOT = Path(__file__).resolve().parents[1]
CI_CONFIG = ROOT / "configs" / "grpo_countdown_ci.yaml"
OPD_CONFIGS = ["opd_countdown.yaml", "opd_countdown_ci.yaml", "opd_ra_countdown.yaml",
               "opd_rstg_countdown.yaml", "opd_w2s_countdown.yaml", "opd_drift_countdown.yaml",
               "opd_dear_countdown.yaml", "opd_avsd_countdown.yaml", "opd_gjsd_countdown.yaml"]


def grpo_cli(*args, timeout=900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "es_llm", "grpo", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def test_ci_run_writes_the_run_folder(ci_testbed, tmp_path):
    out = tmp_path / "run"
    assert main(["grpo", "--config", str(CI_CONFIG), "--out", str(out), "--no-progress",
                 f"model={ci_testbed}"]) == 0
    cfg = load_config(GRPORunConfig, path=out / "config.yaml")
    assert cfg.steps == 4 and cfg.rollout.group_size == 4
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for key in ("grad/loss", "grad/clipfrac", "grad/kl", "grad/entropy", "grad/grad_norm",
                "reward/mean", "reward/frac_zero_std", "perf/step_s", "perf/gen_s",
                "samples/generated", "is/logp_abs_diff_mean"):
        assert key in rows[-1], key
    assert rows[-1]["samples/generated"] == 4 * 8 * 4
    # Every rollout's tokens: the mean length times the step's 8 x 4 rollouts.
    assert rows[-1]["tokens/iteration"] == pytest.approx(rows[-1]["rollout/len_mean"] * 32)
    from transformers import AutoModelForCausalLM
    for ckpt in ("step_2", "final"):
        folder = out / "checkpoints" / ckpt
        AutoModelForCausalLM.from_pretrained(folder)
        assert (folder / "trainer_state.pt").is_file() and (folder / "data").is_dir()


@pytest.mark.slow
def test_resume_gives_bitwise_the_uninterrupted_weights(ci_testbed, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    base = ["--config", str(CI_CONFIG), "--no-progress", f"model={ci_testbed}"]
    assert main(["grpo", *base, "--out", str(full)]) == 0
    # Stopped after 2 steps (its checkpoint step_2 exists), then resumed to 4.
    assert main(["grpo", *base, "--out", str(part), "steps=2"]) == 0
    assert main(["grpo", "--resume", str(part), "--no-progress", "steps=4"]) == 0
    a = load_file(full / "checkpoints" / "final" / "model.safetensors")
    b = load_file(part / "checkpoints" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]


def _sevens(ci_testbed, tmp_path, backend, *overrides):
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "grpo_sevens_run.py"),
                           str(ci_testbed), str(tmp_path / "run"), backend, *overrides],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_grpo_raises_a_dense_reward_with_hf_rollouts(ci_testbed, tmp_path):
    r = _sevens(ci_testbed, tmp_path, "hf")
    print(r)
    assert r["after"] > r["before"] + 0.05, r
    assert r["params_changed"] == r["params"]


@pytest.mark.slow
@pytest.mark.vllm
def test_grpo_raises_a_dense_reward_with_vllm_rollouts(ci_testbed, tmp_path):
    pytest.importorskip("vllm")
    r = _sevens(ci_testbed, tmp_path, "vllm")
    print(r)
    assert r["after"] > r["before"] + 0.05, r
    assert r["params_changed"] == r["params"]
    # Weights were pushed into the engine after every step: its log-probs stay close to
    # the trainer's (a stale engine would drift away as training moves the policy).
    assert max(d for d in r["is_diff"] if d is not None) < 0.05, r["is_diff"]


def test_the_gradient_does_not_depend_on_the_micro_batch(ci_testbed):
    from gradient.loop.batch import RolloutBatch
    from gradient.loop.birth_stages import BIRTH, StageInput
    from gradient.loop.rollouts import collect
    from gradient.loop.setup import build
    from gradient.loop.trainer import _micro_loss

    cfg = resolve_training_data(load_config(GRPORunConfig, path=CI_CONFIG,
                                            overrides=[f"model={ci_testbed}"]))
    edges, problems, state = build(cfg)
    groups, _, _ = collect(edges, problems, cfg, 0, None, None)
    rows = RolloutBatch.from_groups(groups, cfg.seed, 0)
    # The ci model rarely solves anything: set advantages.
    rows = rows.with_fields([{"adv": (-1.0) ** i * (1 + i % 3)} for i in range(len(rows))])
    rows, _ = BIRTH.get("freeze_behaviour").fn(StageInput(edges, cfg, state), rows)
    assert all(r.old_logp is not None for r in rows)
    tokens = float(rows.tokens())
    grads = []
    for micro in (len(rows), 5):
        edges.model.zero_grad(set_to_none=True)
        for s in range(0, len(rows), micro):
            _micro_loss(edges, rows[s:s + micro], cfg, tokens, len(rows))
        grads.append({n: p.grad.clone() for n, p in edges.model.named_parameters()})
    assert any(g.abs().sum() > 0 for g in grads[0].values())
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-7)
    edges.task.close()


@pytest.mark.parametrize("override, message", [
    ("rollout.group_size=1", "group_size must be at least 2"),
    ("algo.clip_low=0.3", "clip_low (0.3) > clip_high (0.2)"),
    ("algo.loss=ppo", "valid choices are"),
    ("algo.advantage=grpo_plus", "valid choices are: dr_grpo, grpo, rloo"),
    ("algo.prefix.enabled=true", "needs a reference solution"),
])
def test_bad_input_exits_2(ci_testbed, shared_data, tmp_path, capsys, override, message):
    extra = []
    if "prefix" in override:
        # The ES paper's Countdown file has answer expressions but no worked references.
        extra = [f"task.data={shared_data / 'countdown' / 'countdown.json'}"]
    code = main(["grpo", "--config", str(CI_CONFIG), "--out", str(tmp_path / "r"),
                 f"model={ci_testbed}", override, *extra])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_reference_model_with_another_tokenizer_exits_2(ci_testbed, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    other = tmp_path / "other"
    AutoModelForCausalLM.from_pretrained(ci_testbed).save_pretrained(other)
    tok = AutoTokenizer.from_pretrained(ci_testbed)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    code = main(["grpo", "--config", str(CI_CONFIG), "--out", str(tmp_path / "r"),
                 f"model={ci_testbed}", "algo.kl.coef=0.01", f"algo.kl.ref_model={other}"])
    assert code == 2
    assert "different tokenizer" in capsys.readouterr().err


def test_resume_on_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["grpo", "--resume", str(tmp_path)]) == 2
    assert "not a grpo run folder" in capsys.readouterr().err


@pytest.mark.slow
def test_kl_to_the_reference_is_zero_at_the_start_and_falls_when_it_is_trained(ci_testbed,
                                                                                tmp_path):
    out = tmp_path / "same"
    assert main(["grpo", "--config", str(CI_CONFIG), "--out", str(out), "--no-progress",
                 f"model={ci_testbed}", "steps=1", "algo.kl.coef=0.05"]) == 0
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert first["grad/kl"] == pytest.approx(0.0, abs=1e-7)  # the policy is the reference

    # A reference some distance away (same tokenizer): with the KL term as the only signal
    # (the ci model earns no countdown reward, so advantages are 0), training pulls the
    # policy toward it. The logged per-batch k3 estimate is too noisy to show that in six
    # steps (one seed's jumped from 1.3 to 7.6 while the policy moved closer), so the
    # exact KL on fixed sequences is compared (0.77-0.82 of its start over seeds 0-2).
    ref = _perturbed_copy(ci_testbed, tmp_path / "ref", 0.05)
    out = tmp_path / "pulled"
    assert main(["grpo", "--config", str(CI_CONFIG), "--out", str(out), "--no-progress",
                 f"model={ci_testbed}", "steps=6", "algo.kl.coef=1.0", "algo.kl.estimator=k3+",
                 f"algo.kl.ref_model={ref}", "optim.lr=3e-4"]) == 0
    kl = [json.loads(x)["grad/kl"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(kl) == 6 and kl[0] > 1e-3, kl
    sequences = _greedy_sequences(ci_testbed, _eval_prompts(ci_testbed))
    before = _exact_kl(ci_testbed, ref, sequences)
    after = _exact_kl(out / "checkpoints" / "final", ref, sequences)
    assert after < 0.9 * before, (before, after)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_grpo_on_cuda_raises_a_dense_reward(ci_testbed, tmp_path):
    r = _sevens(ci_testbed, tmp_path, "hf", "runtime.device=cuda")
    print(r)
    assert r["after"] > r["before"] + 0.05, r
    assert r["params_changed"] == r["params"]


def _eval_prompts(model_dir: Path, count: int = 16) -> list[str]:
    """Every sixth held-out eval prompt of a testbed model (all three tiers), ``count`` of them."""
    rows = read_jsonl(Path(model_dir) / "data" / "countdown_eval.jsonl")
    return [r["prompt"] for r in rows[::6][:count]]


def _greedy_sequences(model_dir, prompts, new_tokens=32) -> list[tuple[torch.Tensor, int]]:
    """``(ids_1_T, prompt_len)`` per prompt: the prompt and the model's greedy continuation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    sequences = []
    with torch.no_grad():
        for prompt in prompts:
            ids_1_P = tokenizer(prompt, return_tensors="pt").input_ids
            ids_1_T = model.generate(ids_1_P, max_new_tokens=new_tokens, do_sample=False)
            sequences.append((ids_1_T, ids_1_P.shape[1]))
    return sequences


def _exact_kl(first, second, sequences) -> float:
    """KL(first || second) summed over the whole vocabulary, averaged over the continuation
    positions of fixed sequences: the divergence itself, free of the sampling noise of the
    per-batch estimates a run logs."""
    from transformers import AutoModelForCausalLM
    models = [AutoModelForCausalLM.from_pretrained(m).eval() for m in (first, second)]
    total, count = 0.0, 0
    with torch.no_grad():
        for ids_1_T, start in sequences:
            logp_a, logp_b = (torch.log_softmax(m(ids_1_T).logits[0, start - 1:-1].float(), -1)
                              for m in models)
            total += (logp_a.exp() * (logp_a - logp_b)).sum().item()
            count += logp_a.shape[0]
    return total / count


def _perturbed_copy(ci_testbed, folder, scale):
    """The ci model with seeded noise on every weight, saved with its tokenizer: a teacher
    or reference that differs from the student but shares its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(ci_testbed)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(ci_testbed).save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("name", OPD_CONFIGS)
def test_opd_lowers_the_students_reverse_kl_to_the_teacher(name, ci_testbed, tmp_path):
    """Every shipped distillation config on the ci testbed: the student's reverse KL to its
    teacher (for avsd the multi-view target, for w2s the proxy of the testbed's weak pair)
    falls. The teacher is the student with seeded noise on its weights: close enough that
    12 small steps move the student measurably towards it (the ci testbed's own stronger
    teacher is 0.4 nats per token away, which 12 steps of sampled-token OPD barely dent)."""
    out = tmp_path / "run"
    teachers = ci_testbed / "teachers"
    student, teacher = ci_testbed, _perturbed_copy(ci_testbed, tmp_path / "teacher", 0.05)
    overrides = [f"model={student}", f"algo.distill.teacher={teacher}",
                 f"algo.distill.w2s.positive={teachers / 'weak_rl'}",
                 f"algo.distill.w2s.negative={teachers / 'weak_base'}", "backend=hf",
                 "steps=12", "rollout.prompts_per_step=8", "rollout.group_size=4",
                 "rollout.max_tokens=32", "checkpoint_every=100", "optim.lr=1e-3"]
    if "rstg" in name:
        # RSTG distils only where every rollout failed, weighted by the teacher's solve rate,
        # so the teacher must solve what the student cannot: the ci testbed's stronger model
        # teaches a damaged copy of itself (weights + noise), with the weight held at 2 and
        # every token selected. The Intel-built strong model solves about 7% of these prompts
        # (omega_mean), so the distilled rows are few: at lr 1e-3 the GRPO and SFT terms
        # left the exact KL below at 0.80-0.96 of its start after 12 steps, 0.80-1.07 after 24
        # (seeds 0-3); at lr 3e-4 and 24 steps at 0.41-0.74 (seeds 0-3), then 0.51-0.61 on
        # seeds 4-6, run after the setting was chosen.
        student, teacher = (_perturbed_copy(teachers / "strong", tmp_path / "student", 0.03),
                            teachers / "strong")
        overrides += [f"model={student}", f"algo.distill.teacher={teacher}",
                      "algo.distill.rstg.teacher_samples=4", "algo.distill.rstg.beta_init=2",
                      "algo.distill.rstg.beta_floor=2", "algo.distill.rstg.token_frac=1",
                      "steps=24", "optim.lr=3e-4"]
    assert main(["opd", "--config", str(ROOT / "configs" / name), "--out", str(out),
                 "--no-progress", *overrides]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    kl = [r["distill/reverse_kl"] for r in rows]
    # The logged reverse KL is estimated on each step's own 32 rollouts (one step's value
    # swings by a fifth), so three-step means are compared: 0.43-0.69 over seeds 0-2 (AMD EPYC).
    assert kl[0] > 0.05 and sum(kl[-3:]) < 0.8 * sum(kl[:3]), kl
    method = load_config(GRPORunConfig, path=out / "config.yaml").algo.distill
    if method.method not in ("w2s", "avsd"):
        # Where the target is the teacher itself, the exact KL on fixed sequences must fall
        # too (0.68-0.79 of its start over seeds 0-2, AMD EPYC ci testbed).
        sequences = _greedy_sequences(student, _eval_prompts(ci_testbed))
        before = _exact_kl(student, teacher, sequences)
        after = _exact_kl(out / "checkpoints" / "final", teacher, sequences)
        assert after < 0.85 * before, (name, before, after)
    expected = {"ra_opd": "distill/kept_frac", "rstg": "distill/failed_frac",
                "dear": "distill/decision_frac", "avsd": "distill/gate_mean",
                "gjsd": "distill/divergence", "w2s": "distill/divergence"}
    if method.method in expected:
        assert all(expected[method.method] in r for r in rows)
    if method.drift.enabled:
        assert all(r["distill/gate_abs_dev"] >= 0 for r in rows)
        assert any(r["distill/gate_abs_dev"] > 0 for r in rows)
    if method.method == "avsd":
        assert all(r["distill/bound_holds"] == 1.0 for r in rows)


def test_opd_needs_a_teacher_with_the_students_tokenizer(ci_testbed, tmp_path, capsys):
    base = ["opd", "--config", str(ROOT / "configs" / "opd_countdown_ci.yaml"), "--out",
            str(tmp_path / "r"), f"model={ci_testbed}"]
    assert main([*base, "algo.distill.method=none"]) == 2
    assert "needs a distillation method" in capsys.readouterr().err
    assert main([*base, "algo.distill.teacher="]) == 2
    assert "needs a teacher model" in capsys.readouterr().err
    from transformers import AutoTokenizer
    other = _perturbed_copy(ci_testbed, tmp_path / "other", 0.0)
    tok = AutoTokenizer.from_pretrained(ci_testbed)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    assert main([*base, f"algo.distill.teacher={other}"]) == 2
    assert "different tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
