"""Coverage overlap of two models from their sample files: problems solved at least once by
each, by both, by only one of them, and the second model's progressions and regressions
against the first (with its answer entropy on the regressions).

    python scripts/coverage_overlap.py runs/main/eval-base runs/grpo/eval [--list]

The files must cover the same problems with the same n.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from es_llm.compare.samples import align, load_samples
from es_llm.errors import BadInput
from es_llm.metrics import answer_entropy, overlap, progressions_regressions, solved_set


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", help="eval folder or samples.jsonl of the reference model")
    parser.add_argument("second", help="eval folder or samples.jsonl of the other model")
    parser.add_argument("--list", action="store_true", help="also print the problem ids")
    args = parser.parse_args(argv)
    try:
        a, b = align([load_samples("first", args.first), load_samples("second", args.second)])
    except BadInput as exc:
        print(f"coverage_overlap: error: {exc}", file=sys.stderr)
        return 2
    solved_a, solved_b = solved_set(a.problem_ids, a.correct), solved_set(b.problem_ids, b.correct)
    lap = overlap(solved_a, solved_b)
    pr = progressions_regressions(b.problem_ids, b.correct, a.correct)
    entropy_P = answer_entropy(b.answer_keys)["entropy_P"]
    index = {pid: i for i, pid in enumerate(b.problem_ids)}
    reg = [index[pid] for pid in pr["regressions"]]
    total = len(a.problem_ids)
    print(f"problems {total}, n = {a.n} samples each")
    print(f"solved at least once: first {len(solved_a)}, second {len(solved_b)}")
    print(f"both {lap['num_both']}, only first {lap['num_only_a']}, only second "
          f"{lap['num_only_b']}, neither {total - lap['num_both'] - lap['num_only_a'] - lap['num_only_b']}")
    print(f"second vs first: {pr['num_progressions']} progressions, {pr['num_regressions']} "
          f"regressions, mean accuracy change {100 * pr['accuracy_delta']['mean']:+.1f} points")
    if reg:
        print(f"answer entropy of the second on its regressions: {np.mean(entropy_P[reg]):.3f} "
              f"nats (all problems: {np.nanmean(entropy_P):.3f})")
    if args.list:
        print("progressions:", " ".join(pr["progressions"]) or "-")
        print("regressions:", " ".join(pr["regressions"]) or "-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
