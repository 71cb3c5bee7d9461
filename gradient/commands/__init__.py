"""The ``es-llm`` subcommands of gradient methods (``grpo``, ``opd``, ``sft``,
``latent-revise``), registered under the ``es_llm.commands`` entry points; no package
imports them (the core finds them there, scripts/ may read their configs)."""
