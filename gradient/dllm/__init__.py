"""Diffusion-LM RL: masks of the log-probability estimators and their losses."""
