"""Every shipped training config, three steps on a ci testbed, reduced to what must not move:
the SHA-256 of the final weights, the metrics (timings left out) and, for ES, the SHA-256 of
the ledger.

``tests/test_configs_bitwise.py`` compares these against ``tests/data/bitwise_reference.json``,
recorded from the code before a refactoring, so a change meant to keep behaviour can show it
did. Floating-point bytes depend on the CPU type and the testbed's own bytes, so the reference
is keyed by both; record one for another machine with

    python tests/bitwise_runs.py --record

and the cases of newly shipped configs (absent from this machine's record) with
``--record-missing``, which leaves every recorded case as it is.
"""

from __future__ import annotations

import hashlib
import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "data" / "bitwise_reference.json"

_GRPO = ["steps=3", "backend=hf", "rollout.prompts_per_step=2", "rollout.group_size=4",
         "rollout.max_tokens=16", "checkpoint_every=100"]
_DLLM = ["steps=3", "rollout.prompts_per_step=2", "rollout.group_size=2",
         "rollout.max_tokens=48", "algo.dynamic_sampling.enabled=false", "checkpoint_every=100"]
_ES = ["iterations=3", "backend=hf", "es.population=4", "prompts_per_iteration=2",
       "max_tokens=8", "checkpoint_every=100", "checksum_every=100"]
# The ci models almost never solve a Countdown problem in a few samples, so a reward-driven
# method would not move: those cases score the dense "sevens" reward on the same prompts.
SEVENS = "SEVENS"
TEACHERS = "TEACHERS"
# A file of verified trajectories (the ci rl problems' own reference solutions), as SFT data
# and as LatentRevise's recovered rows.
TRAJECTORIES = "TRAJECTORIES"


@dataclass(frozen=True)
class Case:
    config: str
    command: str
    # ci testbed folder the run starts from: "" (the student), "diffusion", "code", "chess",
    # "swa" (the sliding-window conversion).
    model: str = ""
    overrides: tuple[str, ...] = ()


CASES = [
    *[Case(c, "grpo", overrides=(*_GRPO, SEVENS, *extra)) for c, extra in [
        ("grpo_countdown.yaml", ()), ("grpo_countdown_ci.yaml", ()),
        ("grpo_dr_countdown.yaml", ()), ("grpo_rloo_countdown.yaml", ()),
        ("dapo_countdown.yaml", ()), ("gspo_countdown.yaml", ()), ("gapo_countdown.yaml", ()),
        ("adaprefix_countdown.yaml", ("algo.prefix.withdraw_start=1",
                                      "algo.prefix.withdraw_end=2")),
        ("replay_countdown.yaml", ("algo.replay.warmup_updates=1",)),
        ("grpo_lora_countdown.yaml", ())]],
    *[Case(c, "opd", overrides=(*_GRPO, TEACHERS, *extra)) for c, extra in [
        ("opd_countdown.yaml", ()), ("opd_countdown_ci.yaml", ()), ("opd_ra_countdown.yaml", ()),
        ("opd_rstg_countdown.yaml", (SEVENS, "algo.distill.rstg.teacher_samples=2")),
        ("opd_w2s_countdown.yaml", ()), ("opd_drift_countdown.yaml", ()),
        ("opd_dear_countdown.yaml", ()), ("opd_avsd_countdown.yaml", ()),
        ("opd_gjsd_countdown.yaml", ())]],
    *[Case(f"dllm_{m}_countdown{s}.yaml", "opd" if m == "dopsd" else "grpo", "diffusion",
           (*_DLLM, *(("algo.distill.dopsd.filter_wrong=false",) if m == "dopsd" else (SEVENS,))))
      for m in ("d1", "trace", "slim", "dopsd") for s in ("", "_ci")],
    *[Case(f"grpo_{d}{s}.yaml", "grpo", d, tuple(_GRPO)) for d in ("code", "chess")
      for s in ("", "_ci")],
    *[Case(c, "es", overrides=(*_ES, SEVENS)) for c in
      ("es_countdown.yaml", "es_countdown_ci.yaml", "es_countdown_habits.yaml")],
    *[Case(c, "es", overrides=("iterations=3", "es.population=8", "prompts_per_iteration=4",
                               "engine.members_per_call=8", "max_tokens=8", "checkpoint_every=100",
                               "checksum_every=100", SEVENS))
      for c in ("es_countdown_lowrank.yaml", "es_countdown_lowrank_ci.yaml")],
    # Longer completions and more members than _ES, so the adapter's update is not zero.
    Case("es_lora_countdown.yaml", "es", overrides=(*_ES, SEVENS, "es.population=8",
                                                    "max_tokens=32")),
    Case("es_pgpe_lora_countdown.yaml", "es", overrides=(*_ES, SEVENS, "es.population=8",
                                                         "max_tokens=32")),
    *[Case(f"es_{d}{s}.yaml", "es", d, tuple(_ES)) for d in ("code", "chess")
      for s in ("", "_ci")],
    Case("grpo_swarr_countdown.yaml", "grpo", "swa", (*_GRPO, SEVENS)),
    # The ci student rarely solves a problem, so most groups are zero-hit and get a row.
    Case("grpo_latent_revise_countdown.yaml", "grpo",
         overrides=(*_GRPO, "task.limit=32", TRAJECTORIES)),
    Case("sft_countdown.yaml", "sft", overrides=("epochs=2", "batch_size=8", TRAJECTORIES)),
]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def weights_digest(folder: Path) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order (the file's
    own bytes also hold metadata that may legitimately change)."""
    import torch
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for name, t in sorted(load_file(folder / "model.safetensors").items()):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def metrics_rows(path: Path) -> list[dict]:
    """The metrics rows without timings (``perf/*`` and ``*_s`` keys); a later change may
    add metrics, so the comparison is of the recorded keys."""
    rows = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows.append({k: v for k, v in sorted(row.items())
                     if not k.startswith("perf/") and not k.endswith("_s")})
    return rows


def _arguments(case: Case, testbeds: dict[str, Path]) -> list[str]:
    student = testbeds["student"]
    model = testbeds[case.model] / case.model if case.model else student
    args = [f"model={model}"]
    for o in case.overrides:
        if o == TEACHERS:
            args += [f"algo.distill.teacher={student}/teachers/strong",
                     f"algo.distill.w2s.positive={student}/teachers/weak_rl",
                     f"algo.distill.w2s.negative={student}/teachers/weak_base"]
        elif o == SEVENS:
            args += ["task.name=sevens", f"task.data={student}/data/countdown_rl.jsonl"]
        elif o == TRAJECTORIES:
            data = trajectories(student)
            args.append(f"data={data}" if case.command == "sft"
                        else f"algo.recovered.data={data}")
        else:
            args.append(o)
    return args


def trajectories(student: Path) -> Path:
    """The first 32 ci rl problems with their reference solutions as completions, written
    once per student (verified by construction: the references are the generator's)."""
    import tempfile

    out = Path(tempfile.gettempdir()) / "es-llm-bitwise" / f"{weights_digest(student)[:16]}.jsonl"
    if not out.is_file():
        from es_llm.io import write_jsonl_atomic

        rows = [json.loads(x) for x in (student / "data" / "countdown_rl.jsonl").open()][:32]
        out.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl_atomic(out, [{**r, "completion": r["reference"]} for r in rows])
    return out


def resolved(case: Case, testbeds: dict[str, Path]):
    """The config ``case`` runs with (two cases that resolve alike are one computation)."""
    from es_llm.config import load_config
    from es_llm.es.config import ESRunConfig
    from gradient.config import GRPORunConfig
    from gradient.loop.sft import SFTRunConfig

    cls = {"es": ESRunConfig, "sft": SFTRunConfig}.get(case.command, GRPORunConfig)
    with _sevens():
        return load_config(cls, path=ROOT / "configs" / case.config,
                           overrides=_arguments(case, testbeds))


@contextmanager
def _sevens():
    """The dense synthetic tasks registered for the duration of a run only: ``sevens``
    (reward = share of '7' characters, correct above one half) and ``anyseven`` (the same
    reward, correct when there is any '7', so groups mix correct and wrong rollouts)."""
    from es_llm.tasks import registry
    from es_llm.tasks.base import Score
    from test_es_direction import Sevens

    class AnySeven(Sevens):
        name = "anyseven"

        def _score(self, problem, completion):
            return Score(reward=super()._score(problem, completion).reward,
                         correct="7" in completion, answer=None)

    with registry.TASKS.registered("sevens", Sevens), \
            registry.TASKS.registered("anyseven", AnySeven):
        yield


def run_case(case: Case, testbeds: dict[str, Path], out: Path) -> dict:
    """Run ``case`` into ``out`` in this process; its digests."""
    from es_llm.cli import main

    with _sevens():
        rc = main([case.command, "--config", str(ROOT / "configs" / case.config), "--out",
                   str(out), "--no-progress", *_arguments(case, testbeds)])
    if rc != 0:
        raise RuntimeError(f"{case.config} exited {rc}")
    digests = {"weights": weights_digest(out / "checkpoints" / "final"),
               "metrics": metrics_rows(out / "metrics.jsonl")}
    if (out / "ledger.jsonl").is_file():
        digests["ledger"] = _sha((out / "ledger.jsonl").read_bytes())
    return digests


class Runs:
    """Each case run at most once, and cases that resolve to the same config share a run."""

    def __init__(self, testbeds: dict[str, Path], root: Path):
        self.testbeds, self.root = testbeds, root
        self._done: list[tuple[object, Path, dict]] = []

    def get(self, case: Case) -> tuple[Path, dict]:
        cfg = resolved(case, self.testbeds)
        for other, out, digests in self._done:
            if other == cfg:
                return out, digests
        out = self.root / f"{len(self._done)}-{case.config.removesuffix('.yaml')}"
        digests = run_case(case, self.testbeds, out)
        self._done.append((cfg, out, digests))
        return out, digests


def machine_key(testbeds: dict[str, Path]) -> str:
    """The machine kind (CPU type, torch build, GPU) and the ci testbeds' weight digests the
    figures hold for."""
    from es_llm.machine import machine_info, machine_kind

    beds = [weights_digest(testbeds["student"])[:16],
            weights_digest(testbeds["diffusion"] / "diffusion")[:16],
            *(weights_digest(testbeds["domains"] / d)[:16] for d in ("code", "chess"))]
    return f"{machine_kind(machine_info())} | " + " ".join(beds)


def build_testbeds() -> dict[str, Path]:
    from es_llm.testbed.build import build_testbed
    from es_llm.testbed.config import load_testbed_config

    def build(*overrides: str) -> Path:
        return build_testbed(load_testbed_config("ci", overrides=list(overrides)),
                             progress=False, echo=lambda *_: None)[0]

    domains = build("code.enabled=true", "chess.enabled=true")
    return {"student": build(), "diffusion": build("diffusion.enabled=true"),
            "code": domains, "chess": domains, "domains": domains,
            "swa": build("swa.enabled=true")}


def record(missing_only: bool = False) -> None:
    import tempfile

    testbeds = build_testbeds()
    reference = json.loads(REFERENCE.read_text()) if REFERENCE.is_file() else {}
    key = machine_key(testbeds)
    figures = dict(reference.get(key, {})) if missing_only else {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = Runs(testbeds, Path(tmp))
        for case in CASES:
            if case.config in figures:
                continue
            figures[case.config] = runs.get(case)[1]
            print(case.config, figures[case.config]["weights"], flush=True)
    reference[key] = figures
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_text(json.dumps(reference, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(figures)} cases to {REFERENCE}")


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    if sys.argv[1:] not in (["--record"], ["--record-missing"]):
        sys.exit("usage: python tests/bitwise_runs.py --record | --record-missing")
    record(missing_only=sys.argv[1:] == ["--record-missing"])
