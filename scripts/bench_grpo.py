"""GRPO trainer benchmark, side by side in one run on a testbed model.

    python scripts/bench_grpo.py --size default --steps 6 --prompts 32 --group 8

Runs ``es-llm grpo`` for a few steps with HF rollouts and with vLLM rollouts (each in a
process of its own, same config) and reports the median step time, generation and training
time, and completion tokens per second (the first step is a warm-up and left out). Where TRL
is installed (the optional ``bench`` extra; never a runtime dependency) it also times TRL's
GRPOTrainer on the same model, prompts, group size, completion length and learning rate with
transformers generation, against es-llm's HF rollouts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from es_llm.testbed.build import model_or_testbed

ROOT = Path(__file__).resolve().parents[1]


def ours(model: Path, backend: str, args, work: Path) -> dict:
    out = work / f"run-{backend}"
    cmd = [sys.executable, "-m", "es_llm", "grpo", "--config",
           str(ROOT / "configs" / "grpo_countdown.yaml"), "--out", str(out), "--no-progress",
           f"model={model}", f"backend={backend}", f"steps={args.steps}",
           f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
           f"rollout.max_tokens={args.max_tokens}", "checkpoint_every=1000"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][1:]
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    return {"step_s": med("perf/step_s"), "gen_s": med("perf/gen_s"),
            "train_s": med("perf/train_s"), "tokens_per_s": med("perf/tokens_per_s")}


TRL_SCRIPT = r'''
import json, sys, time
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from es_llm.tasks import TaskConfig, build_task
from es_llm.tasks.countdown import load_problems

model_dir, out, steps, prompts, group, max_tokens = sys.argv[1:7]
steps, prompts, group, max_tokens = int(steps), int(prompts), int(group), int(max_tokens)
problems = load_problems(f"{model_dir}/data/countdown_rl.jsonl")
by_prompt = {p.prompt: p for p in problems}
task = build_task(TaskConfig(name="countdown", data=f"{model_dir}/data/countdown_rl.jsonl"))

def reward(prompts, completions, **kw):
    return [s.reward for s in task.score_many([(by_prompt[p], c) for p, c in zip(prompts, completions)])]

class Clock(TrainerCallback):
    def __init__(self): self.t, self.times = None, []
    def on_step_begin(self, *a, **k): self.t = time.perf_counter()
    def on_step_end(self, *a, **k): self.times.append(time.perf_counter() - self.t)

tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir)
data = Dataset.from_list([{"prompt": p.prompt} for p in problems])
cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=prompts * group,
                 num_generations=group, max_completion_length=max_tokens, max_steps=steps,
                 learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to=[],
                 use_cpu=True, temperature=1.0, beta=0.0, loss_type="dapo", seed=0)
clock = Clock()
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data,
                      processing_class=tok, callbacks=[clock])
trainer.train()
print(json.dumps({"step_times": clock.times}))
'''


def trl(model: Path, args, work: Path) -> dict | None:
    try:
        import trl as _  # noqa: F401
    except ImportError:
        return None
    script = work / "trl_bench.py"
    script.write_text(TRL_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script), str(model), str(work / "trl"),
                           str(args.steps), str(args.prompts), str(args.group),
                           str(args.max_tokens)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(f"TRL run failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    times = json.loads(proc.stdout.strip().splitlines()[-1])["step_times"][1:]
    return {"step_s": statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["ci", "default"], default="default", help="testbed preset")
    ap.add_argument("--steps", type=int, default=6, help="training steps per timed run")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="rollouts per prompt")
    ap.add_argument("--max-tokens", type=int, default=64, help="longest completion")
    ap.add_argument("--skip-trl", action="store_true", help="leave out the TRL comparison")
    ap.add_argument("--model", help="benchmark this testbed model folder instead of building "
                                    "--size")
    args = ap.parse_args()

    model, what = model_or_testbed(args.model, args.size)
    work = Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    t0 = time.perf_counter()
    results = {b: ours(model, b, args, work) for b in ("hf", "vllm")}
    ref = None if args.skip_trl else trl(model, args, work)
    print(f"{what}, {args.prompts} prompts x {args.group} rollouts, "
          f"<= {args.max_tokens} tokens, {args.steps} steps (median of steps 2..)")
    for b, r in results.items():
        print(f"es-llm {b:5s}: step {r['step_s']:.2f} s (generation {r['gen_s']:.2f} s, training "
              f"{r['train_s']:.2f} s), {r['tokens_per_s']:.0f} completion tokens/s")
    print(f"vLLM rollouts vs HF rollouts: {results['hf']['step_s'] / results['vllm']['step_s']:.2f}x "
          f"faster per step")
    if ref is None:
        print("TRL: not measured (TRL is not installed, or --skip-trl)")
    else:
        print(f"TRL GRPOTrainer (transformers generation): step {ref['step_s']:.2f} s; es-llm hf "
              f"is {ref['step_s'] / results['hf']['step_s']:.2f}x faster per step")
    print(f"(benchmark wall time {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
