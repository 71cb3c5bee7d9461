"""Metrics that compare models from their sampled completions: pass@k, pass^k, maj@k, coverage
and diversity, plus the metrics.json summary of one evaluation.

Inputs are per problem: ``correct`` (list of 1-D bool sequences, or a P x N array),
``answer_keys`` and ``solution_keys`` (lists of ``str | None``), ``texts`` (lists of str),
``problem_ids`` (list of str). Everything is a pure function of its arguments; randomness comes
only from an explicit ``np.random.Generator``.
"""

from es_llm.metrics.coverage import (
    accuracy_histogram,
    overlap,
    progressions_regressions,
    share_below,
    solved_set,
)
from es_llm.metrics.diversity import (
    answer_entropy,
    distinct_answers,
    distinct_correct_solutions,
    distinct_n,
    diversity_report,
    self_bleu,
    sentence_bleu,
    tokenize,
)
from es_llm.metrics.passk import (
    as_bool_rows,
    bootstrap_ci,
    counts_per_problem,
    ks_powers_of_two,
    maj_at_k_per_problem,
    pass_at_k,
    pass_at_k_per_problem,
    pass_hat_k,
    pass_hat_k_per_problem,
)
from es_llm.metrics.summary import evaluation_metrics, format_table

__all__ = [
    "accuracy_histogram",
    "answer_entropy",
    "as_bool_rows",
    "bootstrap_ci",
    "counts_per_problem",
    "distinct_answers",
    "distinct_correct_solutions",
    "distinct_n",
    "diversity_report",
    "evaluation_metrics",
    "format_table",
    "ks_powers_of_two",
    "maj_at_k_per_problem",
    "overlap",
    "pass_at_k",
    "pass_at_k_per_problem",
    "pass_hat_k",
    "pass_hat_k_per_problem",
    "progressions_regressions",
    "self_bleu",
    "tokenize",
    "sentence_bleu",
    "share_below",
    "solved_set",
]
