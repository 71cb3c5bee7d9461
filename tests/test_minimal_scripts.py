"""The one-page scripts that document the ES and GRPO maths run and learn: a tiny random
model's greedy share of the target token rises well above where it started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.parametrize("script, args", [("minimal_es.py", ["--iterations", "30"]),
                                          ("minimal_grpo.py", ["--steps", "30"])])
def test_minimal_script_raises_the_reward(script, args):
    proc = subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # One target token in 16, 8 tokens per completion: the start is about 1/16 or less.
    assert result["before"] < 0.05 and result["after"] > result["before"] + 0.15, result


@pytest.mark.parametrize("script", ["minimal_es.py", "minimal_grpo.py"])
def test_minimal_script_is_about_a_page(script):
    assert len((SCRIPTS / script).read_text().splitlines()) <= 100
