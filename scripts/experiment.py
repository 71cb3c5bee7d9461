"""The head-to-head experiment in one command: build the testbed, train every method (ES
variants under mpirun, GRPO) from the same base at a matched budget of generated samples, each
with several training seeds, continue chosen runs to a multiple of that budget, and compare
every final checkpoint with the base model, with accuracy along the runs against samples and
seconds. ``compare_overrides`` passes the comparison's other settings (e.g. its geometry,
connectivity and drift sections) as key=value, checked with the rest before anything runs.

    python scripts/experiment.py --config configs/experiment_countdown.yaml --out runs/main

On a model of your own, ``model=PATH eval_data=FILE`` replaces the testbed (every method
starts from PATH and the comparison reads FILE), and ``runtime.*`` sets the device and
precision of every stage at once (configs/recipes/experiment_countdown_paper.yaml).

The same command runs the studies built on other starting points or data: a method may start
from a folder inside the testbed (``model: swa``, SWARR's converted model), SFT runs
(``kind: sft``) sit beside the RL runs, ``latent_revise`` writes LatentRevise's recovered
trajectories to OUT/recover before any training (overrides name the experiment folder as
``{out}``), and ``references`` adds untrained models to the comparison
(configs/experiment_swarr.yaml, configs/experiment_latent_revise.yaml). SWARR's
``swarr.windows`` builds one sliding-window conversion per window (OUT/windows/w<W>) and runs
every method and reference that starts from the conversion once per window (<name>_w<W>);
``swarr.converted`` and ``swarr.rl`` add the study's table (pass@1 per tier, the share of the
conversion's loss RL recovers, RL under the window against RL with full attention).

Each stage is a plain `es-llm` command (printed, and appended to OUT/commands.txt), so any
step can be rerun by hand. Stages whose output is complete are skipped; an interrupted
training run is continued with --resume, so rerunning the same command finishes the job. A
rerun that would keep a run (or the recovery) made with other settings than it now gives
that stage is refused before anything is written: new settings need a new --out."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from es_llm.compare.config import CompareConfig
from es_llm.compare.connectivity import pair_labels
from es_llm.config import MACHINE_KEY, dump_yaml, load_config, read_yaml, to_dict
from es_llm.errors import BadInput
from es_llm.es.command import RESUME_KEYS as ES_RESUME_KEYS
from es_llm.es.config import ESRunConfig
from es_llm.io import complete_jsonl_rows, write_text_atomic
from es_llm.models import resolve_training_data
from es_llm.run_folder import check_out_path
from es_llm.runtime import Runtime
from es_llm.stage_runner import Runner, es_llm_command, finished
from es_llm.studies import ExperimentConfig, Method, in_conversion
from es_llm.testbed.config import MODEL_TASKS, load_testbed_config
from gradient.commands.grpo_command import RESUME_KEYS as GRPO_RESUME_KEYS
from gradient.config import GRPORunConfig

ROOT = Path(__file__).resolve().parents[1]


# The experiment folder inside a method's overrides (e.g. data={out}/recover/recovered.jsonl).
OUT_MARK = "{out}"
# The config key that sets a budget-matched run's length, per trainer.
LENGTH_KEY = {"es": "iterations", "grpo": "steps"}
# What `--resume` may change in a run's config.yaml, per trainer (SFT has no --resume).
RESUME_KEYS = {"es": ES_RESUME_KEYS, "grpo": GRPO_RESUME_KEYS, "sft": ()}


def _steps(total: int, per_step: int, what: str) -> int:
    if total % per_step:
        raise BadInput(f"budget_samples={total} is not a multiple of {what}'s {per_step} samples "
                       f"per step; pick a budget every method divides.")
    return total // per_step


def plan(cfg: ExperimentConfig) -> dict[str, int | None]:
    """Per method, the ES iterations or GRPO steps that spend ``budget_samples`` generated
    samples (None for SFT, whose length is its own config's)."""
    from gradient.commands.recovery import LatentReviseConfig
    from gradient.loop.sft import SFTRunConfig

    # Every config a later stage loads is loaded here first, so a bad setting stops the
    # experiment before hours of training ({out} is a path only at run time).
    if not cfg.model:
        check_windows(cfg)
        for overrides in testbed_builds(cfg).values():
            load_testbed_config(cfg.testbed, None, overrides)
    try:
        compare = load_config(CompareConfig, overrides=list(cfg.compare_overrides))
        if compare.connectivity.enabled or compare.connectivity.pairs:
            pair_labels(compare, model_names(cfg))
    except BadInput as exc:
        raise BadInput(f"compare_overrides (settings of `es-llm compare`): {exc}") from None
    if cfg.latent_revise.enabled:
        load_config(LatentReviseConfig, path=ROOT / cfg.latent_revise.config,
                    overrides=_with_out(cfg.latent_revise.overrides, "."))
    steps: dict[str, int | None] = {}
    for name, m in cfg.methods.items():
        if m.kind == "sft":
            load_config(SFTRunConfig, path=ROOT / m.config,
                        overrides=_with_out(m.overrides, "."))
            steps[name] = None
            continue
        if m.kind == "es":
            run = load_config(ESRunConfig, path=ROOT / m.config,
                              overrides=[*m.overrides, *runtime_overrides(cfg)])
            per_step = run.samples_per_iteration()
        else:
            run = load_config(GRPORunConfig, path=ROOT / m.config,
                              overrides=[*m.overrides, *runtime_overrides(cfg)])
            per_step = run.rollout.prompts_per_step * run.rollout.group_size
        steps[name] = _steps(cfg.budget_samples, per_step, name)
    return steps


def window_folder(out: Path, window: int) -> Path:
    """The testbed build holding the sweep's conversion to ``window``."""
    return out / "windows" / f"w{window}"


def testbed_builds(cfg: ExperimentConfig) -> dict[int | None, list[str]]:
    """The testbed builds of the experiment and their overrides: the base (key None) and,
    with a window sweep, one per window (its conversion alone: the base then builds none)."""
    windows = cfg.swarr.windows
    if windows is None:
        return {None: list(cfg.testbed_overrides)}
    return {None: [*cfg.testbed_overrides, "swa.enabled=false"],
            **{w: [*cfg.testbed_overrides, "swa.enabled=true", f"swa.window={w}"]
               for w in windows}}


def check_windows(cfg: ExperimentConfig) -> None:
    """BadInput for a swept window longer than the context the models run at (the testbed
    model's, or runtime.max_model_len when smaller): it would not slide."""
    if cfg.swarr.windows is None:
        return
    tb = load_testbed_config(cfg.testbed, None, testbed_builds(cfg)[None])
    context = min(tb.model.max_positions, cfg.runtime.max_model_len or tb.model.max_positions)
    long = [w for w in cfg.swarr.windows if w > context]
    if long:
        raise BadInput(f"swarr.windows {long} are longer than the context the models run at "
                       f"({context} tokens: the testbed's model.max_positions, or "
                       f"runtime.max_model_len when smaller), so nothing would slide; use "
                       f"windows from 1 to {context}.")


def arms(cfg: ExperimentConfig, out: Path) -> dict[str, tuple[str, Path]]:
    """Every trained arm by name: the method it runs and the folder it starts from (the
    base's, or with a sweep, a window's conversion: <name>_w<W>)."""
    base, out_arms = base_model(cfg, out), {}
    for name, method in cfg.methods.items():
        if cfg.swarr.windows is not None and in_conversion(method.model):
            for w, arm in zip(cfg.swarr.windows, cfg.swarr.arm_names(name)):
                out_arms[arm] = (name, window_folder(out, w) / method.model)
        else:
            out_arms[name] = (name, base / method.model)
    return out_arms


def references(cfg: ExperimentConfig, out: Path) -> dict[str, Path]:
    """The untrained models compared beside the base, by name (per window with a sweep)."""
    base, refs = base_model(cfg, out), {}
    for name, folder in cfg.references.items():
        if cfg.swarr.windows is not None and in_conversion(folder):
            for w, ref in zip(cfg.swarr.windows, cfg.swarr.arm_names(name)):
                refs[ref] = window_folder(out, w) / folder
        else:
            refs[name] = base / folder
    return refs


def run_name(arm: str, seed: int) -> str:
    """The comparison's name of one arm's run from one training seed."""
    return f"{arm}@{seed}"


def model_names(cfg: ExperimentConfig) -> list[str]:
    """The comparison's model names, as ``run`` gives them: base, the references, and every
    arm's run per seed (``run_name``)."""
    where = Path(".")  # only the names are wanted
    return ["base", *references(cfg, where),
            *(run_name(arm, seed) for arm in arms(cfg, where) for seed in cfg.seeds)]


def conversion_overrides(cfg: ExperimentConfig) -> list[str]:
    """The comparison's conversion table (``es_llm.compare.conversion``): one arm per method
    trained under the window (per window with a sweep), against the base."""
    w = cfg.swarr
    if not w.converted:
        return []
    sweep = w.windows is not None
    out = []
    for rl, full in w.rl.items():
        for i, arm in enumerate(w.arm_names(rl)):
            converted = w.arm_names(w.converted)[i] if sweep else w.converted
            out += [f"conversion.{arm}.converted={converted}", f"conversion.{arm}.rl={arm}"]
            out += [f"conversion.{arm}.rl_full={full}"] if full else []
    return out


def same_testbed(folder: Path, cfg: ExperimentConfig, overrides: list[str] | None = None) -> bool:
    """The folder already holds this testbed's base model (perhaps with teachers, which a
    fresh copy without them would drop) and every further model the config enables (the
    sliding-window conversion, the diffusion and domain models), built with its settings;
    ``overrides``: the build's (default: the base's, ``testbed_builds``)."""
    try:
        info = json.loads((folder / "testbed.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    want = load_testbed_config(cfg.testbed, None,
                               testbed_builds(cfg)[None] if overrides is None else overrides)
    keys = {"diffusion": want.diffusion_key, "swa": want.swa_key,
            **{name: (lambda name=name: want.domain_key(name)) for name in MODEL_TASKS}}
    parts_match = all((info.get(part) or {}).get("key") == key()
                      for part, key in keys.items() if getattr(want, part).enabled)
    return (info.get("fingerprint") == want.fingerprint() and info.get("size") == cfg.testbed
            and parts_match)


def _es_llm(method: Method, cfg: ExperimentConfig) -> list[str]:
    """The command prefix of one method's trainer (ES under mpirun when ranks > 1)."""
    return es_llm_command(method.kind, cfg.ranks)


def _length(method: Method, steps: int | None) -> list[str]:
    if method.kind == "sft":
        return []
    return [f"{LENGTH_KEY[method.kind]}={steps}"]


def _with_out(overrides, out: Path | str) -> list[str]:
    """``overrides`` with {out} replaced by the experiment folder ``out``."""
    return [o.replace(OUT_MARK, str(out)) for o in overrides]


def runtime_overrides(cfg: ExperimentConfig) -> list[str]:
    """The experiment's ``runtime`` settings that differ from the defaults, as overrides of
    every stage: set once, they win over each method's config."""
    default = to_dict(Runtime())
    return [f"runtime.{k}={'null' if v is None else v}" for k, v in to_dict(cfg.runtime).items()
            if v != default[k]]


def base_model(cfg: ExperimentConfig, out: Path) -> Path:
    """The folder every method starts from: the user's model, else the testbed built in
    OUT/testbed."""
    return Path(cfg.model) if cfg.model else out / "testbed"


def run_overrides(method: Method, seed: int, steps: int | None, model: Path,
                  out: Path, cfg: ExperimentConfig) -> list[str]:
    """The overrides a new run of one seed of ``method`` gets beside its config file."""
    data = [f"task.data={cfg.train_data}"] if cfg.train_data and method.kind != "sft" else []
    return [f"model={model}", f"seed={seed}", *_length(method, steps), *data,
            *_with_out(method.overrides, out), *runtime_overrides(cfg)]


def training_command(method: Method, cfg: ExperimentConfig, seed: int, steps: int | None,
                     model: Path, run: Path, out: Path) -> list[str] | None:
    """The command that trains (or finishes) one seed of one method; None when done. An SFT
    run is short and has no --resume: an unfinished one starts over."""
    if finished(run, steps):
        return None
    if method.kind == "sft":
        shutil.rmtree(run, ignore_errors=True)
    elif (run / "config.yaml").is_file():
        return _es_llm(method, cfg) + ["--resume", str(run), "--no-progress",
                                       *_length(method, steps)]
    return _es_llm(method, cfg) + ["--config", str(ROOT / method.config), "--out", str(run),
                                   "--no-progress",
                                   *run_overrides(method, seed, steps, model, out, cfg)]


def extension_command(method: Method, cfg: ExperimentConfig, steps: int, run: Path,
                      ext: Path) -> list[str] | None:
    """The command that continues a copy of the finished ``run`` in ``ext`` to
    ``method.extend`` times its length, a checkpoint at every multiple of it; the head-to-head
    checkpoint becomes ext's step_<steps>. None when done."""
    total = steps * method.extend
    if finished(ext, total):
        return None
    if not (ext / "config.yaml").is_file():
        staging = ext.with_name(ext.name + ".copying")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(run, staging)
        shutil.copytree(staging / "checkpoints" / "final", staging / "checkpoints" / f"step_{steps}")
        shutil.rmtree(ext, ignore_errors=True)
        staging.rename(ext)
    return _es_llm(method, cfg) + ["--resume", str(ext), "--no-progress",
                                   *_length(method, total), f"checkpoint_every={steps}"]


def _run_folder(out: Path, name: str, seed: int) -> Path:
    return out / "runs" / f"{name}-seed{seed}"


def _extension_folder(out: Path, name: str, seed: int, method: Method) -> Path:
    return out / "runs" / f"{name}-seed{seed}-x{method.extend}"


def _recover_overrides(cfg: ExperimentConfig, testbed: Path, out: Path) -> list[str]:
    """The overrides of the latent-revise stage beside its config file."""
    return [f"model={testbed}", *_with_out(cfg.latent_revise.overrides, out),
            *runtime_overrides(cfg)]


def resolved_run_config(method: Method, overrides: list[str]):
    """The config the trainer of ``method`` resolves for a new run with ``overrides``: its
    YAML with them applied and, for es and grpo, the model's own training prompts when no
    data file is named (as `es-llm es` and `es-llm grpo` resolve it before writing it)."""
    from gradient.loop.sft import SFTRunConfig

    if method.kind == "sft":
        return load_config(SFTRunConfig, path=ROOT / method.config, overrides=overrides)
    cls = ESRunConfig if method.kind == "es" else GRPORunConfig
    return resolve_training_data(load_config(cls, path=ROOT / method.config,
                                             overrides=overrides))


def _flat(data: dict, prefix: str = "") -> dict:
    """A nested mapping as {dotted key: value}."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _same(old, new) -> bool:
    """Equal values, or two spellings of one existing path (a rerun's --out may be given
    relative where the first run's was absolute, or the other way round)."""
    if old == new:
        return True
    return (isinstance(old, str) and isinstance(new, str) and os.path.exists(old)
            and os.path.exists(new) and os.path.samefile(old, new))


def refuse_changed(what: str, folder: Path, want, may_change: tuple[str, ...]) -> None:
    """BadInput when ``folder``'s config.yaml (the resolved config a stage wrote, with the
    machine it ran on) differs from ``want`` in any key but ``may_change``: the experiment
    would keep that output and report it under settings it was not made with."""
    kept = _flat({k: v for k, v in read_yaml(folder / "config.yaml").items() if k != MACHINE_KEY})
    now = _flat(to_dict(want))
    changed = [f"{key}: {kept.get(key, '(none)')!r} -> {now.get(key, '(none)')!r}"
               for key in sorted(kept.keys() | now.keys())
               if key not in may_change and not _same(kept.get(key), now.get(key))]
    if changed:
        raise BadInput(f"{folder} holds {what} made with other settings than this experiment "
                       f"now gives it ({'; '.join(changed)}); rerunning here would keep it and "
                       f"report it under the new settings. Give a new --out for the new "
                       f"settings, or set them back.")


def _check_kept_run(what: str, method: Method, folder: Path, overrides: list[str],
                    steps: int | None) -> None:
    """Refuse the run in ``folder`` if this experiment keeps it (continues or skips it) but
    now configures it otherwise; the keys --resume may change are free while it is
    unfinished, but a finished run's length must be the one asked for now."""
    done = finished(folder, steps)
    if not (folder / "config.yaml").is_file() or (method.kind == "sft" and not done):
        return  # a new run starts here (an unfinished SFT run starts over)
    ran = len(complete_jsonl_rows(folder / "metrics.jsonl"))
    if steps is not None and not done and ran > steps:
        raise BadInput(f"{folder} holds {what}, unfinished after {ran} steps, longer than the "
                       f"{steps} this experiment now gives it; continuing it cannot end at "
                       f"that budget. Give a new --out for the new budget, or set it back.")
    free = set(RESUME_KEYS[method.kind]) - ({LENGTH_KEY.get(method.kind)} if done else set())
    refuse_changed(what, folder, resolved_run_config(method, overrides), tuple(free))


def _check_kept_testbed(cfg: ExperimentConfig, out: Path) -> None:
    """Refuse to rebuild the testbed under runs made from another one: they would be
    reported as trained from the new base. The kept testbed's own record decides (config
    and builder fingerprint, see ``same_testbed``); without it, the experiment.yaml of the
    run that made them."""
    made = [p for p in (out / "runs", out / "recover") if p.is_dir() and any(p.iterdir())]
    if not made:
        return
    testbed = out / "testbed"
    builds = testbed_builds(cfg)
    windows = [w for w in builds if w is not None
               and (window_folder(out, w) / "testbed.json").is_file()]
    if any(not same_testbed(window_folder(out, w), cfg, builds[w]) for w in windows):
        stale = True
    elif (testbed / "testbed.json").is_file():
        stale = not same_testbed(testbed, cfg)
    else:
        try:
            before = read_yaml(out / "experiment.yaml")
        except BadInput:  # missing or not an experiment's record: nothing to hold against
            before = {"testbed": cfg.testbed, "testbed_overrides": list(cfg.testbed_overrides)}
        stale = (before.get("testbed"), list(before.get("testbed_overrides") or [])) != (
            cfg.testbed, list(cfg.testbed_overrides))
    if stale:
        raise BadInput(f"{out} holds runs trained from a testbed that this experiment would "
                       f"rebuild (its testbed or testbed_overrides changed, or the testbed "
                       f"builder did); they would then be reported as trained from the new "
                       f"one. Give a new --out, or set the testbed settings back.")


def check_kept_outputs(cfg: ExperimentConfig, out: Path, steps: dict[str, int | None]) -> None:
    """Refuse an ``out`` whose training runs or LatentRevise recovery this experiment would
    reuse although it now gives them other settings (a method's overrides, its config file,
    the budget of a finished run...): compared key by key with each one's config.yaml, as
    its stage would resolve the config now."""
    from gradient.commands.recovery import LatentReviseConfig

    testbed = base_model(cfg, out)
    recover = out / "recover"
    if not cfg.model:
        _check_kept_testbed(cfg, out)
    if (cfg.latent_revise.enabled and (recover / "metrics.json").is_file()
            and (recover / "config.yaml").is_file()):
        want = resolve_training_data(load_config(
            LatentReviseConfig, path=ROOT / cfg.latent_revise.config,
            overrides=_recover_overrides(cfg, testbed, out)))
        refuse_changed("LatentRevise's recovered data", recover, want, ())
    for name, (method_name, start) in arms(cfg, out).items():
        method, length = cfg.methods[method_name], steps[method_name]
        for seed in cfg.seeds:
            overrides = run_overrides(method, seed, length, start, out, cfg)
            _check_kept_run(f"method {name}'s seed-{seed} run", method,
                            _run_folder(out, name, seed), overrides, length)
            if method.extend > 1 and seed in method.extend_seeds:
                total = length * method.extend
                _check_kept_run(f"method {name}'s seed-{seed} run extended to "
                                f"{method.extend}x", method,
                                _extension_folder(out, name, seed, method),
                                [*overrides, *_length(method, total),
                                 f"checkpoint_every={length}"], total)


def compare_command(cfg: ExperimentConfig, out: Path, models: list[str], budget_runs: list[str],
                    never_seen: Path | None) -> list[str]:
    sp = cfg.sampling
    cmd = es_llm_command("compare") + [
        "--models", *models, "--task", cfg.task, "--n", str(sp.n), "--temperature",
        str(sp.temperature), "--top-p", str(sp.top_p), "--max-tokens", str(sp.max_tokens),
        "--seed", str(sp.seed), "--backend", cfg.eval_backend, "--out", str(out / "compare"),
        "--no-progress"]
    if cfg.eval_limit is not None:
        cmd += ["--limit", str(cfg.eval_limit)]
    if cfg.eval_data is not None:
        cmd += ["--data", cfg.eval_data]
    if cfg.eval_select is not None:
        cmd += [f"task.select={cfg.eval_select}"]
    cmd += runtime_overrides(cfg) + conversion_overrides(cfg)
    if cfg.temperatures:
        cmd += ["--temperatures", *map(str, cfg.temperatures)]
    if cfg.temperatures or never_seen:
        cmd += ["--views-n", str(cfg.views_n)]
    if never_seen:
        cmd += ["--also-on", str(never_seen)]
    if budget_runs:
        settings = {k: v for k, v in to_dict(cfg.budget).items() if k != "runs" and v is not None}
        cmd += ["--budget-runs", *budget_runs] + [
            f"budget.{k}=[{','.join(map(str, v))}]" if isinstance(v, list) else f"budget.{k}={v}"
            for k, v in settings.items()]
    return cmd + list(cfg.compare_overrides)


def run(cfg: ExperimentConfig, out: Path) -> None:
    steps = plan(cfg)
    check_kept_outputs(cfg, out, steps)
    write_text_atomic(out / "experiment.yaml", dump_yaml(cfg))
    runner = Runner(out, "experiment")
    testbed = base_model(cfg, out)
    if not cfg.model:
        for window, overrides in testbed_builds(cfg).items():
            folder = testbed if window is None else window_folder(out, window)
            if not same_testbed(folder, cfg, overrides):
                runner(es_llm_command("testbed") + ["--size", cfg.testbed, "--out", str(folder),
                                                    "--no-progress", *overrides])
    models = [f"base={testbed}"] + [f"{name}={folder}"
                                    for name, folder in references(cfg, out).items()]
    budget_runs = []
    recover = cfg.latent_revise
    if recover.enabled and not (out / "recover" / "metrics.json").is_file():
        runner(es_llm_command("latent-revise") + [
            "--config", str(ROOT / recover.config), "--out", str(out / "recover"),
            "--no-progress", *_recover_overrides(cfg, testbed, out)])
    for name, (method_name, start) in arms(cfg, out).items():
        method = cfg.methods[method_name]
        for seed in cfg.seeds:
            folder = _run_folder(out, name, seed)
            cmd = training_command(method, cfg, seed, steps[method_name], start, folder, out)
            if cmd:
                runner(cmd)
            models.append(f"{run_name(name, seed)}={folder / 'checkpoints' / 'final'}")
            along = folder
            if method.kind == "sft":
                continue
            if method.extend > 1 and seed in method.extend_seeds:
                along = _extension_folder(out, name, seed, method)
                cmd = extension_command(method, cfg, steps[method_name], folder, along)
                if cmd:
                    runner(cmd)
            budget_runs.append(f"{run_name(name, seed)}={along}")
    never_seen = None
    if cfg.never_seen_per_tier:
        never_seen = out / "never_seen.jsonl"
        if not never_seen.is_file():
            runner([sys.executable, str(ROOT / "scripts" / "unseen_countdown.py"),
                    "--size", cfg.testbed, "--per-tier", str(cfg.never_seen_per_tier),
                    "--seed", str(cfg.never_seen_seed), "--testbed", str(testbed),
                    "--out", str(never_seen), *cfg.testbed_overrides])
    runner(compare_command(cfg, out, models,
                           budget_runs if cfg.budget_study else [], never_seen))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, metavar="FILE.yaml",
                        help="experiment YAML (configs/experiment_countdown.yaml or its _ci "
                             "variant)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved experiment config as YAML and exit")
    parser.add_argument("--out", metavar="DIR",
                        help="experiment folder: testbed/, windows/w<W>/ (a window sweep's "
                             "conversions), runs/<method>-seed<k>[-x<extend>]/, compare/ "
                             "(report.md, report.html, comparison.json), commands.txt")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides with dotted keys, e.g. seeds=[0] "
                             "budget_samples=20480 sampling.n=16 methods.es.extend=4")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(ExperimentConfig, path=args.config, overrides=args.overrides)
        if args.print_config:
            print(dump_yaml(cfg), end="")
            return 0
        if not args.out:
            raise BadInput("--out DIR is required: the experiment folder (testbed/, runs/, "
                           "compare/, commands.txt).")
        out = check_out_path(args.out)
        run(cfg, out)
    except BadInput as exc:
        print(f"experiment: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
