"""``es-llm sft``: supervised fine-tuning on prompt / completion rows (``gradient.loop.sft``)."""

from __future__ import annotations

from es_llm.command import MODEL, Command, Flag, required_out
from es_llm.errors import BadInput


def run(args, cfg) -> None:
    from es_llm.run_folder import check_out_path, holds_run
    from gradient.loop.sft import run_sft

    out = check_out_path(required_out(args))
    if out.is_dir() and holds_run(out):
        raise BadInput(f"--out {str(out)!r} already holds a run; give a new folder (or remove "
                       f"this one) to start over.")
    run_sft(cfg, out, progress=not args.no_progress)
    args.log.attach(out)


COMMAND = Command(
    help="supervised fine-tuning on prompt/completion rows",
    description="""\
Supervised fine-tuning on a JSONL file of prompt / completion rows (data=FILE), e.g. the
recovered trajectories of `es-llm latent-revise` or its base_rollouts.jsonl control: the
completion's tokens and EOS are scored, the prompt is not; AdamW (optim.*), `epochs` passes
in seeded shuffles of `batch_size` rows. Writes DIR/config.yaml, metrics.jsonl and
checkpoints/final (an HF folder with the model's held-out data/).""",
    config="gradient.loop.sft:SFTRunConfig",
    run=run,
    flags=(MODEL, Flag("--data", "data")),
    out_required=True,
)
