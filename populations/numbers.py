"""The one finite-number check every setting and input uses."""

from __future__ import annotations

import math


def is_finite_number(x) -> bool:
    """Whether ``x`` is a real ``int`` or ``float`` (a bool is not a number here) that is
    neither infinite nor NaN."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
