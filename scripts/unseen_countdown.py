"""Write Countdown problems a testbed model has never seen: a larger held-out set.

    python scripts/unseen_countdown.py --size default --per-tier 500 \
        --out runs/unseen/countdown_unseen.jsonl [--exclude OTHER.jsonl] \
        [--testbed runs/main/testbed] [key=value ...]

The testbed's own held-out file has 100 problems per tier, too few to separate a gain of a
few points from noise. This replays the build's pretraining data stream (no model needed),
then draws problems outside it and outside every held-out file of the build, with worked
reference solutions, in the testbed's JSONL format (`es-llm eval ... task.data=FILE`). A
tier whose problem space pretraining nearly exhausts gives fewer problems; the counts are
printed. With --testbed, the folder's fingerprint must equal the config's, so the replayed
stream is the one that model was trained on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from es_llm.errors import BadInput
from es_llm.io import read_jsonl, write_jsonl_atomic
from es_llm.testbed.config import SIZES, load_testbed_config
from es_llm.testbed.train import record
from es_llm.testbed.unseen import countdown_key, unseen_countdown


def _check_build(folder: Path, fingerprint: str) -> None:
    info_path = folder / "testbed.json"
    if not info_path.is_file():
        raise BadInput(f"--testbed {str(folder)!r} is not a testbed build (no testbed.json); "
                       f"give the folder `es-llm testbed --out` wrote.")
    built = json.loads(info_path.read_text()).get("fingerprint")
    if built != fingerprint:
        raise BadInput(f"--testbed {str(folder)!r} was built with fingerprint {built}, but this "
                       f"code and config give {fingerprint}: its pretraining stream may differ "
                       f"from the one replayed here. Rebuild it with `es-llm testbed` (a cache "
                       f"hit when the weights are unchanged) or match --size and overrides.")


def _excluded_keys(paths: list[Path]) -> set[str]:
    keys = set()
    for path in paths:
        if not path.is_file():
            raise BadInput(f"--exclude {str(path)!r} is not a file; give Countdown JSONL files "
                           f"with numbers and target fields (e.g. an earlier --out).")
        try:
            rows = read_jsonl(path)
        except ValueError as exc:
            raise BadInput(f"--exclude {str(path)!r} is not JSONL ({exc}); give Countdown "
                           f"JSONL files such as an earlier --out.") from None
        for i, row in enumerate(rows):
            if not isinstance(row.get("numbers"), list) or not isinstance(row.get("target"), int):
                raise BadInput(f"--exclude {str(path)!r}: record {i} has no Countdown "
                               f"'numbers' list and integer 'target'.")
            keys.add(countdown_key(row["numbers"], row["target"]))
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="default", choices=SIZES,
                        help="testbed preset whose pretraining stream is replayed")
    parser.add_argument("--per-tier", type=int, default=500,
                        help="problems wanted per tier (number of given numbers)")
    parser.add_argument("--seed", type=int, default=0,
                        help="draws another set for another seed; the set is a pure "
                             "function of the config and this seed")
    parser.add_argument("--exclude", type=Path, nargs="+", default=[], metavar="FILE.jsonl",
                        help="Countdown files (numbers, target) whose problems to leave out, "
                             "e.g. an earlier set, so that a development set and a test set "
                             "share nothing")
    parser.add_argument("--testbed", type=Path,
                        help="a built testbed folder to check the fingerprint against")
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="testbed config overrides, as given to `es-llm testbed`")
    args = parser.parse_args(argv)
    try:
        if args.per_tier < 1:
            raise BadInput(f"--per-tier must be at least 1, got {args.per_tier}.")
        if args.out.exists() and not args.out.is_file():
            raise BadInput(f"--out {str(args.out)!r} exists and is not a file.")
        exclude = _excluded_keys(args.exclude)
        cfg = load_testbed_config(args.size, overrides=args.overrides)
        if args.testbed is not None:
            _check_build(args.testbed, cfg.fingerprint())
    except BadInput as exc:
        print(f"unseen_countdown: error: {exc}", file=sys.stderr)
        return 2
    problems, found = unseen_countdown(cfg, args.per_tier, args.seed, exclude)
    write_jsonl_atomic(args.out, [record(p) for p in problems])
    counts = ", ".join(f"tier {t}: {n}" for t, n in found.items())
    print(f"wrote {len(problems)} problems ({counts}) to {args.out}; "
          f"testbed fingerprint {cfg.fingerprint()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
