"""Model-free population primitives (noise, fitness shaping, estimators, optimizers).

This package imports neither ``es_llm`` nor ``gradient``; it works on any parameter set.
"""
