"""Head-to-head comparison of models from their samples: the numbers (``analysis``), the
figures (``figures``), the report pages (``report``) and the ``es-llm compare`` job (``run``)."""
