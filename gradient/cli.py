"""``es-llm grpo`` and ``es-llm opd``: the GRPO-family trainer on the command line, registered
with the core CLI through the ``es_llm.commands`` entry point. ``opd`` is the same trainer
with a teacher (``algo.distill``); it only insists that one is configured."""

from __future__ import annotations

import argparse

from es_llm.errors import BadInput


GRPO_DESCRIPTION = """\
Train a model with a policy-gradient method of the GRPO family: each step samples G
rollouts for each of P training prompts (vLLM or the HF loop), scores them with the task's
verifier, turns rewards into advantages and takes optimizer steps on the clipped policy
loss. The method is chosen in the config (see configs/grpo_*.yaml): algo.advantage,
algo.loss, algo.aggregation, algo.kl, algo.dynamic_sampling, algo.overlong, algo.prefix,
algo.replay. A masked-diffusion model (a folder with diffusion_sampling.json, e.g. a
testbed's diffusion/) trains with its own sampler and a log-prob estimator,
algo.dllm.estimator: mean_field (d1), trace (TraceRL) or quadrature (SLIM-RL); see
configs/dllm_*.yaml. Writes DIR/config.yaml, metrics.jsonl and checkpoints/ (HF folders with
the optimizer state)."""

OPD_DESCRIPTION = """\
On-policy distillation: the GRPO-family trainer with a teacher that scores the student's
own rollouts; algo.distill.method picks how (see configs/opd_*.yaml):
  opd     per-token advantage -(log pi_student - log pi_teacher) on the sampled token,
          plus reward_coef times the group-centred task reward (Tinker's OPD);
  ra_opd  opd on the rollouts whose distillation return agrees with the outcome;
  rstg    GRPO, with teacher-confidence-weighted OPD on selected tokens and an SFT term
          where every rollout of a prompt failed;
  dear    opd weighted towards decision tokens and their evidence;
  avsd    self-distillation from the student's starting weights under privileged views;
  gjsd    generalized JSD to the teacher over the full (or top-K) vocabulary;
  w2s     reverse KL to the proxy teacher base + alpha (weak_rl - weak_base);
  dopsd   diffusion LMs: JSD between the student on an intermediate state of its own
          trajectory and the (initial or live) model on a later state
          (algo.dllm.estimator=student_view; configs/dllm_dopsd_countdown.yaml).
algo.distill.drift gates the distillation losses of reused rollouts (epochs or
mini_batches > 1). Teachers must share the student's tokenizer; `es-llm testbed` builds
teachers/strong, teachers/weak_base and teachers/weak_rl. Outputs as `es-llm grpo`, plus
distill/* metrics (distill/reverse_kl: the sampled-token estimate of KL(student||teacher))."""


# What `--resume` may override: the run's length and checkpoint cadence, neither of which
# changes what it computes.
RESUME_KEYS = ("steps", "checkpoint_every")


class GRPOCommand:
    def __init__(self, name: str, help: str, description: str, needs_teacher: bool):
        self.name, self.help, self.description = name, help, description
        self.needs_teacher = needs_teacher

    def add_parser(self, sub, add_common) -> None:
        p = sub.add_parser(self.name, help=self.help, description=self.description,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--model", help="base model folder (overrides the config's model)")
        p.add_argument("--resume", metavar="DIR",
                       help="continue the run in DIR from its latest checkpoint: weights, "
                            "optimizer state, step (the data position), prefix controller and "
                            "replay buffer (from the start when it has none yet); its "
                            "config.yaml is reloaded and only " + ", ".join(RESUME_KEYS)
                            + " may be overridden (e.g. steps=N to train longer)")
        add_common(p, out_required=False, config="gradient.config:GRPORunConfig")

    def run(self, args) -> None:
        import sys

        from es_llm.cli import print_config
        from es_llm.config import load_config
        from es_llm.models import resolve_training_data
        from es_llm.run_folder import check_extends, other_machine, training_folder
        from gradient.config import GRPORunConfig
        from gradient.setup import build, latest_checkpoint, saved_step
        from gradient.trainer import run

        flags = {"model": args.model} if args.model is not None else {}
        out, config_path = training_folder(args, f"a {self.name}", self.name, RESUME_KEYS,
                                           flags)
        cfg = resolve_training_data(load_config(GRPORunConfig, path=config_path, flags=flags,
                                                overrides=args.overrides))
        if args.print_config:
            return print_config(cfg)
        if self.needs_teacher and cfg.algo.distill.method == "none":
            raise BadInput(f"es-llm {self.name} needs a distillation method: set "
                           f"algo.distill.method (see configs/opd_*.yaml).")
        # A run killed before its first checkpoint starts again from the base model, which
        # is what an uninterrupted run would have done.
        checkpoint = latest_checkpoint(out) if args.resume else None
        if checkpoint is not None:
            check_extends(out, "steps", cfg.steps, saved_step(checkpoint))
            warning = other_machine(out)
            if warning:
                print(warning, file=sys.stderr)
        edges, problems, state = build(cfg, checkpoint)
        try:
            out.mkdir(parents=True, exist_ok=True)
            args.log.attach(out)
            run(cfg, edges, problems, out, state, progress=not args.no_progress,
                command=self.name)
        finally:
            edges.task.close()


GRPO_COMMAND = GRPOCommand(
    "grpo", "GRPO-family RL baseline (GRPO, Dr. GRPO, DAPO, GSPO, GAPO, AdaPrefix-GRPO, "
            "rollout replay) on one machine", GRPO_DESCRIPTION, needs_teacher=False)
OPD_COMMAND = GRPOCommand(
    "opd", "on-policy distillation from a teacher on the student's own rollouts",
    OPD_DESCRIPTION, needs_teacher=True)


LATENT_REVISE_DESCRIPTION = """\
LatentRevise on a model's zero-hit prompts: sample search.n rollouts per training
prompt (default: the model's data/<task>_rl.jsonl); for every prompt none of them solves,
cut a failed rollout into a reasoning prefix and its failed continuation
(revise.cut=first_wrong: through the first step the verifier rejects; fraction: the first
revise.cut_fraction of its steps), optimise the prefix's input embeddings on the
vocabulary simplex with revise.steps Frank-Wolfe steps toward the reference solution's
continuation and away from the failed one (lambda = revise.away_weight, model frozen),
decode it to tokens, sample revise.continuations continuations and keep one the task's
verifier accepts. Plain resampling at the same token passes runs beside it. Writes
DIR/recovered.jsonl (the training data: one verified trajectory per recovered prompt),
resampled.jsonl, base_rollouts.jsonl (as many correct base samples of other prompts, for
an SFT control), attempts.jsonl, metrics.json and report.md (recovery rates with 95%
intervals, their paired difference, token passes and seconds of both arms)."""

SFT_DESCRIPTION = """\
Supervised fine-tuning on a JSONL file of prompt / completion rows (data=FILE), e.g. the
recovered trajectories of `es-llm latent-revise` or its base_rollouts.jsonl control: the
completion's tokens and EOS are scored, the prompt is not; AdamW (optim.*), `epochs` passes
in seeded shuffles of `batch_size` rows. Writes DIR/config.yaml, metrics.jsonl and
checkpoints/final (an HF folder with the model's held-out data/)."""


class LatentReviseCommand:
    name = "latent-revise"

    def add_parser(self, sub, add_common) -> None:
        p = sub.add_parser(self.name, help="LatentRevise: recover zero-hit prompts by revising "
                                           "failed rollouts' prefixes in embedding space",
                           description=LATENT_REVISE_DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--model", help="causal LM folder (e.g. from `es-llm testbed`)")
        p.add_argument("--task", help="task name (countdown; others need revise.cut=fraction)")
        p.add_argument("--data", help="training problems with reference solutions (default: "
                                      "the model's data/<task>_rl.jsonl)")
        p.add_argument("--limit", type=int, help="use only the first LIMIT problems")
        add_common(p, out_required=True, config="gradient.recovery:LatentReviseConfig")

    def run(self, args) -> None:
        from es_llm.cli import print_config, required_out
        from es_llm.config import load_config
        from gradient.recovery import LatentReviseConfig, latent_revise

        flags: dict = {"model": args.model} if args.model is not None else {}
        task = {k: v for k, v in (("name", args.task), ("data", args.data),
                                  ("limit", args.limit)) if v is not None}
        if task:
            flags["task"] = task
        cfg = load_config(LatentReviseConfig, path=args.config, flags=flags,
                          overrides=args.overrides)
        if args.print_config:
            return print_config(cfg)
        latent_revise(cfg, required_out(args), progress=not args.no_progress,
                      on_folder=args.log.attach)


class SFTCommand:
    name = "sft"

    def add_parser(self, sub, add_common) -> None:
        p = sub.add_parser(self.name, help="supervised fine-tuning on prompt/completion rows",
                           description=SFT_DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--model", help="starting model folder")
        p.add_argument("--data", help="JSONL file of prompt / completion rows")
        add_common(p, out_required=True, config="gradient.sft:SFTRunConfig")

    def run(self, args) -> None:
        from pathlib import Path

        from es_llm.cli import print_config, required_out
        from es_llm.config import load_config
        from es_llm.run_folder import check_out_path, holds_run
        from gradient.sft import SFTRunConfig, run_sft

        flags = {k: v for k, v in (("model", args.model), ("data", args.data)) if v is not None}
        cfg = load_config(SFTRunConfig, path=args.config, flags=flags, overrides=args.overrides)
        if args.print_config:
            return print_config(cfg)
        out = check_out_path(required_out(args))
        if out.is_dir() and holds_run(out):
            raise BadInput(f"--out {str(out)!r} already holds a run; give a new folder (or "
                           f"remove this one) to start over.")
        run_sft(cfg, Path(out), progress=not args.no_progress)
        args.log.attach(out)


LATENT_REVISE_COMMAND = LatentReviseCommand()
SFT_COMMAND = SFTCommand()
