"""``es-llm grpo``: the GRPO-family trainer on the command line (registered with the core CLI
through the ``es_llm.commands`` entry point)."""

from __future__ import annotations

import argparse
import textwrap
from es_llm.errors import BadInput


class GRPOCommand:
    name = "grpo"

    def add_parser(self, sub, add_common) -> None:
        p = sub.add_parser(
            self.name, help="GRPO-family RL baseline (GRPO, Dr. GRPO, DAPO, GSPO, GAPO, "
                            "AdaPrefix-GRPO, rollout replay) on one machine",
            description=textwrap.dedent("""\
                Train a model with a policy-gradient method of the GRPO family: each step
                samples G rollouts for each of P training prompts (vLLM or the HF loop),
                scores them with the task's verifier, turns rewards into advantages and
                takes optimizer steps on the clipped policy loss. The method is chosen in
                the config (see configs/grpo_*.yaml): algo.advantage, algo.loss,
                algo.aggregation, algo.kl, algo.dynamic_sampling, algo.overlong,
                algo.prefix, algo.replay. Writes DIR/config.yaml, metrics.jsonl and
                checkpoints/ (HF folders with the optimizer state)."""),
            formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--model", help="base model folder (overrides the config's model)")
        p.add_argument("--resume", metavar="DIR",
                       help="continue the run in DIR from its latest checkpoint: weights, "
                            "optimizer state, step (the data position), prefix controller and "
                            "replay buffer; its config.yaml is reloaded (overrides such as "
                            "steps=N still apply)")
        add_common(p, out_required=False)

    def run(self, args) -> None:
        from es_llm.cli import run_folder
        from es_llm.config import load_config
        from es_llm.evaluate import resolve_training_data
        from gradient.config import GRPORunConfig
        from gradient.setup import build, latest_checkpoint
        from gradient.trainer import run

        flags = {"model": args.model} if args.model is not None else {}
        out, config_path = run_folder(args, "a grpo", "grpo", ("config.yaml",))
        checkpoint = latest_checkpoint(out) if args.resume else None
        if args.resume and checkpoint is None:
            raise BadInput(f"--resume {args.resume!r}: the run has no checkpoint with "
                           f"trainer_state.pt yet; start it again with --out.")
        cfg = resolve_training_data(load_config(GRPORunConfig, path=config_path, flags=flags,
                                                overrides=args.overrides))
        edges, problems, state = build(cfg, checkpoint)
        try:
            run(cfg, edges, problems, out, state, progress=not args.no_progress)
        finally:
            edges.task.close()


GRPO_COMMAND = GRPOCommand()
