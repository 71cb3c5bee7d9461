"""``es-llm latent-revise``: recover zero-hit prompts by revising failed rollouts' prefixes
in embedding space (``gradient.commands.recovery``)."""

from __future__ import annotations

from es_llm.command import MODEL, TASK, Command, writes_out


COMMAND = Command(
    help="LatentRevise: recover zero-hit prompts by revising failed rollouts' prefixes in "
         "embedding space",
    description="""\
LatentRevise on a model's zero-hit prompts: sample search.n rollouts per training
prompt (default: the model's data/<task>_rl.jsonl); for every prompt none of them solves,
cut a failed rollout into a reasoning prefix and its failed continuation
(revise.cut=before_first_wrong, the default and the source's: the steps before the first
one the verifier rejects; first_wrong: through it; fraction: the first
revise.cut_fraction of its steps), optimise the prefix's input embeddings on the
vocabulary simplex with revise.steps Frank-Wolfe steps toward the gold continuation
(revise.anchor=answer, the default and the source's: the reference's answer block;
spliced_tail: the reference's remaining steps and answer) and away from the failed one
(lambda = revise.away_weight; revise.away=log or unlikelihood; model frozen), then sample
revise.continuations continuations in two arms: from the soft prefix itself, prefilled as
input embeddings (soft, the source's; vLLM prompt embeddings or transformers), and from its argmax
tokens (hard, the ablation). A soft continuation's trajectory is written with the
rollout's own prefix (revise.train_prefix=original) or the hard one (hard), and the
verifier judges both texts. revise.continue_from picks the arm whose recoveries are the
training data. Plain resampling at the same token passes runs beside it. Writes
DIR/recovered.jsonl (the training data: one verified trajectory per recovered prompt),
resampled.jsonl, base_rollouts.jsonl (as many correct base samples of other prompts, for
an SFT control), attempts.jsonl (both arms' continuations and both log-likelihoods after
the soft and the hard-decoded prefix), metrics.json and report.md (each arm's recovery
with a 95% interval, per-sample rate, paired difference to resampling and break-even,
token passes and seconds).""",
    config="gradient.commands.recovery:LatentReviseConfig",
    run=writes_out("gradient.commands.recovery:latent_revise"),
    flags=(MODEL, *TASK),
    out_required=True,
)
