"""The plan of a run: which birth stages and loss terms it has, and in what order.

The order is declared here, once: ``BIRTH_ORDER`` is the order a step runs its birth stages
in (``gradient.loop.birth_stages``), ``TERM_ORDER`` the order its loss terms are summed in
(``gradient.loop.loss_terms``). Both must name every registered stage or term exactly once,
so a new one without a place (or a place without a registration) fails when a run is planned,
not by running in whatever order the modules happened to register it.

``plan`` picks, in that order, the stages and terms whose ``when(cfg, edges)`` holds, once
at the start of a run, from the config and the registered declarations of the method's parts
(a loss that needs per-row clip bounds, an estimator that expands rollouts, a distillation
method's divergence); ``gradient.loop.trainer`` runs them and never looks at a method's name.
Adding a method is adding a stage or a term with its ``when``, its place here and a test.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradient.config import GRPORunConfig
from gradient.loop.batch import RolloutBatch
from gradient.loop.birth_stages import BIRTH, StageInput
from gradient.loop.loss_terms import TERMS
from gradient.loop.state import Edges
from populations.registry import Registry

# The birth stages in the order a step runs them: the advantages first (every later stage
# may read them), the distillation transform before the behaviour and reference log-probs
# are frozen (so dropped rollouts cost nothing more and its added rows are frozen too),
# replay last (it stores what the step made and adds older rollouts).
BIRTH_ORDER = ("advantages", "row_clip_bounds", "estimator_rows", "distill", "recovered_rows",
               "freeze_behaviour", "freeze_reference", "replay")
# The loss terms in the order their aggregates are summed.
TERM_ORDER = ("policy", "divergence", "entropy", "kl")


@dataclass(frozen=True)
class Plan:
    birth: tuple[str, ...]
    terms: tuple[str, ...]
    # The policy estimate must include full distributions (a divergence term).
    full: bool
    # Drift gates on the gated terms (BPDG).
    gated: bool


def placed(registry: Registry, order: tuple[str, ...]) -> tuple[str, ...]:
    """``order`` once it names every entry of ``registry`` exactly once and nothing else;
    ValueError naming the entries without a place and the places without an entry."""
    unplaced = sorted(set(registry.names()) - set(order))
    unknown = sorted(set(order) - set(registry.names()))
    if unplaced or unknown or len(set(order)) != len(order):
        raise ValueError(f"the {registry.kind} order must name each registered {registry.kind} "
                         f"once: registered without a place {unplaced}, placed without a "
                         f"registration {unknown}, order {order}")
    return order


def plan(cfg: GRPORunConfig, edges: Edges) -> Plan:
    """The stages and terms of a run, chosen once from the config and the declarations."""
    terms = tuple(n for n in placed(TERMS, TERM_ORDER) if TERMS.get(n).when(cfg, edges))
    return Plan(birth=tuple(n for n in placed(BIRTH, BIRTH_ORDER)
                            if BIRTH.get(n).when(cfg, edges)),
                terms=terms, full=any(TERMS.get(n).full for n in terms),
                gated=cfg.algo.distill.drift.enabled)


def run_birth(stages: tuple[str, ...], inp: StageInput, batch: RolloutBatch
              ) -> tuple[RolloutBatch, dict]:
    """The planned birth stages on the step's fresh rollouts, in plan order; a stage without
    ``on_empty`` is skipped when no rollout is left."""
    metrics: dict = {}
    for name in stages:
        stage = BIRTH.get(name)
        if len(batch) or stage.on_empty:
            batch, m = stage.fn(inp, batch)
            metrics.update(m)
    return batch, metrics
