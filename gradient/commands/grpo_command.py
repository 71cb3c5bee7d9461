"""``es-llm grpo`` and ``es-llm opd``: the GRPO-family trainer on the command line. ``opd``
is the same trainer with a teacher (``algo.distill``); it only insists that one is
configured."""

from __future__ import annotations

import dataclasses

from es_llm.command import MODEL, Command, training_load, training_out
from es_llm.errors import BadInput

# What `--resume` may override: the run's length and checkpoint cadence, neither of which
# changes what it computes.
RESUME_KEYS = ("steps", "checkpoint_every")


def options(p) -> None:
    p.add_argument("--resume", metavar="DIR",
                   help="continue the run in DIR from its latest checkpoint: weights, "
                        "optimizer state, step (the data position), prefix controller and "
                        "replay buffer (from the start when it has none yet); its "
                        "config.yaml is reloaded and only " + ", ".join(RESUME_KEYS)
                        + " may be overridden (e.g. steps=N to train longer)")


def run(args, cfg) -> None:
    import sys

    from es_llm.run_folder import check_extends, other_machine
    from gradient.loop.setup import build, latest_checkpoint, saved_step
    from gradient.loop.trainer import run as train

    out = training_out(args)
    # A run killed before its first checkpoint starts again from the base model, which is
    # what an uninterrupted run would have done.
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
        train(cfg, edges, problems, out, state, progress=not args.no_progress,
              command=args.command)
    finally:
        edges.task.close()


def run_opd(args, cfg) -> None:
    if cfg.algo.distill.method == "none":
        raise BadInput("es-llm opd needs a distillation method: set algo.distill.method (see "
                       "configs/opd_*.yaml).")
    run(args, cfg)


GRPO = Command(
    help="GRPO-family RL baseline (GRPO, Dr. GRPO, DAPO, GSPO, GAPO, AdaPrefix-GRPO, rollout "
         "replay) on one machine",
    description="""\
Train a model with a policy-gradient method of the GRPO family: each step samples G
rollouts for each of P training prompts (vLLM or the HF loop), scores them with the task's
verifier, turns rewards into advantages and takes optimizer steps on the clipped policy
loss. The method is chosen in the config (see configs/grpo_*.yaml): algo.advantage,
algo.loss, algo.aggregation, algo.kl, algo.dynamic_sampling, algo.overlong, algo.prefix,
algo.replay. A masked-diffusion model (a folder with diffusion_sampling.json, e.g. a
testbed's diffusion/) trains with its own sampler and a log-prob estimator,
algo.dllm.estimator: mean_field (d1), trace (TraceRL) or quadrature (SLIM-RL); see
configs/dllm_*.yaml. Writes DIR/config.yaml, metrics.jsonl and checkpoints/ (HF folders with
the optimizer state).""",
    config="gradient.config:GRPORunConfig",
    run=run,
    flags=(MODEL,),
    options=options,
    load=training_load("a grpo", RESUME_KEYS),
)

OPD = dataclasses.replace(
    GRPO,
    help="on-policy distillation from a teacher on the student's own rollouts",
    description="""\
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
distill/* metrics (distill/reverse_kl: the sampled-token estimate of KL(student||teacher)).""",
    run=run_opd,
    load=training_load("an opd", RESUME_KEYS),
)
