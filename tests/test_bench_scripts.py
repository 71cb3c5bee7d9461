"""The benchmark scripts refuse counts they cannot honour before they build or time anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.parametrize("option, value", [("--loop-repeats", "0"), ("--repeats", "0"),
                                           ("--repeats", "-3"), ("--loop-repeats", "two")])
def test_bench_es_refuses_a_count_below_one(option, value, tmp_path):
    # A zero once fell back to --repeats without a word; every count now needs >= 1.
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_es.py"), option, value],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "ES_LLM_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert option in proc.stderr and "at least 1" in proc.stderr and value in proc.stderr
    assert not (tmp_path / "cache").exists()  # nothing built
