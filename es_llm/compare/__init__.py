"""Head-to-head comparison of models from their samples: the numbers (``analysis``), the
registered sections of the report (``section``; one module each or a few together) and the
``es-llm compare`` job (``run``)."""
