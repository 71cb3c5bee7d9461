"""Test-time methods: spending inference compute on a fixed model (``es-llm testtime``)."""
