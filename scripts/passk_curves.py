"""pass@k curves (k = 1..n, 95% bootstrap bands over problems) of several sample files.

    python scripts/passk_curves.py base=runs/main/eval-base es=runs/es/eval grpo=... \
        --out passk.png [--reference base]

Each argument is NAME=PATH with PATH an `es-llm eval` folder or a samples.jsonl; names of the
form method@seed are averaged per method. Prints pass@k at powers of two with the intervals
and the crossover k of each pair; the files must cover the same problems with the same n.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from es_llm.compare.analysis import compare_sets
from es_llm.compare.core import passk_curves
from es_llm.compare.samples import align, load_samples
from es_llm.errors import BadInput


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", nargs="+", metavar="NAME=PATH",
                        help="eval folders or samples.jsonl files, one per model")
    parser.add_argument("--out", required=True, metavar="FILE.png", help="figure to write")
    parser.add_argument("--reference", help="model the difference panel is relative to "
                                            "(default: the first)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    args = parser.parse_args(argv)
    try:
        pairs = [a.split("=", 1) for a in args.samples]
        if any(len(p) != 2 for p in pairs):
            raise BadInput("arguments must be NAME=PATH, e.g. base=runs/main/eval-base.")
        sets = align([load_samples(name, path) for name, path in pairs])
        comp = compare_sets(sets, args.reference or sets[0].method, np.random.default_rng(0),
                            args.bootstrap)
    except BadInput as exc:
        print(f"passk_curves: error: {exc}", file=sys.stderr)
        return 2
    passk_curves(comp, Path(args.out))
    n = comp["settings"]["n"]
    ks = [k for k in range(1, n + 1) if k & (k - 1) == 0 or k == n]
    print("k     " + "".join(f"{m:>26}" for m in comp["methods"]))
    for k in ks:
        print(f"{k:<6}" + "".join(
            f"{m['passk']['mean'][k - 1]:>10.3f} [{m['passk']['lo'][k - 1]:.3f}, "
            f"{m['passk']['hi'][k - 1]:.3f}]" for m in comp["methods"].values()))
    for p in comp["pairs"]:
        print(f"crossover {p['a']} vs {p['b']}: {p['crossover_k'] or 'none up to n'}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
