"""Running a check script of ``tests/`` in a process of its own: the test session already
holds one in-process vLLM engine, and in-process engines share vLLM's global state, so an
engine with other settings must live in another process. A check script prints its result
as the last ``RESULT <json>`` line of stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_check(script: str, *args: str, timeout: int) -> dict:
    """The result of ``python tests/<script> <args>``; the test fails with the script's
    output when it exits non-zero or prints no result."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / script), *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])
