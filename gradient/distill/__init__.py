"""On-policy distillation (OPD): its maths, pure functions over tensors, and its specs.

OPD is the GRPO-family loop with a teacher that scores the student's own rollouts, so every
method here is an advantage transform, a token or sample weighting, or a target builder that
the existing trainer feeds into ``gradient.maths.losses`` and ``gradient.maths.aggregation``:

- ``opd``: the sampled-token reverse-KL advantage (Tinker form), its combination with a task
  reward advantage, and TRL's generalized JSD over full or top-K vocabularies (GKD);
- ``ra_opd``: reward-aligned keep mask over trajectories (RA-OPD);
- ``drift_gate``: blockwise policy-drift gates for reused rollouts (BPDG);
- ``w2s``: the weak-to-strong proxy teacher and its top-K reverse KL (W2S-OPD);
- ``rstg``: failure-gated hybrid GRPO/OPD advantage with soft-OR token selection (RSTG);
- ``dear``: decision and evidence token weights (DEAR, the project's reading of the abstract);
- ``avsd``: the multi-view consensus target with a bounded Jensen residual (AVSD).

Weights, masks and advantages returned here are detached; only the divergence losses
(``generalized_jsd``, ``proxy_reverse_kl``) carry the student's graph. Nothing here reduces
over ranks or calls ``.item()``: global token counts are the trainer's.

Beside the maths: ``methods`` (each method's spec), ``scoring`` and ``birth`` (the generic
torch glue that runs a spec at a rollout's birth and in the loss), and a method's own glue in
its module (RSTG's teacher solve rates and SFT rows at the end of ``rstg``).
"""
