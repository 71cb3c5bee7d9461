"""es-llm: post-train language models with Evolution Strategies or gradient RL and compare them.

The shared core lives here: tasks and rewards (``es_llm.tasks``), metrics (``es_llm.metrics``),
generation backends (``es_llm.backends``), the embedded testbed (``es_llm.testbed``) and the
command line (``es_llm.cli``). It never imports ``gradient``.
"""

__version__ = "0.1.0"
