"""The plain vLLM ES loop that ``scripts/bench_es.py`` times es-llm against does es-llm's
maths: from the same weights on the same engine it gets the same rewards and bitwise the
same update."""

from __future__ import annotations

import pytest

from own_process import run_check


@pytest.mark.vllm
@pytest.mark.slow
def test_plain_loop_gives_es_llms_update(ci_testbed):
    """In a separate process (see ``plain_vllm_es_check.py``), one iteration of 6 mirrored
    members on 16 prompts."""
    pytest.importorskip("vllm")
    r = run_check("plain_vllm_es_check.py", str(ci_testbed), timeout=600)
    assert r["rewards_plain"] == r["rewards_es_llm"]
    assert len({sum(row) for row in r["rewards_es_llm"]}) > 1  # members differ: a real update
    assert r["moved"] == r["tensors"]
    assert r["equal"] == r["tensors"], r["max_diff"]
