"""The controlled pretraining-to-post-training study in one command: a grid of testbed builds
over model size and pretraining steps, each build's loss on a held-out stream, an SFT stage on
worked traces where the domain has them, a fixed-budget GRPO run and a fixed-budget ES run
from every build, every model evaluated on the domain's held-out set (the base twice, on two
sampling seeds: the second draw picks the problems the base never solves), and the analysis
(``es_llm.compare.scaling``): post-training accuracy against pretraining loss, reward-curve
slopes and held-out gains against pretraining tokens, and the change per problem by the
base model's probability of the reference answer.

    python scripts/scaling_study.py --config configs/scaling_countdown.yaml --out runs/scaling

Each stage is a plain `es-llm` command (printed, appended to OUT/commands.txt) and is skipped
when its output is complete, so rerunning the command finishes an interrupted study (a build
already there must have been made with the study's config, or the study stops before
anything runs, as it does when OUT's finished stages were made with other SFT, training or
evaluation settings). Writes OUT/builds/<cell>/ (the build and study.json: held-out loss,
tokens, the base's reference log-probabilities), OUT/sft/<cell>/,
OUT/runs/<cell>/<method>-seed<k>/, OUT/eval/<cell>/<model>/, OUT/stage_times.jsonl (each
stage's seconds) and the report in OUT/report/ (report.md, report.html, figures/,
scaling.json with every number).

Training seed k of a build trains with a run seed drawn from the build's name and k
(``batch_order: per_cell``), so builds do not share prompt batches; ``shared`` gives every
build seed k. With ``calibration.cell`` set, that build runs first, and the study stops
(exit 2, OUT/calibration.json written, no other build started) unless the post-training gain
there has a 95% interval above 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from es_llm.config import dump_yaml, load_config, to_dict
from es_llm.errors import BadInput
from es_llm.io import (complete_jsonl_rows, read_jsonl, write_json_atomic, write_jsonl_atomic,
                       write_text_atomic)
from es_llm.run_folder import check_out_path
from es_llm.stage_runner import Runner, es_llm_command, finished, stage_seconds
from es_llm.studies import ScalingConfig
from es_llm.testbed.config import load_testbed_config
from es_llm.testbed.scaling import DOMAINS

ROOT = Path(__file__).resolve().parents[1]


def build_overrides(cfg: ScalingConfig, size: str, steps: int) -> list[str]:
    """The testbed overrides of one build: the shape and steps of the studied model."""
    section = DOMAINS[cfg.domain]
    prefix = f"{section}." if section else ""
    shape = to_dict(cfg.sizes[size])
    out = list(cfg.testbed_overrides) + ([f"{section}.enabled=true"] if section else [])
    out += [f"{prefix}model.{k}={v}" for k, v in shape.items()]
    return out + [f"{prefix}train.steps={steps}"]


def check(cfg: ScalingConfig, out: Path | None = None) -> None:
    """Before any command runs: every build's testbed config and the two training configs
    load, the evaluation backend is there, and a build already in ``out`` was made with
    this study's config (else its runs and evaluations would be reused under the wrong
    name)."""
    from es_llm.backends import require_vllm
    from es_llm.es.config import ESRunConfig
    from gradient.config import GRPORunConfig

    if cfg.eval_backend == "vllm":
        require_vllm()
    for size in cfg.sizes:
        for steps in cfg.pretrain_steps:
            tb = load_testbed_config(cfg.testbed, None, build_overrides(cfg, size, steps))
            built = out / "builds" / f"{size}-{steps}" / "testbed.yaml" if out else None
            if built is not None and built.is_file() and built.read_text() != dump_yaml(tb):
                raise BadInput(f"{built.parent} was built with another testbed config than "
                               f"this study gives {size}-{steps} (sizes, pretrain_steps or "
                               f"testbed_overrides changed); use another --out, or remove "
                               f"that cell's builds/, sft/, runs/ and eval/ folders.")
    load_config(GRPORunConfig, path=ROOT / cfg.grpo.config, overrides=list(cfg.grpo.overrides))
    load_config(ESRunConfig, path=ROOT / cfg.es.config, overrides=list(cfg.es.overrides))
    check_reused_stages(cfg, out)


# Settings whose change makes every finished SFT run, training run, evaluation or study.json
# in an existing --out stale; sizes, pretrain_steps and seeds only add or drop cells.
STAGE_SETTINGS = ("domain", "heldout_examples", "sft", "grpo", "es", "eval", "eval_limit",
                  "batch_order")


def check_reused_stages(cfg: ScalingConfig, out: Path | None) -> None:
    """Refuse an ``out`` whose finished stages were made under other stage settings: they
    would be reused and reported as this config's."""
    previous = out / "scaling.yaml" if out else None
    if previous is None or not previous.is_file():
        return
    import yaml

    # A study written before batch_order existed gave every build the same batches.
    before = {"batch_order": "shared", **(yaml.safe_load(previous.read_text()) or {})}
    now = to_dict(cfg)
    changed = [key for key in STAGE_SETTINGS if before.get(key) != now[key]]
    if changed:
        raise BadInput(f"{out} holds a study run with other {', '.join(changed)} than this "
                       f"config gives (see {previous}); its finished stages would be reused "
                       f"under the new settings. Use another --out, or set them back; "
                       f"settings that may change between reruns: sizes, pretrain_steps, "
                       f"seeds, more_seeds, more_seeds_for, ranks, eval_backend, bootstrap, "
                       f"calibration.")


def run_seed(cfg: ScalingConfig, cell: str, seed: int) -> int:
    """The trainer's seed for training seed ``seed`` of ``cell`` (``batch_order``): ``seed``
    itself when builds share batch orders, else a 31-bit number drawn from both."""
    if cfg.batch_order == "shared":
        return seed
    digest = hashlib.blake2b(f"{cell}:{seed}".encode(), digest_size=4,
                             person=b"es-llm/batches").digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def measure(cfg: ScalingConfig, build: Path, base: Path, size: str, steps: int) -> dict:
    """study.json of a build: parameters, held-out-stream loss, tokens, and the base's
    log-probability of every evaluated problem's reference answer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from es_llm.tasks import TaskConfig, build_task
    from es_llm.testbed.scaling import heldout_loss, reference_logprobs, stream

    tb = load_testbed_config(cfg.testbed, None, build_overrides(cfg, size, steps))
    model = AutoModelForCausalLM.from_pretrained(build, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(build)
    loss, per_example = heldout_loss(model, tokenizer, stream(cfg.domain, tb),
                                     cfg.heldout_examples, tb.seed)
    schedule = getattr(tb, DOMAINS[cfg.domain]).train if DOMAINS[cfg.domain] else tb.train
    task = build_task(TaskConfig(name=cfg.domain, data=str(build / "data" /
                                                           f"{cfg.domain}_eval.jsonl"),
                                 limit=cfg.eval_limit))
    problems = task.problems()
    task.close()
    return {"cell": f"{size}-{steps}", "size": size, "steps": steps,
            "parameters": sum(p.numel() for p in model.parameters()),
            "heldout_loss": loss, "tokens_per_example": per_example,
            "tokens": steps * schedule.batch_size * per_example,
            "problem_ids": [p.id for p in problems],
            "reference_logp": reference_logprobs(base, problems)}


def _eval(cfg: ScalingConfig, model: Path, data: Path, out: Path, run, seed: int) -> None:
    """``es-llm eval`` of one model with sampling seed ``seed``; in this process when
    transformers serves it (vLLM engines share process-wide state, so a vLLM evaluation gets
    a process of its own)."""
    if (out / "metrics.json").is_file():
        return
    from es_llm.backends import choose_backend
    from es_llm.evaluate import EvalConfig, evaluate
    from es_llm.tasks import TaskConfig

    e = replace(cfg.eval, seed=seed)
    cmd = es_llm_command("eval") + [
        "--model", model, "--task", cfg.domain, "--data", data, "--n", e.n, "--temperature",
        e.temperature, "--top-p", e.top_p, "--max-tokens", e.max_tokens, "--seed", e.seed,
        "--backend", cfg.eval_backend, "--out", out, "--no-progress"]
    cmd += ["--limit", cfg.eval_limit] if cfg.eval_limit else []
    if choose_backend(cfg.eval_backend, str(model)) != "hf":
        return run(cmd)
    with run.inline("eval", cmd):
        evaluate(EvalConfig(model=str(model), task=TaskConfig(name=cfg.domain, data=str(data),
                                                              limit=cfg.eval_limit),
                            sampling=e, backend="hf"),
                 out, progress=False, echo=lambda *_: None)


def run_cell(cfg: ScalingConfig, out: Path, size: str, steps: int, run) -> dict:
    """Every stage of one build; its collected numbers."""
    from es_llm.compare.scaling import NULL_ARM

    cell = f"{size}-{steps}"
    folder = out / "builds" / cell
    if not (folder / "testbed.json").is_file():
        # In this process (the build samples with transformers only): the recorded command
        # gives the same folder.
        from es_llm.testbed.build import build_testbed

        overrides = build_overrides(cfg, size, steps)
        with run.inline("testbed", es_llm_command("testbed") + [
                "--size", cfg.testbed, "--out", folder, "--no-progress", *overrides]):
            build_testbed(load_testbed_config(cfg.testbed, None, overrides), folder,
                          progress=False, echo=lambda *_: None)
    build = folder / DOMAINS[cfg.domain]
    base = build
    if cfg.sft.enabled and cfg.domain == "countdown":
        base = out / "sft" / cell / "checkpoints" / "final"
        if not base.is_dir():
            shutil.rmtree(out / "sft" / cell, ignore_errors=True)
            s = cfg.sft
            run(es_llm_command("sft") + [
                "--config", ROOT / "configs" / "sft_countdown.yaml", "--out", out / "sft" / cell,
                "--no-progress", f"model={build}", f"data={out / 'sft_traces.jsonl'}",
                f"epochs={s.epochs}", f"batch_size={s.batch_size}", f"optim.lr={s.lr}"])
    if not (folder / "study.json").is_file():
        with run.inline("measure", f"measure {cell}"):
            write_json_atomic(folder / "study.json", measure(cfg, build, base, size, steps))
    study = json.loads((folder / "study.json").read_text())
    data = build / "data" / f"{cfg.domain}_eval.jsonl"
    # NULL_ARM: the base sampled again on the next seed. It picks the never-solved problems,
    # so that neither the base's evaluation nor a method's (both on the evaluation seed) does.
    models = {"base": base, NULL_ARM: base}
    for seed in cfg.seeds_of(cell):
        for kind, trainer, key in (("grpo", cfg.grpo, "steps"), ("es", cfg.es, "iterations")):
            run_dir = out / "runs" / cell / f"{kind}-seed{seed}"
            if not finished(run_dir, trainer.length):
                shutil.rmtree(run_dir, ignore_errors=True)
                shutil.rmtree(out / "eval" / cell / f"{kind}@{seed}", ignore_errors=True)
                run(es_llm_command(kind, cfg.ranks) + [
                    "--config", ROOT / trainer.config, "--out", run_dir, "--no-progress",
                    f"model={base}", f"seed={run_seed(cfg, cell, seed)}",
                    f"{key}={trainer.length}", *trainer.overrides])
            models[f"{kind}@{seed}"] = run_dir / "checkpoints" / "final"
    for name, model in models.items():
        seed = cfg.eval.seed + 1 if name == NULL_ARM else cfg.eval.seed
        _eval(cfg, model, data, out / "eval" / cell / name, run, seed)
    return collect(study, out, models)


def collect(study: dict, out: Path, models: dict) -> dict:
    """A cell's numbers: study.json plus each model's pass@1, pass@n and per-problem correct
    counts (in the study's problem order), and each run's reward curve."""
    cell = study["cell"]
    result = {**{k: study[k] for k in ("cell", "size", "steps", "parameters", "heldout_loss",
                                       "tokens", "reference_logp")},
              "models": {}, "curves": {}}
    for name in models:
        folder = out / "eval" / cell / name
        metrics = json.loads((folder / "metrics.json").read_text())
        n = metrics["num_samples"]
        counts: dict[str, int] = {}
        for row in read_jsonl(folder / "samples.jsonl"):
            counts[row["problem_id"]] = counts.get(row["problem_id"], 0) + int(row["correct"])
        result["models"][name] = {
            "n": n, "pass@1": metrics["pass@1"]["value"], "pass@1_ci": metrics["pass@1"]["ci95"],
            "pass@k": metrics[f"pass@{n}"]["value"], "pass@k_ci": metrics[f"pass@{n}"]["ci95"],
            "correct_P": [counts[pid] for pid in study["problem_ids"]]}
        if "@" in name:
            kind, seed = name.split("@")
            rows = complete_jsonl_rows(out / "runs" / cell / f"{kind}-seed{seed}" /
                                       "metrics.jsonl")
            key = "es/reward_mean" if kind == "es" else "reward/mean"
            result["curves"][name] = {"samples": [r["samples/generated"] for r in rows],
                                      "reward": [r[key] for r in rows]}
    return result


def calibrate(cfg: ScalingConfig, out: Path, runner) -> dict:
    """Every stage of the calibration cell and its post-training gain (OUT/calibration.json);
    the cell's collected numbers, or BadInput, before any other cell runs, unless the gain's
    interval lies above 0."""
    from es_llm.compare.scaling import post_training_gain

    c = cfg.calibration
    size, steps = c.cell.rsplit("-", 1)
    cell = run_cell(cfg, out, size, int(steps), runner)
    gain = post_training_gain(cell, c.method, np.random.default_rng(cfg.eval.seed),
                              cfg.bootstrap)
    write_json_atomic(out / "calibration.json", gain)
    lo, hi = gain["ci95"]
    print(f"[scaling] calibration {c.cell}: {c.method} {gain['gain_points']:+.1f} points of "
          f"pass@1 [{lo:+.1f}, {hi:+.1f}] over the base ({gain['seeds']} seed(s), "
          f"{gain['problems']} problems)")
    if lo <= 0:
        raise BadInput(f"the calibration build {c.cell} shows no post-training gain: "
                       f"{c.method} changes pass@1 by {gain['gain_points']:+.1f} points "
                       f"[{lo:+.1f}, {hi:+.1f}] over its base, an interval that does not lie "
                       f"above 0, so the grid would measure a budget too small to move the "
                       f"models rather than the builds. Nothing past the calibration ran "
                       f"(its stages and {out / 'calibration.json'} are kept). Raise the "
                       f"budget ({c.method}.length, or the trainer's overrides), start from "
                       f"bases with headroom (testbed: habits), or set calibration.cell: null "
                       f"to run the grid anyway.")
    return cell


def run(cfg: ScalingConfig, out: Path) -> dict:
    """Every cell of the grid (``check`` has passed), then the analysis and report."""
    from es_llm.compare import scaling

    from transformers.utils import logging as hf_logging
    # Builds and evaluations load models in this process: no weight-loading bar per model.
    hf_logging.disable_progress_bar()
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "scaling.yaml", dump_yaml(cfg))
    runner = Runner(out, "scaling")
    if cfg.sft.enabled and cfg.domain == "countdown" and not (out / "sft_traces.jsonl").is_file():
        from es_llm.testbed.scaling import sft_traces
        tb = load_testbed_config(cfg.testbed, None, list(cfg.testbed_overrides))
        write_jsonl_atomic(out / "sft_traces.jsonl", sft_traces(tb, cfg.sft.traces, tb.seed))
    t0 = time.time()
    done = {}  # the calibration cell is collected once
    if cfg.calibration.cell is not None:
        done[cfg.calibration.cell] = calibrate(cfg, out, runner)
    cells = [done.get(f"{size}-{steps}") or run_cell(cfg, out, size, steps, runner)
             for size in cfg.sizes for steps in cfg.pretrain_steps]
    result = scaling.analyze(cells, np.random.default_rng(cfg.eval.seed), cfg.bootstrap)
    result["config"] = to_dict(cfg)
    result["wall_s"] = round(time.time() - t0, 1)
    result["stage_seconds"] = stage_seconds(out)
    scaling.write(result, out / "report", f"Pretraining to post-training: {cfg.domain}")
    print(f"[scaling] wrote {out / 'report' / 'report.md'} and scaling.json")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, metavar="FILE.yaml",
                        help="study YAML (configs/scaling_countdown.yaml, scaling_chess.yaml, "
                             "or their _ci variants)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="study folder: builds/, sft/, runs/, eval/, report/, commands.txt")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides with dotted keys, e.g. pretrain_steps=[250,500] "
                             "grpo.length=20 eval.n=8")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(ScalingConfig, path=args.config, overrides=args.overrides)
        out = check_out_path(args.out)
        check(cfg, out)
        run(cfg, out)
    except BadInput as exc:
        print(f"scaling_study: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
