#!/usr/bin/env bash
# Set everything up and run the main job on the embedded testbed: the head-to-head
# experiment. It builds the habits base model, trains full-rank ES, low-rank ES (both under
# mpirun -n 2) and GRPO from it at the same budget of generated samples with 3 training seeds
# each, continues every ES run to 4x that budget, samples every final checkpoint and the base
# model 64 times per held-out problem, reads each greedily and at T = 0.6 / 1.0 on the
# held-out and on 2,000 never-seen problems, reads every checkpoint along the runs on the
# never-seen set, and writes the comparison report to OUT/compare/ (report.md, report.html,
# comparison.json, figures/). About 3 hours on 2 cores; rerunning skips what is done and
# resumes an interrupted run.
#
#   bash scripts/run_main.sh [OUT]          # OUT defaults to runs/main
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${ES_LLM_VENV:-.venv}
OUT=${1:-runs/main}
export PATH="$PWD/$VENV/bin:$PATH"
"$VENV/bin/python" scripts/experiment.py --config configs/experiment_countdown.yaml --out "$OUT"
