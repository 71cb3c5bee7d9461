"""ES engine benchmarks, side by side in one run.

    python scripts/bench_es.py --size default --backend vllm --population 8 --prompts 64
    python scripts/bench_es.py --model-shape qwen2.5-0.5b --backend hf --skip-mpi
        --device cuda --dtype bfloat16 --noise-device cuda   (one line, on a GPU machine)

Measures (record the output in docs/benchmarks.md with the machine):
1. the engine's cost beyond generation per member, as a share of one member's evaluation
   time: an evaluation of the N members (a noise draw per mirrored pair on every core, a
   write per member, one restore, scoring) with generation replayed from a recording,
   divided by N; and one member's perturb + restore taken alone (noise drawn on one thread);
2. keyed-noise generation throughput against a plain copy of the same number of bytes on
   the device that holds the master weights;
3. bytes that cross MPI per iteration (pickled rewards, see es_llm/comm/mpi.py) against the
   model size;
4. iteration time of `mpirun -n 2` against one process at the same population;
5. ES population throughput (samples/s) against plain generation of the same prompts and
   sample count on the same backend, without ES;
10. with ``--backend vllm``: es-llm's iteration (``es_llm.es.engine.step``: evaluation,
   update, metrics) against the shortest full-rank ES loop over the same vLLM engine
   (``scripts/plain_vllm_es.py``), from the same weights, with the same members and prompts,
   alternately, and whether the two gave the same rewards and bitwise the same update.

``--lowrank`` measures low-rank ES instead (es.kind=lowrank, engine.serve=rows, HF backend):
6. population throughput against plain batched generation of the same sequences in the
   same batches, without the member terms;
7. low-rank against full-rank ES at the same population and prompts per member, in
   generated samples per second (full rank writes each member's weights);
8. peak resident memory of one iteration (evaluation and update) at ``--peak-population``
   members, in a fresh process, against the same process after loading the model;
9. with ``--vllm-lora``: the population served by vLLM as one LoRA adapter per member,
   against plain vLLM generation of the same sequences and the HF rows path.

``--model-shape qwen2.5-0.5b`` benchmarks a randomly initialised model of Qwen2.5-0.5B's
shape instead of a testbed model: Llama architecture with its hidden size (896), depth (24),
heads (14 query, 2 key/value), MLP width (4864), vocabulary (151,936) and tied embeddings,
without its q/k/v biases (494M parameters). It uses the testbed's character tokenizer, so
its completions are random characters: rewards are 0 and only the timings mean anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
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
from es_llm.es.config import EngineSettings, ESRunConfig
from es_llm.es.engine import (evaluate_members, generated_tokens, member_prompts,
                              prompt_batch, step)
from es_llm.es.setup import build_edges
from es_llm.models import resolve_training_data
from es_llm.runtime import Runtime
from es_llm.tasks import TaskConfig
from es_llm.testbed.build import model_or_testbed
from populations import es as pes
from populations import lowrank
from populations.noise import keyed_noise

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plain_vllm_es  # noqa: E402


def at_least_one(text: str) -> int:
    """A count of repeats from the command line (argparse exits 2 on anything else)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs a whole number of at least 1, got {text!r}")
    return value


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed_side_by_side(fns, repeats: int) -> list[float]:
    """Median seconds of each of ``fns``, run in turn within each repeat, so that a slow
    spell of a shared machine falls on all of them rather than on one."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, t in zip(fns, times):
            t.append(timed(fn, 1))
    return [statistics.median(t) for t in times]


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


def in_process(cfg: ESRunConfig, repeats: int, loop_repeats: int) -> dict:
    edges, problems = build_edges(cfg, SerialComm())
    state = pes.init(cfg.es, edges.weights.master, cfg.seed)
    members = pes.ask(cfg.es, state)
    eps_for = pes.noise_for(cfg.es, state)
    shapes = edges.weights.shapes()
    batch = prompt_batch(problems, cfg, 0)
    params = SamplingParams(n=1, temperature=0.0, max_tokens=cfg.max_tokens, seed=cfg.seed)
    prompts = [p.prompt for p in batch]
    sigma = cfg.es.sigma

    def noise(name, shape):
        return eps_for(1, name, shape)

    t_perturb_restore = timed(lambda: (edges.weights.perturb(noise, +1, sigma),
                                       edges.weights.restore()), repeats)
    costs = weight_parts(edges, eps_for, sigma, repeats)
    t_generate = timed(lambda: edges.backend.generate(prompts, params), repeats)
    t_engine = engine_beyond_generation(edges, state, members, batch, cfg, repeats)
    device = next(iter(edges.weights.master.values())).device
    numel = sum(s.numel() for s in shapes.values())
    noise_rates = {}
    for where in ["cpu"] + (["cuda"] if device.type == "cuda" else []):
        draw = keyed_noise(cfg.seed, 0, device=where)
        t = timed(lambda: [draw(1, n, s) for n, s in shapes.items()], repeats)
        noise_rates[where] = numel * 4 / t / 1e6
    src, dst = torch.randn(numel, device=device), torch.empty(numel, device=device)
    t_copy = timed(lambda: dst.copy_(src), repeats)
    del src, dst
    t_plain = timed(lambda: [edges.backend.generate(prompts, params) for _ in members], 1)
    t_es = timed(lambda: evaluate_members(edges, state, members, batch, cfg), 1)
    rewards = evaluate_members(edges, state, members, batch, cfg)
    loop = (against_plain_loop(edges, state, problems, cfg, loop_repeats)
            if cfg.backend == "vllm" else None)
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
        "engine_member_s": t_engine / len(members),
        "engine_member_share": (t_engine / len(members)) / (t_generate + t_engine / len(members)),
        "noise_MBps": noise_rates, "copy_MBps": numel * 4 / t_copy / 1e6,
        "mpi_part_bytes": len(pickle.dumps((1, parts[1]))),
        "mpi_all_bytes": len(pickle.dumps((1, parts))), "model_bytes": numel * 4,
        "es_samples_per_s": samples / t_es, "plain_samples_per_s": samples / t_plain,
        **costs, "noise_s": numel * 4 / 1e6 / noise_rates[cfg.es.noise_device],
        "plain_loop": loop,
    }


class Replayed:
    """A backend that answers each generate call with what ``backend`` answered to the same
    prompts once before: the engine's evaluation then costs what it adds to generation."""

    def __init__(self, backend):
        self.backend = backend
        self.answers = {}

    def generate(self, prompts, params, keys=None):
        key = tuple(prompts)
        if key not in self.answers:
            self.answers[key] = self.backend.generate(prompts, params, keys=keys)
        return self.answers[key]


def engine_beyond_generation(edges, state, members, batch, cfg: ESRunConfig, repeats: int
                             ) -> float:
    """Item 1, the engine's share: seconds of one ``evaluate_members`` of ``members`` (every
    direction's noise drawn as the engine draws it, each member written, the master restored
    once, each member scored) with generation replayed (``Replayed``), median of ``repeats``."""
    replayed = dataclasses.replace(edges, backend=Replayed(edges.backend))
    evaluate_members(replayed, state, members, batch, cfg)  # records the answers
    return timed(lambda: evaluate_members(replayed, state, members, batch, cfg), repeats)


def weight_parts(edges, eps_for, sigma: float, repeats: int) -> dict:
    """Item 1 in parts, in seconds: writing a member from noise already drawn, and restoring
    the master (item 2 times the draw)."""
    eps = {n: eps_for(1, n, s) for n, s in edges.weights.shapes().items()}
    t_write = timed(lambda: edges.weights.perturb(lambda name, shape: eps[name], +1, sigma),
                    repeats)
    t_restore = timed(edges.weights.restore, repeats)
    return {"write_s": t_write, "restore_s": t_restore}


def against_plain_loop(edges, state, problems, cfg: ESRunConfig, repeats: int) -> dict:
    """Item 10: es-llm's iteration (``step``) and the plain loop's from the same state on the
    same engine, alternately, ``repeats`` times each (medians); and whether their rewards and
    updates agree bitwise."""
    batch = prompt_batch(problems, cfg, state.iteration)

    def score(texts):
        return [s.reward for s in edges.task.score_many(list(zip(batch, texts)))]

    def plain():
        return plain_vllm_es.iteration(
            edges.backend.llm, state.params, [p.prompt for p in batch], score, seed=state.seed,
            step=state.iteration, population=cfg.es.population, sigma=cfg.es.sigma,
            lr=cfg.es.lr, max_tokens=cfg.max_tokens)

    times = {"es_llm": [], "plain": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        new_state, metrics, ledger = step(edges, state, problems, cfg)
        times["es_llm"].append(time.perf_counter() - t0)
        edges.weights.set_master(state.params)  # the next repeat starts from the same weights
        t0 = time.perf_counter()
        theta, rewards = plain()
        times["plain"].append(time.perf_counter() - t0)
    same_rewards = ledger["rewards_N_P"] == rewards.tolist()
    same_update = all(torch.equal(theta[n], new_state.params[n]) for n in theta)
    return {"es_llm_s": statistics.median(times["es_llm"]),
            "plain_s": statistics.median(times["plain"]),
            "same_rewards": same_rewards, "same_update": same_update}


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


def lowrank_cfg(model: str, args, population: int) -> ESRunConfig:
    """The low-rank run a measurement uses: each mirrored pair on its own prompts, 4 pairs
    per prompt (as EGGROLL scores 8 members per prompt)."""
    k = args.prompts_per_member
    return resolve_training_data(ESRunConfig(
        model=model, task=TaskConfig(name="countdown"), backend="hf",
        runtime=Runtime(device=args.device, dtype=args.dtype), max_tokens=args.max_tokens,
        prompts_per_iteration=max(k, population // 8 * k),
        es=pes.ESConfig(population=population, sigma=0.01, lr=0.005, antithetic=True,
                        kind="lowrank", rank=args.rank, noise_device=args.noise_device),
        engine=EngineSettings(serve="rows", prompts_per_member=k,
                              members_per_call=args.members_per_call)))


def setup_of(cfg: ESRunConfig):
    """The run's edges, and iteration 0's state, members and prompt batch."""
    edges, problems = build_edges(cfg, SerialComm())
    state = pes.init(cfg.es, edges.weights.master, cfg.seed)
    return edges, state, pes.ask(cfg.es, state), prompt_batch(problems, cfg, 0)


def lowrank_setup(model: str, args, population: int):
    """The low-rank run, its edges, and iteration 0's state, members and prompt batch."""
    cfg = lowrank_cfg(model, args, population)
    return (cfg, *setup_of(cfg))


def member_rows(cfg: ESRunConfig, members, batch) -> list[str]:
    """Every member's prompts, member after member: the rows a population generates."""
    assigned = member_prompts(members, len(batch), cfg.engine.prompts_per_member)
    return [batch[i].prompt for m in members for i in assigned[m.index]]


def plain_batched(backend, rows: list[str], params: SamplingParams, per_call: int) -> list:
    """The same rows generated without ES, in calls of ``per_call`` rows (the baseline);
    returns one completion per row."""
    return [c[0] for start in range(0, len(rows), per_call)
            for c in backend.generate(rows[start:start + per_call], params)]


def full_rank_of(cfg: ESRunConfig) -> ESRunConfig:
    """``cfg`` as full-rank ES: each member's weights written, then its prompts generated
    (the only way full-rank members can be served)."""
    return dataclasses.replace(cfg, es=dataclasses.replace(cfg.es, kind="full"),
                               engine=dataclasses.replace(cfg.engine, serve="weights"))


def lowrank_throughput(model: str, args) -> dict:
    """Items 6 and 7 at ``--population`` members."""
    cfg, edges, state, members, batch = lowrank_setup(model, args, args.population)
    params = SamplingParams(n=1, temperature=0.0, max_tokens=cfg.max_tokens, seed=cfg.seed)
    rows = member_rows(cfg, members, batch)
    per_call = cfg.engine.members_per_call * cfg.engine.prompts_per_member

    def plain():
        return plain_batched(edges.backend, rows, params, per_call)

    # Warm up, and count what each generates: members can stop later (or sooner) than the
    # base model on the same prompts, and a batched call runs until its longest row ends.
    plain_tokens = sum(len(c.token_ids) for c in plain())
    rows_tokens = generated_tokens(evaluate_members(edges, state, members, batch, cfg))
    t_plain, t_rows = timed_side_by_side(
        [plain, lambda: evaluate_members(edges, state, members, batch, cfg)], args.repeats)
    rewards_N_P = torch.rand(len(members), cfg.engine.prompts_per_member, dtype=torch.float64,
                             generator=torch.Generator().manual_seed(0))
    t_tell = timed(lambda: pes.tell(cfg.es, state, rewards_N_P), args.repeats)
    # Full rank at the same members and prompts.
    full = full_rank_of(cfg)
    f_edges, _ = build_edges(full, SerialComm())
    f_state = pes.init(full.es, f_edges.weights.master, full.seed)
    t_full = timed(lambda: evaluate_members(f_edges, f_state, members, batch, full), 1)
    for e in (edges, f_edges):
        e.task.close()
    return {"parameters": sum(t.numel() for t in edges.weights.master.values()),
            "samples": len(rows), "rows_s": t_rows, "plain_s": t_plain, "full_s": t_full,
            "tell_s": t_tell, "per_call": per_call, "plain_tokens": plain_tokens,
            "rows_tokens": rows_tokens["tokens/iteration"]}


def peak_memory_child(model: str, args) -> None:
    """Item 8, run as its own process: one low-rank iteration at ``--peak-population``."""
    import resource

    cfg, edges, state, members, batch = lowrank_setup(model, args, args.peak_population)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    out = evaluate_members(edges, state, members, batch, cfg)
    t_eval = time.perf_counter() - t0
    rewards_N_P = torch.tensor([out[n][0] for n in range(len(members))], dtype=torch.float64)
    groups_N_P = torch.tensor(member_prompts(members, len(batch), cfg.engine.prompts_per_member))
    t0 = time.perf_counter()
    pes.tell(cfg.es, state, rewards_N_P, groups_N_P)
    print(json.dumps({"loaded_kb": loaded, "peak_kb": resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss, "eval_s": t_eval, "tell_s": time.perf_counter() - t0,
        "samples": rewards_N_P.numel()}))
    edges.task.close()


def vllm_lora_throughput(model: str, args, tmp: Path) -> dict:
    """Item 9: the population as one vLLM LoRA adapter per member (the published EGGROLL
    code for transformer LLMs), against plain generation in the same engine. Adapters are
    written in PEFT format from the same keyed factors on the linear layers (lora_A = B^T,
    lora_B = sign sigma A / sqrt(r), alpha = r so the scale is 1); the embedding is left out,
    as vLLM's LoRA does not cover a tied embedding."""
    from safetensors.torch import save_file

    from es_llm.backends import BackendSpec, make_backend

    cfg, edges, state, members, batch = lowrank_setup(model, args, args.population)
    assigned = member_prompts(members, len(batch), cfg.engine.prompts_per_member)
    linear = [n for n in edges.rows.matrices if "embed" not in n]
    targets = sorted({n.split(".")[-2] for n in linear})
    factors_for = lowrank.keyed_factors(cfg.seed, 0, args.rank)
    scale = cfg.es.sigma / math.sqrt(args.rank)
    paths = []
    t0 = time.perf_counter()
    for m in members:
        folder = tmp / "adapters" / f"m{m.index}"
        folder.mkdir(parents=True)
        tensors = {}
        for n in linear:
            A, B = factors_for(m.direction, n, edges.weights.master[n].shape)
            stem = "base_model.model." + n.removesuffix(".weight")
            tensors[f"{stem}.lora_A.weight"] = B.T.contiguous()
            tensors[f"{stem}.lora_B.weight"] = (A * (m.sign * scale)).contiguous()
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": args.rank,
            "lora_alpha": args.rank, "target_modules": targets, "bias": "none",
            "base_model_name_or_path": model}))
        paths.append(folder)
    t_write = time.perf_counter() - t0
    edges.task.close()
    from vllm import SamplingParams as VSP
    from vllm.lora.request import LoRARequest

    lora = {"enable_prefix_caching": False, "enable_lora": True,
            "max_loras": args.members_per_call,
            "max_lora_rank": next(r for r in VLLM_LORA_RANKS if r >= args.rank)}
    backend = make_backend(BackendSpec(model, backend="vllm", runtime=Runtime(dtype=args.dtype),
                                       engine_args=lora))
    rows = [(m, batch[i].prompt) for m in members for i in assigned[m.index]]
    params = VSP(temperature=0.0, max_tokens=args.max_tokens)
    per_call = args.members_per_call * cfg.engine.prompts_per_member

    def plain():
        texts = []
        for s in range(0, len(rows), per_call):
            outs = backend.llm.generate([p for _, p in rows[s:s + per_call]], params,
                                        use_tqdm=False)
            texts += [o.outputs[0].text for o in outs]
        return texts

    def lora(step=[0]):  # a fresh adapter id per pass, as the published code uses per step
        step[0] += 1
        texts = []
        for s in range(0, len(rows), per_call):
            chunk = rows[s:s + per_call]
            requests = [LoRARequest(f"m{m.index}-{step[0]}", step[0] * 100000 + m.index + 1,
                                    str(paths[m.index])) for m, _ in chunk]
            outs = backend.llm.generate([p for _, p in chunk], params, lora_request=requests,
                                        use_tqdm=False)
            texts += [o.outputs[0].text for o in outs]
        return texts

    # Warm up, and check the adapters act: some members' texts must differ from the base's.
    differs = sum(a != b for a, b in zip(plain(), lora())) / len(rows)
    t_plain = timed(plain, args.repeats)
    t_lora = timed(lora, args.repeats)
    return {"samples": len(rows), "plain_s": t_plain, "lora_s": t_lora, "write_s": t_write,
            "differs": differs}


# The adapter ranks vLLM's engine accepts as max_lora_rank; smaller adapters are padded.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lowrank_report(path: Path, what: str, args) -> None:
    r = lowrank_throughput(str(path), args)
    child = subprocess.run([sys.executable, __file__, "--lowrank", "--peak-child", str(path),
                            *sys.argv[1:]], check=True, capture_output=True, text=True)
    v = None
    if args.vllm_lora:  # in a fresh process: vLLM cannot start where evotorch was imported
        child_v = subprocess.run([sys.executable, __file__, "--lowrank", "--vllm-lora-child",
                                  str(path), *sys.argv[1:]], check=True, capture_output=True,
                                 text=True)
        v = json.loads(child_v.stdout.strip().splitlines()[-1])
    peak = json.loads(child.stdout.strip().splitlines()[-1])
    print(f"{what} ({r['parameters']:,} evolving parameters), low-rank r={args.rank}, backend hf, "
          f"device {args.device}, {args.dtype}, N={args.population} (mirrored), "
          f"{args.prompts_per_member} prompts per pair, {r['per_call']} rows per call, "
          f"{args.max_tokens} tokens, greedy")
    print(f"6. low-rank population {r['samples'] / r['rows_s']:.0f} samples/s vs plain batched "
          f"generation {r['samples'] / r['plain_s']:.0f} samples/s: "
          f"{r['plain_s'] / r['rows_s']:.2f}x (target at least 0.9x; update {r['tell_s']:.2f} s "
          f"per iteration); in tokens {r['rows_tokens'] / r['rows_s']:.0f} vs "
          f"{r['plain_tokens'] / r['plain_s']:.0f} tokens/s: "
          f"{r['rows_tokens'] / r['rows_s'] / (r['plain_tokens'] / r['plain_s']):.2f}x")
    print(f"7. low-rank {r['samples'] / r['rows_s']:.0f} samples/s vs full-rank "
          f"{r['samples'] / r['full_s']:.1f} samples/s at N={args.population}: "
          f"{r['full_s'] / r['rows_s']:.1f}x (target at least 5x at N=256)")
    print(f"8. N={args.peak_population}: peak RSS {peak['peak_kb'] / 1024:,.0f} MiB vs "
          f"{peak['loaded_kb'] / 1024:,.0f} MiB after loading ({peak['samples']:,} samples: "
          f"evaluation {peak['eval_s']:.1f} s, update {peak['tell_s']:.1f} s)")
    if v:
        print(f"9. vLLM multi-LoRA (one adapter per member) {v['samples'] / v['lora_s']:.0f} "
              f"samples/s vs plain vLLM {v['samples'] / v['plain_s']:.0f} samples/s: "
              f"{v['plain_s'] / v['lora_s']:.2f}x; vs the HF rows path "
              f"{r['samples'] / r['rows_s']:.0f} samples/s: "
              f"{r['rows_s'] / v['lora_s'] * v['samples'] / r['samples']:.2f}x "
              f"(writing {args.population} adapters took {v['write_s']:.1f} s; "
              f"{100 * v['differs']:.0f}% of member texts differ from the base model's)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["ci", "default", "habits"], default="default",
                    help="testbed preset (ignored with --model-shape qwen2.5-0.5b)")
    ap.add_argument("--model-shape", choices=["testbed", "qwen2.5-0.5b"], default="testbed",
                    help="benchmark a testbed model or a random model of Qwen2.5-0.5B's shape")
    ap.add_argument("--model", help="benchmark this model folder (e.g. a built testbed) instead "
                                    "of building --size")
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
    ap.add_argument("--repeats", type=at_least_one, default=5, help="repeats of the micro timings")
    ap.add_argument("--loop-repeats", type=at_least_one, metavar="N",
                    help="item 10: alternations of the two loops (default: --repeats); each "
                         "is a whole iteration, long at large evaluation sizes")
    ap.add_argument("--skip-mpi", action="store_true", help="leave out item 4 (mpirun -n 2)")
    ap.add_argument("--lowrank", action="store_true",
                    help="measure low-rank ES (items 6-8) instead of items 1-5")
    ap.add_argument("--rank", type=int, default=1, help="low-rank: rank r of the perturbations")
    ap.add_argument("--prompts-per-member", type=int, default=4,
                    help="low-rank: prompts each mirrored pair is scored on")
    ap.add_argument("--members-per-call", type=int, default=64,
                    help="low-rank: members in one batched generate call")
    ap.add_argument("--peak-population", type=int, default=4096,
                    help="low-rank: population of the peak-memory measurement (item 8)")
    ap.add_argument("--vllm-lora", action="store_true",
                    help="low-rank: also measure the population as vLLM LoRA adapters (item 9)")
    ap.add_argument("--peak-child", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--vllm-lora-child", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peak_child:
        return peak_memory_child(args.peak_child, args)
    if args.vllm_lora_child:
        with tempfile.TemporaryDirectory(prefix="bench-es-lora-") as tmp:
            print(json.dumps(vllm_lora_throughput(args.vllm_lora_child, args, Path(tmp))))
        return

    tmp = Path(tempfile.mkdtemp(prefix="bench-es-model-"))
    if args.model or args.model_shape == "testbed":
        path, what = model_or_testbed(args.model, args.size)
    else:
        path = qwen_shaped_model(tmp / "model", args.device, args.dtype)
        what = "random Qwen2.5-0.5B-shaped model"
    if args.lowrank:
        lowrank_report(path, what, args)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    es_args = [f"backend={args.backend}", f"iterations={args.iterations}",
               f"es.population={args.population}", f"prompts_per_iteration={args.prompts}",
               f"max_tokens={args.max_tokens}", f"runtime.device={args.device}",
               f"runtime.dtype={args.dtype}",
               f"es.noise_device={args.noise_device}", "es.antithetic=true",
               "es.sigma=0.01", "es.lr=0.005", "checkpoint_every=1000"]
    if not args.skip_mpi:
        one = iteration_times(str(path), es_args, 1)  # one process uses both cores
        two = iteration_times(str(path), es_args, 2)  # one core per rank
    cfg = resolve_training_data(ESRunConfig(
        model=str(path), task=TaskConfig(name="countdown"), backend=args.backend,
        prompts_per_iteration=args.prompts, max_tokens=args.max_tokens,
        runtime=Runtime(device=args.device, dtype=args.dtype),
        es=pes.ESConfig(population=args.population, sigma=0.01, lr=0.005, antithetic=True,
                        noise_device=args.noise_device)))
    loop_repeats = args.repeats if args.loop_repeats is None else args.loop_repeats
    r = in_process(cfg, args.repeats, loop_repeats)
    shutil.rmtree(tmp, ignore_errors=True)
    gpu = f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    print(f"{what} ({r['parameters']:,} evolving parameters), backend {args.backend}, "
          f"device {r['device']}{gpu}, {args.dtype}, noise on {args.noise_device}, "
          f"N={args.population} (mirrored), {args.prompts} prompts, {args.max_tokens} tokens, "
          f"greedy")
    print(f"1. perturb+restore {r['perturb_restore_s'] * 1e3:.1f} ms vs member generation "
          f"{r['member_generate_s'] * 1e3:.0f} ms: {100 * r['perturb_restore_share']:.2f}% of a "
          f"member's evaluation; the engine's cost beyond generation per member (an evaluation "
          f"of N members with generation replayed, / N) {r['engine_member_s'] * 1e3:.1f} ms: "
          f"{100 * r['engine_member_share']:.2f}% (target under 5%)"
          f"; in parts: noise draw {r['noise_s'] * 1e3:.1f} ms, write of drawn noise "
          f"{r['write_s'] * 1e3:.1f} ms, restore {r['restore_s'] * 1e3:.1f} ms")
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
    loop = r["plain_loop"]
    if loop:
        print(f"10. es-llm iteration {loop['es_llm_s']:.2f} s vs plain vLLM loop "
              f"{loop['plain_s']:.2f} s: {loop['es_llm_s'] / loop['plain_s']:.3f}x (target <= "
              f"1.05x); same rewards: {loop['same_rewards']}, bitwise the same update: "
              f"{loop['same_update']}")


if __name__ == "__main__":
    main()
