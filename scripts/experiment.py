"""The head-to-head experiment in one command: build the testbed, train ES (under mpirun) and
GRPO from the same base at a matched budget of generated samples, each with several training
seeds, and compare every final checkpoint with the base model.

    python scripts/experiment.py --config configs/experiment_countdown.yaml --out runs/main

Each stage is a plain `es-llm` command (printed, and appended to OUT/commands.txt), so any
step can be rerun by hand. Stages whose output is complete are skipped; an interrupted
training run is continued with --resume, so rerunning the same command finishes the job.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from es_llm.config import dump_yaml, load_config
from es_llm.errors import BadInput
from es_llm.es.config import ESRunConfig
from es_llm.evaluate import SamplingConfig
from es_llm.testbed.config import load_testbed_config
from gradient.config import GRPORunConfig

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Method:
    # Training config (a YAML under configs/) and overrides applied to every seed's run.
    config: str = ""
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExperimentConfig:
    # Testbed preset (ci or default) and its overrides.
    testbed: str = "default"
    testbed_overrides: tuple[str, ...] = ("teachers.enabled=false", "diffusion.enabled=false")
    task: str = "countdown"
    # Training seeds; every method trains once per seed from the same base model.
    seeds: tuple[int, ...] = (0, 1, 2)
    # Generated samples per training run, the same for every method: ES iterations and GRPO
    # steps are derived from it, so it must be a multiple of both per-step sample counts.
    budget_samples: int = 40960
    # MPI ranks of the ES runs (`mpirun -n ranks`).
    ranks: int = 2
    es: Method = field(default_factory=lambda: Method("configs/es_countdown.yaml"))
    grpo: Method = field(default_factory=lambda: Method("configs/grpo_countdown.yaml"))
    # How the comparison samples every model (identical for all), on how many of the
    # held-out problems (None = all) and with which backend.
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eval_limit: int | None = None
    eval_backend: str = "auto"
    # Capability or sharpening: the comparison also reads every model greedily and sampled
    # at these temperatures (and sampling.temperature), on the held-out file and on a
    # never-seen set of never_seen_per_tier problems per tier (scripts/unseen_countdown.py,
    # seed never_seen_seed; 0 = no such set), with views_n samples per problem. Off by
    # default ([] and 0): the comparison then reads the held-out file at `sampling` only.
    temperatures: tuple[float, ...] = ()
    never_seen_per_tier: int = 0
    never_seen_seed: int = 0
    views_n: int = 8


def _steps(total: int, per_step: int, what: str) -> int:
    if total % per_step:
        raise BadInput(f"budget_samples={total} is not a multiple of {what}'s {per_step} samples "
                       f"per step; pick a budget both methods divide.")
    return total // per_step


def plan(cfg: ExperimentConfig) -> dict[str, int]:
    """ES iterations and GRPO steps that spend ``budget_samples`` generated samples each."""
    es = load_config(ESRunConfig, path=ROOT / cfg.es.config, overrides=list(cfg.es.overrides))
    grpo = load_config(GRPORunConfig, path=ROOT / cfg.grpo.config,
                       overrides=list(cfg.grpo.overrides))
    return {
        "es": _steps(cfg.budget_samples, es.es.population * es.prompts_per_iteration, "es"),
        "grpo": _steps(cfg.budget_samples,
                       grpo.rollout.prompts_per_step * grpo.rollout.group_size, "grpo"),
    }


def same_testbed(folder: Path, cfg: ExperimentConfig) -> bool:
    """The folder already holds this testbed's base model (perhaps with teachers, which a
    fresh copy without them would drop)."""
    try:
        info = json.loads((folder / "testbed.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    want = load_testbed_config(cfg.testbed, None, list(cfg.testbed_overrides))
    return info.get("fingerprint") == want.fingerprint() and info.get("size") == cfg.testbed


class Runner:
    """Runs stage commands, echoing them and keeping OUT/commands.txt as the record."""

    def __init__(self, out: Path):
        self.out = out
        self.log = out / "commands.txt"

    def __call__(self, cmd: list[str]) -> None:
        line = " ".join(cmd)
        print(f"[experiment] {line}", flush=True)
        with open(self.log, "a") as f:
            f.write(line + "\n")
        t0 = time.time()
        proc = subprocess.run(cmd)
        if proc.returncode != 0:
            raise SystemExit(f"[experiment] failed with status {proc.returncode}: {line}")
        print(f"[experiment] done in {time.time() - t0:.0f} s", flush=True)


def training_command(kind: str, cfg: ExperimentConfig, seed: int, steps: int, model: Path,
                     run: Path) -> list[str] | None:
    """The command that trains (or finishes) one seed of one method; None when done."""
    if (run / "checkpoints" / "final" / "config.json").is_file():
        return None
    es_llm = [sys.executable, "-m", "es_llm"]
    method = cfg.es if kind == "es" else cfg.grpo
    length = f"iterations={steps}" if kind == "es" else f"steps={steps}"
    if (run / "config.yaml").is_file():
        cmd = es_llm + [kind, "--resume", str(run), "--no-progress", length]
    else:
        cmd = es_llm + [kind, "--config", str(ROOT / method.config), "--out", str(run),
                        "--no-progress", f"model={model}", f"seed={seed}", length,
                        *method.overrides]
    if kind == "es" and cfg.ranks > 1:
        mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
        cmd = [mpirun, "-n", str(cfg.ranks)] + cmd
    return cmd


def run(cfg: ExperimentConfig, out: Path) -> None:
    steps = plan(cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "experiment.yaml").write_text(dump_yaml(cfg))
    runner = Runner(out)
    es_llm = [sys.executable, "-m", "es_llm"]
    testbed = out / "testbed"
    if not same_testbed(testbed, cfg):
        runner(es_llm + ["testbed", "--size", cfg.testbed, "--out", str(testbed),
                         "--no-progress", *cfg.testbed_overrides])
    models = [f"base={testbed}"]
    for kind in ("es", "grpo"):
        for seed in cfg.seeds:
            folder = out / "runs" / f"{kind}-seed{seed}"
            cmd = training_command(kind, cfg, seed, steps[kind], testbed, folder)
            if cmd:
                runner(cmd)
            models.append(f"{kind}@{seed}={folder / 'checkpoints' / 'final'}")
    sp = cfg.sampling
    cmd = es_llm + ["compare", "--models", *models, "--task", cfg.task, "--n", str(sp.n),
                    "--temperature", str(sp.temperature), "--top-p", str(sp.top_p),
                    "--max-tokens", str(sp.max_tokens), "--seed", str(sp.seed),
                    "--backend", cfg.eval_backend, "--out", str(out / "compare"), "--no-progress"]
    if cfg.eval_limit is not None:
        cmd += ["--limit", str(cfg.eval_limit)]
    if cfg.temperatures:
        cmd += ["--temperatures", *map(str, cfg.temperatures)]
    if cfg.temperatures or cfg.never_seen_per_tier:
        cmd += ["--views-n", str(cfg.views_n)]
    if cfg.never_seen_per_tier:
        never_seen = out / "never_seen.jsonl"
        if not never_seen.is_file():
            runner([sys.executable, str(ROOT / "scripts" / "unseen_countdown.py"),
                    "--size", cfg.testbed, "--per-tier", str(cfg.never_seen_per_tier),
                    "--seed", str(cfg.never_seen_seed), "--testbed", str(testbed),
                    "--out", str(never_seen), *cfg.testbed_overrides])
        cmd += ["--also-on", str(never_seen)]
    runner(cmd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, metavar="FILE.yaml",
                        help="experiment YAML (configs/experiment_countdown.yaml or its _ci "
                             "variant)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="experiment folder: testbed/, runs/<method>-seed<k>/, compare/ "
                             "(report.md, report.html, comparison.json), commands.txt")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides with dotted keys, e.g. seeds=[0] "
                             "budget_samples=20480 evaluation.n=16")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(ExperimentConfig, path=args.config, overrides=args.overrides)
        run(cfg, Path(args.out))
    except BadInput as exc:
        print(f"experiment: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
