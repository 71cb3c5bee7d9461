"""``es-llm testbed``: build (or reuse from the cache) the embedded base models."""

from __future__ import annotations

from es_llm.command import Command
from es_llm.testbed import SIZES


def options(p) -> None:
    p.add_argument("--size", choices=SIZES, default="default",
                   help="preset: 'ci' (tiny, about 2.5 minutes with its teachers), 'default' "
                        "(about 7 minutes on 2 cores, plus about 20 for its teachers) or "
                        "'habits' (the default model pretrained with guessed answers among "
                        "its traces, so that post-training can add greedy capability; about "
                        "8 minutes without teachers)")


def load(args, cls, flags):
    from es_llm.testbed.config import load_testbed_config

    return load_testbed_config(args.size, args.config, args.overrides)


def run(args, cfg) -> None:
    from es_llm.testbed.build import build_testbed, describe

    path, info = build_testbed(cfg, args.out, progress=not args.no_progress)
    if args.out:
        args.log.attach(path)
    print(describe(path, info))


COMMAND = Command(
    help="build (or reuse from the cache) the embedded base model",
    description="""\
Build the embedded testbed deterministically from its config: held-out problem
sets (data/countdown_eval.jsonl, countdown_rl.jsonl, arithmetic_eval.jsonl), a
character-level tokenizer and a small Llama-architecture model pretrained on
procedurally generated Countdown and arithmetic solutions; then its distillation
teachers under teachers/: strong (larger, trained longer) and weak_base /
weak_rl (a smaller model before and after a short REINFORCE run), all with the
student's tokenizer (teachers.enabled=false skips them; teachers.* sets their
shapes and schedules). Off unless enabled: a masked-diffusion LM under
diffusion/ (a BERT encoder trained on masked tokens of the same mix, with its
sampler settings; diffusion.enabled=true), and domain models of the student's
family with their own held-out sets: code/ learns the pyfunc task
(code.enabled=true; scoring needs bubblewrap) and chess/ the chess task
(chess.enabled=true; needs the Syzygy tables that scripts/setup.sh installs),
reasoning/ plays Countdown in the solve, direct, facts, review, revise and
formalize roles that `es-llm testtime` needs (reasoning.enabled=true; roles.json
lists them), and knowledge/ answers questions composing the facts of a fixed
world in the solve, direct and facts roles (knowledge.enabled=true; `es-llm
testtime --task knowledge`); swa/ is the student converted to sliding-window attention (SWARR:
swa.window keys per query on swa.layers, then SFT on the pretraining mix;
swa/no_sft/ holds the converted weights before it; swa.enabled=true). Builds are
cached by a hash of the config and builder code under $ES_LLM_CACHE (default
~/.cache/es-llm), each part on its own key, and copied to --out.""",
    config="es_llm.testbed.config:TestbedConfig",
    run=run,
    options=options,
    load=load,
    note="Defaults shown are the 'default' size; --size ci or habits starts from "
         "es_llm/testbed/presets/<size>.yaml instead.",
)
