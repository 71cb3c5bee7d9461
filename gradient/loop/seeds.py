"""Seeds derived from a run's seed and positions in it, so every random draw of a step is a
pure function of (run seed, step, round, ...) and a resumed run draws what an uninterrupted
one would have. A module of its own: rollouts, estimators and distillation all use it, and
none of them may import another for it (the architecture test keeps gradient/ acyclic)."""

from __future__ import annotations

import hashlib


def derive_seed(*parts) -> int:
    """A 31-bit seed that is a pure function of ``parts`` (run seed, step, round...)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF
