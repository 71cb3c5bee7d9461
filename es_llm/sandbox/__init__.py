"""Run model-written code safely: bubblewrap isolation, resource limits, a worker pool, and
verdicts computed outside the candidate's reach (``sandbox.py``; ``runner.py`` runs inside).
"""

from es_llm.sandbox.sandbox import (CandidateError, CodeRunner, Job, SandboxLimits, Verdict,
                                    io_check)

__all__ = ["CandidateError", "CodeRunner", "Job", "SandboxLimits", "Verdict", "io_check"]
