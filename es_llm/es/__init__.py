"""The ES engine: population evaluation of perturbed LLM weights, seeds-only communication."""
