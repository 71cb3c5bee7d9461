"""Time the training and evaluation stages, and ES throughput, on one device; print one JSON.

    python scripts/gpu_check.py --model runs/standin --device cuda --dtype bfloat16 \
        --out runs/gpu --throughput runs/standin-0.5b runs/standin

Run by ``scripts/gpu_check.sh`` (which builds the model first). Stages, each an ``es-llm``
command in a fresh process, in this order:

1. ``es_full``: 2 ES iterations, full rank, members' weights written (engine.serve=weights);
2. ``es_rows``: 2 ES iterations, low rank, members as per-row terms (engine.serve=rows);
3. ``grpo``: 2 GRPO steps with HF rollouts;
4. ``compare``: the base model against es_full's final weights on 50 Countdown problems.

All on the HF backend (no vLLM). Per stage the JSON gives its wall seconds, its exit status
and its peak GPU memory: ``torch.cuda.max_memory_allocated`` of the stage's process, read
as it exits (null on the CPU). The device and dtype reach each command through
``RUNTIME_KEYS``, the one place their config keys are named.

Then, per ``--throughput`` model (keyed by its folder's name), ``scripts/gpu_throughput.py``
in a fresh process: full-rank ES and low-rank rows at N = 256 and 4,096 against plain
batched generation of the same rows (samples/s, tokens/s, peak GPU memory; see there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The config keys that carry the device and the dtype, per command: every command's shared
# runtime section, and ES's noise drawn on the same device.
RUNTIME_KEYS = {"es": {"runtime.device": "device", "runtime.dtype": "dtype",
                       "es.noise_device": "device"},
                "grpo": {"runtime.device": "device", "runtime.dtype": "dtype"},
                "compare": {"runtime.device": "device", "runtime.dtype": "dtype"}}

# The stage's process runs the es-llm console script, then writes its peak GPU memory.
STAGE_CODE = """
import atexit, json, os, runpy, sys
def peak():
    import torch
    value = torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else None
    with open(os.environ["GPU_CHECK_PEAK"], "w") as f:
        json.dump(value, f)
atexit.register(peak)
sys.argv = ["es-llm", *sys.argv[1:]]
runpy.run_module("es_llm", run_name="__main__")
"""


def runtime_overrides(command: str, device: str, dtype: str) -> list[str]:
    """The ``key=value`` words that put ``command`` on ``device`` in ``dtype`` (the keys
    it has, ``RUNTIME_KEYS``)."""
    values = {"device": device, "dtype": dtype}
    return [f"{key}={values[what]}" for key, what in RUNTIME_KEYS[command].items()]


def stages(model: Path, out: Path) -> list[tuple[str, list[str]]]:
    """(name, es-llm words) of each stage, in order, without the runtime overrides."""
    configs = ROOT / "configs"
    small_es = ["iterations=2", "es.population=8", "prompts_per_iteration=8", "max_tokens=32",
                "checkpoint_every=100", "backend=hf", f"model={model}"]
    return [
        ("es_full", ["es", "--config", str(configs / "es_countdown_ci.yaml"),
                     "--out", str(out / "es_full"), "engine.serve=weights", *small_es]),
        ("es_rows", ["es", "--config", str(configs / "es_countdown_lowrank_ci.yaml"),
                     "--out", str(out / "es_rows"), "engine.members_per_call=8", *small_es]),
        ("grpo", ["grpo", "--config", str(configs / "grpo_countdown_ci.yaml"),
                  "--out", str(out / "grpo"), f"model={model}", "steps=2", "backend=hf",
                  "checkpoint_every=100", "rollout.prompts_per_step=4", "rollout.max_tokens=32"]),
        ("compare", ["compare", "--models", f"base={model}",
                     f"es={out / 'es_full' / 'checkpoints' / 'final'}", "--out",
                     str(out / "compare"), "--task", "countdown", "backend=hf",
                     f"task.data={model / 'data' / 'countdown_eval.jsonl'}", "task.limit=50",
                     "sampling.n=2", "sampling.max_tokens=32", "bootstrap=100"]),
    ]


def run_stage(words: list[str], device: str, dtype: str, peak_file: Path) -> dict:
    """Run one ``es-llm`` command line in a fresh process: its seconds, exit status, peak
    GPU bytes and the end of its error output."""
    words = [*words, *runtime_overrides(words[0], device, dtype), "--no-progress"]
    env = dict(os.environ, GPU_CHECK_PEAK=str(peak_file),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", STAGE_CODE, *words], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    peak = json.loads(peak_file.read_text()) if peak_file.is_file() else None
    return {"seconds": round(seconds, 2), "returncode": done.returncode,
            "peak_gpu_bytes": peak, "stderr_tail": done.stderr[-1500:] if done.returncode else ""}


def run_throughput(model: Path, device: str, dtype: str) -> dict:
    """``scripts/gpu_throughput.py`` on ``model`` in a fresh process: its report, with its
    seconds and exit status (and the end of its error output if it failed)."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_throughput.py"),
                           "--model", str(model), "--device", device, "--dtype", dtype],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    report = json.loads(done.stdout) if done.returncode == 0 else {}
    return {**report, "seconds": round(time.perf_counter() - t0, 2),
            "returncode": done.returncode,
            "stderr_tail": done.stderr[-1500:] if done.returncode else ""}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="a model folder with data/")
    p.add_argument("--device", default="cuda", help="cuda or cpu")
    p.add_argument("--dtype", default="bfloat16", help="float32, bfloat16 or float16")
    p.add_argument("--out", required=True, type=Path, help="a folder for the stages' runs")
    p.add_argument("--throughput", nargs="*", default=[], type=Path, metavar="MODEL",
                   help="model folders to measure ES throughput on (scripts/gpu_throughput.py)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"model": str(args.model), "device": args.device, "dtype": args.dtype,
              "stages": {}}
    for name, words in stages(args.model, args.out):
        report["stages"][name] = run_stage(words, args.device, args.dtype,
                                           args.out / f"{name}.peak.json")
    report["throughput"] = {model.name: run_throughput(model, args.device, args.dtype)
                            for model in args.throughput}
    print(json.dumps(report))
    ran = [*report["stages"].values(), *report["throughput"].values()]
    return 0 if all(r["returncode"] == 0 for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
