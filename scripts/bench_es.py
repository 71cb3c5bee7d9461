"""ES engine benchmarks, side by side in one run.

    python scripts/bench_es.py --size default --backend vllm --population 8 --prompts 64
    python scripts/bench_es.py --model-shape qwen2.5-0.5b --backend hf --skip-mpi
        --device cuda --dtype bfloat16 --noise-device cuda   (one line, on a GPU machine)

Measures (record the output in docs/benchmarks.md with the machine):
1. perturb + restore time as a share of one member's evaluation time, and the engine's
   own per-member weight cost (a mirrored pair: one noise draw, two writes, one restore);
2. keyed-noise generation throughput against a plain copy of the same number of bytes on
   the device that holds the master weights;
3. bytes that cross MPI per iteration (pickled rewards, see es_llm/comm/mpi.py) against the
   model size;
4. iteration time of `mpirun -n 2` against one process at the same population;
5. ES population throughput (samples/s) against plain generation of the same prompts and
   sample count on the same backend, without ES.

``--model-shape qwen2.5-0.5b`` benchmarks a randomly initialised model of Qwen2.5-0.5B's
shape instead of a testbed model: Llama architecture with its hidden size (896), depth (24),
heads (14 query, 2 key/value), MLP width (4864), vocabulary (151,936) and tied embeddings,
without its q/k/v biases (494M parameters). It uses the testbed's character tokenizer, so
its completions are random characters: rewards are 0 and only the timings mean anything.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from es_llm.backends.base import SamplingParams
from es_llm.comm.serial import SerialComm
from es_llm.es.config import ESRunConfig, ESSettings
from es_llm.es.engine import es_config, evaluate_members, prompt_batch
from es_llm.es.setup import build_edges
from es_llm.evaluate import resolve_training_data
from es_llm.tasks import TaskConfig
from es_llm.testbed.build import build_testbed
from es_llm.testbed.config import load_testbed_config
from populations import es as pes
from populations.noise import keyed_noise


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # CUDA work is asynchronous: time what finished


def qwen_shaped_model(out: Path, device: str, dtype: str) -> Path:
    """A random model of Qwen2.5-0.5B's shape (see the module docstring), saved with the
    testbed tokenizer and a countdown prompt file so the ES config can train on it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from es_llm.tasks.countdown import generate
    from es_llm.testbed.tokenizer import build_tokenizer
    from es_llm.testbed.train import record

    tok = build_tokenizer()
    config = LlamaConfig(vocab_size=151936, hidden_size=896, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                         max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    rng = random.Random(0)
    (out / "data").mkdir(exist_ok=True)
    rows = [json.dumps(record(generate(rng, 3)[0])) for _ in range(512)]
    (out / "data" / "countdown_rl.jsonl").write_text("\n".join(rows) + "\n")
    return out


def in_process(cfg: ESRunConfig, repeats: int) -> dict:
    edges, problems = build_edges(cfg, SerialComm())
    es_cfg = es_config(cfg)
    state = pes.init(es_cfg, edges.weights.master)
    members = pes.ask(es_cfg, state)
    eps_for = pes.noise_for(es_cfg, state)
    shapes = edges.weights.shapes()
    batch = prompt_batch(problems, cfg, 0)
    params = SamplingParams(n=1, temperature=0.0, max_tokens=cfg.max_tokens, seed=cfg.seed)
    prompts = [p.prompt for p in batch]
    sigma = cfg.es.sigma

    def noise(name, shape):
        return eps_for(1, name, shape)

    def pair():  # what evaluate_members does per mirrored pair, without the generation
        eps = {n: eps_for(1, n, s) for n, s in shapes.items()}
        edges.weights.perturb(lambda name, shape: eps[name], sigma)
        edges.weights.perturb(lambda name, shape: eps[name], -sigma)
        edges.weights.restore()

    t_perturb_restore = timed(lambda: (edges.weights.perturb(noise, sigma),
                                       edges.weights.restore()), repeats)
    t_pair = timed(pair, repeats)
    t_generate = timed(lambda: edges.backend.generate(prompts, params), repeats)
    device = next(iter(edges.weights.master.values())).device
    numel = sum(s.numel() for s in shapes.values())
    noise_rates = {}
    for where in ["cpu"] + (["cuda"] if device.type == "cuda" else []):
        draw = keyed_noise(cfg.seed, 0, device=where)
        t = timed(lambda: [draw(1, n, s) for n, s in shapes.items()], repeats)
        noise_rates[where] = numel * 4 / t / 1e6
    src, dst = torch.randn(numel, device=device), torch.empty(numel, device=device)
    t_copy = timed(lambda: dst.copy_(src), repeats)


    t_plain = timed(lambda: [edges.backend.generate(prompts, params) for _ in members], 1)
    t_es = timed(lambda: evaluate_members(edges, es_cfg, state, members, batch, cfg), 1)
    rewards = evaluate_members(edges, es_cfg, state, members, batch, cfg)
    # What crosses the wire in one exchange of 2 ranks (es_llm.comm.mpi): rank 1 sends rank 0
    # its members' rewards, rank 0 sends back every rank's.
    parts = [{n: r for n, r in rewards.items() if members[n].direction % 2 == rank}
             for rank in range(2)]
    edges.task.close()
    samples = len(members) * len(prompts)
    return {
        "parameters": numel, "device": str(device),
        "perturb_restore_s": t_perturb_restore, "member_generate_s": t_generate,
        "perturb_restore_share": t_perturb_restore / (t_generate + t_perturb_restore),
        "engine_member_s": t_pair / 2,
        "engine_member_share": (t_pair / 2) / (t_generate + t_pair / 2),
        "noise_MBps": noise_rates, "copy_MBps": numel * 4 / t_copy / 1e6,
        "mpi_part_bytes": len(pickle.dumps((1, parts[1]))),
        "mpi_all_bytes": len(pickle.dumps((1, parts))), "model_bytes": numel * 4,
        "es_samples_per_s": samples / t_es, "plain_samples_per_s": samples / t_plain,
    }


def iteration_times(model: str, cfg_args: list[str], ranks: int) -> float:
    out = Path(tempfile.mkdtemp(prefix="bench-es-"))
    cmd = [sys.executable, "-m", "es_llm", "es", "--out", str(out / "run"), "--no-progress",
           f"model={model}", *cfg_args]
    if ranks > 1:
        mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
        cmd = [mpirun, "-n", str(ranks), *cmd]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    return statistics.median(r["perf/iter_s"] for r in rows[1:])  # the first one warms up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["ci", "default"], default="default",
                    help="testbed preset (ignored with --model-shape qwen2.5-0.5b)")
    ap.add_argument("--model-shape", choices=["testbed", "qwen2.5-0.5b"], default="testbed",
                    help="benchmark a testbed model or a random model of Qwen2.5-0.5B's shape")
    ap.add_argument("--backend", choices=["hf", "vllm"], default="vllm", help="generation backend")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="device of the model and its fp32 master copy")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="dtype of the served model")
    ap.add_argument("--noise-device", choices=["cpu", "cuda"], default="cpu",
                    help="where the ES run draws its noise (item 2 measures both on a GPU)")
    ap.add_argument("--population", type=int, default=8, help="members per iteration")
    ap.add_argument("--prompts", type=int, default=64, help="prompts per member")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per completion")
    ap.add_argument("--iterations", type=int, default=4, help="iterations per timed run")
    ap.add_argument("--repeats", type=int, default=5, help="repeats of the micro timings")
    ap.add_argument("--skip-mpi", action="store_true", help="leave out item 4 (mpirun -n 2)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-es-model-"))
    if args.model_shape == "testbed":
        path, _ = build_testbed(load_testbed_config(args.size), progress=False)
        what = f"testbed {args.size}"
    else:
        path = qwen_shaped_model(tmp / "model", args.device, args.dtype)
        what = "random Qwen2.5-0.5B-shaped model"
    es_args = [f"backend={args.backend}", f"iterations={args.iterations}",
               f"es.population={args.population}", f"prompts_per_iteration={args.prompts}",
               f"max_tokens={args.max_tokens}", f"device={args.device}", f"dtype={args.dtype}",
               f"es.noise_device={args.noise_device}", "es.antithetic=true",
               "es.sigma=0.01", "es.lr=0.005", "checkpoint_every=1000"]
    if not args.skip_mpi:
        one = iteration_times(str(path), es_args, 1)  # one process uses both cores
        two = iteration_times(str(path), es_args, 2)  # one core per rank
    cfg = resolve_training_data(ESRunConfig(
        model=str(path), task=TaskConfig(name="countdown"), backend=args.backend,
        prompts_per_iteration=args.prompts, max_tokens=args.max_tokens, device=args.device,
        dtype=args.dtype,
        es=ESSettings(population=args.population, sigma=0.01, lr=0.005, antithetic=True,
                      noise_device=args.noise_device)))
    r = in_process(cfg, args.repeats)
    shutil.rmtree(tmp, ignore_errors=True)
    gpu = f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    print(f"{what} ({r['parameters']:,} evolving parameters), backend {args.backend}, "
          f"device {r['device']}{gpu}, {args.dtype}, noise on {args.noise_device}, "
          f"N={args.population} (mirrored), {args.prompts} prompts, {args.max_tokens} tokens, "
          f"greedy")
    print(f"1. perturb+restore {r['perturb_restore_s'] * 1e3:.1f} ms vs member generation "
          f"{r['member_generate_s'] * 1e3:.0f} ms: {100 * r['perturb_restore_share']:.2f}% of a "
          f"member's evaluation; the engine's weight cost per member (pair / 2) "
          f"{r['engine_member_s'] * 1e3:.1f} ms: {100 * r['engine_member_share']:.2f}%")
    for where, rate in r["noise_MBps"].items():
        print(f"2. keyed noise on {where} {rate:,.0f} MB/s vs copy on {r['device']} "
              f"{r['copy_MBps']:,.0f} MB/s: {100 * rate / r['copy_MBps']:.1f}% of copy bandwidth")
    wire = r["mpi_part_bytes"] + r["mpi_all_bytes"]
    print(f"3. MPI bytes per iteration with 2 ranks: rank 1 sends {r['mpi_part_bytes']:,} (its "
          f"members' rewards) and receives {r['mpi_all_bytes']:,} (every member's), {wire:,} in "
          f"all, vs model {r['model_bytes']:,} bytes (fp32): ratio {wire / r['model_bytes']:.2e} "
          f"(grows with N x prompts and the rank count, not with model size)")
    if not args.skip_mpi:
        print(f"4. iteration time: 1 process {one:.2f} s, mpirun -n 2 {two:.2f} s: "
              f"{one / two:.2f}x faster with 2 ranks")
    print(f"5. ES {r['es_samples_per_s']:.0f} samples/s vs plain generation "
          f"{r['plain_samples_per_s']:.0f} samples/s: {r['es_samples_per_s'] / r['plain_samples_per_s']:.2f}x")


if __name__ == "__main__":
    main()
