"""Write a random-init stand-in model folder (es_llm/testbed/standins.py).

    python scripts/standin_model.py --arch qwen2 --shape qwen2.5-1.5b --dtype bfloat16 \
        --out runs/standin-qwen2-1.5b

The folder (config.json, model.safetensors, a byte-level BPE tokenizer with a ChatML chat
template, and data/countdown_{eval,rl}.jsonl) loads in transformers and vLLM, and
``es-llm es model=FOLDER`` finds its Countdown prompts. The same arguments write the same
files. Its weights are random: rewards are 0 and only timings and agreements mean anything.
"""

from __future__ import annotations

import argparse
import sys

from es_llm.errors import BadInput
from es_llm.testbed.standins import ARCHITECTURES, DTYPES, SHAPES, build_standin


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", required=True, help=f"one of: {', '.join(ARCHITECTURES)}")
    p.add_argument("--shape", default="ci", help=f"one of: {', '.join(SHAPES)} (default ci)")
    p.add_argument("--dtype", default="float32", help=f"one of: {', '.join(DTYPES)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the model folder to write")
    args = p.parse_args(argv)
    try:
        folder = build_standin(args.arch, args.shape, args.out, args.dtype, args.seed)
    except BadInput as exc:
        print(f"standin_model.py: error: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
