"""Model-free population primitives for ES over named parameter sets (``dict[str, Tensor]``).

- ``noise``: keyed Gaussian noise per (run seed, iteration, direction, tensor name), members.
- ``shaping``: fitness shaping registry (zscore, centered_rank, group_zscore,
  pair_diff, raw).
- ``lowrank``: rank-r keyed factors A B^T / sqrt(r) of a matrix and their estimate (EGGROLL).
- ``perturbations``: the perturbation kinds (full, lowrank) behind one interface.
- ``estimators``: the ES gradient estimate, accumulated in fp32 one noise tensor at a time.
- ``optimizers``: functional ascent optimizers (sgd, adam) with anchored weight decay.
- ``es``: the functional ES step, ``init`` / ``ask`` / ``tell``.
- ``evotorch_bridge``: evotorch's PGPE / SNES / CEM on small flat vectors, as a reference.

Sign convention throughout: rewards are maximised; estimates point uphill and are added.
This package imports neither ``es_llm`` nor ``gradient``; it works on any parameter set.
"""
