"""The GRPO family's maths: registries of pure functions over tensors, one typed input each,
and the other pieces the loop calls (dynamic sampling, prefixes, replay, log-probs,
LatentRevise's soft prefix). Nothing here imports the loop or a command."""
