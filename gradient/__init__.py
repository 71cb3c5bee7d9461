"""Gradient-based post-training baselines built on the shared core in ``es_llm``."""
