"""Sandbox throughput: executions per second through the pool, and what bubblewrap costs.

Judges the same programs with the bubblewrap sandbox and with the unsandboxed subprocess
(``isolation="none"``: the same runner, limits and protocol, no namespaces), alternating the
two in one run, for each pool size asked for. Two workloads: pyfunc reference solutions
(eight calls each) and HumanEval's canonical solutions (the problems' own tests).

    python scripts/bench_sandbox.py                      # workers 1, 2, 4, 8; 3 repeats
    python scripts/bench_sandbox.py --workers 4 --repeats 5 --json out.json

Record the figures in docs/benchmarks.md with the machine they came from.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

from es_llm.sandbox import CodeRunner, Job, SandboxLimits
from es_llm.tasks import TaskConfig, build_task


def _jobs(name: str, count: int) -> list[Job]:
    """Reference solutions of ``count`` problems of task ``name`` as sandbox jobs."""
    task = build_task(TaskConfig(name=name, num_problems=count, limit=count,
                                 unsafe_no_sandbox=True))
    try:
        problems = task.problems()
        return [Job(task.program(p, p.meta["solution"]), p.gold["entry_point"],
                    task.make_check(p)) for p in problems]
    finally:
        task.close()


def _rate(runner: CodeRunner, jobs: list[Job]) -> tuple[float, int]:
    t0 = time.perf_counter()
    verdicts = runner.run_many(jobs)
    elapsed = time.perf_counter() - t0
    return len(jobs) / elapsed, sum(v.passed for v in verdicts)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8],
                    help="pool sizes to measure (default 1 2 4 8)")
    ap.add_argument("--programs", type=int, default=200,
                    help="pyfunc programs per measurement (default 200)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating repeats (default 3)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)

    limits = SandboxLimits(timeout_s=10)
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unsafe baseline warns on purpose
        workloads = {"pyfunc": _jobs("pyfunc", args.programs),
                     "humaneval": _jobs("humaneval", 164)}
        for workers in args.workers:
            runners = {"bwrap": CodeRunner(limits, workers, "bwrap"),
                       "none": CodeRunner(limits, workers, "none")}
            for name, jobs in workloads.items():
                rates: dict[str, list[float]] = {"bwrap": [], "none": []}
                passed = {}
                for _ in range(args.repeats):
                    for isolation, runner in runners.items():
                        rate, ok = _rate(runner, jobs)
                        rates[isolation].append(rate)
                        passed[isolation] = ok
                row = {"workload": name, "workers": workers, "programs": len(jobs),
                       "bwrap_per_s": round(statistics.median(rates["bwrap"]), 1),
                       "none_per_s": round(statistics.median(rates["none"]), 1),
                       "passed_bwrap": passed["bwrap"], "passed_none": passed["none"]}
                row["bwrap_over_none"] = round(row["bwrap_per_s"] / row["none_per_s"], 2)
                results.append(row)
                print(f"{name:9s} workers {workers:2d}: sandbox {row['bwrap_per_s']:7.1f}/s  "
                      f"no sandbox {row['none_per_s']:7.1f}/s  ratio {row['bwrap_over_none']:.2f}"
                      f"  (passed {passed['bwrap']}/{len(jobs)} and "
                      f"{passed['none']}/{len(jobs)})")
            for runner in runners.values():
                runner.close()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return {"results": results}


if __name__ == "__main__":
    main()
