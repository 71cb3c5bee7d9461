"""knowledge: compose facts about named things that the model learnt in pretraining.

The testbed's knowledge-composition task, for CPP's claim that concretising the recalled
propositions before reasoning helps a model compose knowledge. A fixed world (``world()``,
seeded by ``WORLD_SEED``) holds ``WORLD_SIZE`` things with invented four-letter names; each
has a number from 1 to 20 and likes one other thing. A question adds the numbers of two
terms, where ``X`` is X's number and ``@X`` the number of the thing X likes, so a question of
tier 2, 3 or 4 needs that many facts::

    tier 2  "ask kavo+rilm\\n"     kavo has 7, rilm has 4                     -> 11
    tier 3  "ask @kavo+rilm\\n"    kavo likes dorp, dorp has 5, rilm has 4   -> 9
    tier 4  "ask @kavo+@rilm\\n"   kavo likes dorp, dorp has 5, rilm likes ...

The multi-role model of ``es-llm testbed knowledge.enabled=true`` learns the facts as
statements and the questions in three roles, each marked by the prompt's first word::

    fact    "fact kavo\\n"               -> "kavo has 7 ; kavo likes dorp"
    solve   "ask @kavo+rilm\\n"          -> "5+4=9 <answer>9</answer>"
    direct  "direct ask @kavo+rilm\\n"   -> "<answer>9</answer>"
    facts   "facts ask @kavo+rilm\\n"    -> "kavo likes dorp ; dorp has 5 ; rilm has 4\\n"
                                             "5+4=9 <answer>9</answer>"

``solve`` recalls silently and writes the sum; ``facts`` (CPP) first states every fact the
question needs as a proposition, then the same sum. Every fact is a training statement, so
a held-out question is answered from memorised facts; what it needs that training never
shows is the composition: the questions split by their terms, unordered (``heldout_bucket``),
so no held-out question, nor the same terms in the other order, is ever a training question.
Answers are integers scored exactly; model text is parsed with regular expressions, never
evaluated.
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass
from functools import lru_cache

from es_llm.errors import BadInput
from es_llm.tasks.arithmetic import extract_answer, score_completion
from es_llm.tasks.base import InProcessTask, Problem, Score
from es_llm.tasks.loading import load_records, record_id, row_messages
from es_llm.tasks.registry import (TaskConfig, check_tiers, file_or_generated,
                                   register_task)

TIERS = (2, 3, 4)
ROLES = ("solve", "direct", "facts")
# Shares of the training examples: fact statements, then the question roles.
ROLE_SHARES = (("fact", 0.3), ("solve", 0.3), ("direct", 0.2), ("facts", 0.2))
# 256 things: with 64 the default model recalled the facts right 96-97% of the time after
# 600 steps and failed at the sum instead, so recall was never what limited it.
WORLD_SEED, WORLD_SIZE = "knowledge-world-1", 256
MAX_VALUE = 20
# One question in HELDOUT_EVERY (by its unordered terms) is reserved for held-out sets.
HELDOUT_EVERY = 8
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"

_TERM = r"@?[a-z]{4}"
_QUESTION_RE = re.compile(rf"(?:(?:direct|facts) )?ask ({_TERM})\+({_TERM})\n?")
_FACT_RE = re.compile(r"([a-z]{4}) (has ([0-9]{1,3})|likes ([a-z]{4}))")


@dataclass(frozen=True)
class World:
    """``names`` in a fixed order; ``value[name]`` in 1..MAX_VALUE; ``likes[name]`` another
    name."""

    names: tuple[str, ...]
    value: dict
    likes: dict


@lru_cache(maxsize=None)
def world(seed: str = WORLD_SEED, size: int = WORLD_SIZE) -> World:
    """The task's world, a pure function of ``seed`` and ``size``."""
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < size:
        name = "".join(rng.choice(s) for s in (_CONSONANTS, _VOWELS) * 2)
        if name not in names:
            names.append(name)
    value = {n: rng.randint(1, MAX_VALUE) for n in names}
    likes = {n: rng.choice([m for m in names if m != n]) for n in names}
    return World(tuple(names), value, likes)


def needed_facts(w: World, term: str) -> list[str]:
    """The fact statements a term needs: ``X has v``, or ``X likes Y`` then ``Y has v``."""
    if term.startswith("@"):
        x = term[1:]
        y = w.likes[x]
        return [f"{x} likes {y}", f"{y} has {w.value[y]}"]
    return [f"{term} has {w.value[term]}"]


def term_value(w: World, term: str) -> int:
    return w.value[w.likes[term[1:]]] if term.startswith("@") else w.value[term]


def question_facts(w: World, question: str) -> list[str]:
    """Every fact a question (``@kavo+rilm``) needs, in the order they are used."""
    a, b = question.split("+")
    return needed_facts(w, a) + needed_facts(w, b)


def heldout_bucket(question: str) -> bool:
    """Whether a question is reserved for held-out sets: decided by its unordered terms, so
    ``a+b`` and ``b+a`` fall on the same side."""
    key = "+".join(sorted(question.split("+")))
    return zlib.crc32(key.encode()) % HELDOUT_EVERY == 0


def render_prompt(question: str, role: str = "solve") -> str:
    head = f"ask {question}\n"
    if role == "solve":
        return head
    if role in ("direct", "facts"):
        return f"{role} {head}"
    raise ValueError(f"unknown role {role!r}; valid roles are: {', '.join(ROLES)}")


def _draw_question(rng: random.Random, tier: int, w: World) -> str:
    """Two distinct things, the first marked @ from tier 3 on and both at tier 4; where the
    two terms are alike (tiers 2 and 4) they are in alphabetical order, so each question has
    one form."""
    a, b = rng.sample(w.names, 2)
    if tier == 3:
        return f"@{a}+{b}"
    a, b = sorted((a, b))
    return f"{a}+{b}" if tier == 2 else f"@{a}+@{b}"


def _problem(w: World, question: str, tier: int, role: str = "solve") -> Problem:
    answer = sum(term_value(w, t) for t in question.split("+"))
    return Problem(id=f"knowledge-{question}", prompt=render_prompt(question, role),
                   gold={"answer": answer, "question": question}, difficulty=tier,
                   meta={"role": role})


def solution(w: World, question: str, role: str) -> str:
    """The completion of ``role`` for a question (see the module docstring)."""
    a, b = (term_value(w, t) for t in question.split("+"))
    answer = f"<answer>{a + b}</answer>"
    if role == "direct":
        return answer
    worked = f"{a}+{b}={a + b} {answer}"
    if role == "facts":
        return " ; ".join(question_facts(w, question)) + "\n" + worked
    return worked


def fact_statement(w: World, name: str) -> str:
    return f"{name} has {w.value[name]} ; {name} likes {w.likes[name]}"


def held_out(rng: random.Random, tier: int) -> tuple[Problem, str]:
    """A held-out question in the solve role (from the reserved bucket) and its solution."""
    w = world()
    while True:
        question = _draw_question(rng, tier, w)
        if heldout_bucket(question):
            return _problem(w, question, tier), solution(w, question, "solve")


def generate(rng: random.Random, tier: int) -> tuple[Problem, str]:
    """One training example: a fact statement, or a question of ``tier`` outside the
    held-out bucket in a role, drawn by ``ROLE_SHARES``."""
    w = world()
    names, shares = zip(*ROLE_SHARES)
    role = rng.choices(names, weights=shares)[0]
    if role == "fact":
        name = rng.choice(w.names)
        return (Problem(id=f"knowledge-fact-{name}", prompt=f"fact {name}\n",
                        gold={"answer": None, "question": f"fact {name}"}, difficulty=1,
                        meta={"role": "fact"}), fact_statement(w, name))
    while True:
        question = _draw_question(rng, tier, w)
        if not heldout_bucket(question):
            return _problem(w, question, tier, role), solution(w, question, role)


def parse_question(prompt: str) -> str | None:
    """The question (``@kavo+rilm``) of a prompt in any role, or None."""
    m = _QUESTION_RE.fullmatch(prompt.split("\n", 1)[0] + "\n")
    return None if m is None else f"{m[1]}+{m[2]}"


def answer_value(completion: str) -> int | None:
    """A completion's integer answer (its last ``<answer>`` block), or None."""
    text, _ = extract_answer(completion, require_tag=True)
    return int(text) if text is not None and re.fullmatch(r"-?[0-9]{1,12}", text) else None


def facts_hold(completion: str, question: str) -> bool:
    """Whether a facts line states only true facts and every fact the question needs."""
    w = world()
    stated = set()
    for part in completion.split("\n", 1)[0].split(";"):
        m = _FACT_RE.fullmatch(part.strip())
        if m is None or m[1] not in w.value:
            return False
        true = (m[3] is not None and int(m[3]) == w.value[m[1]]) or m[4] == w.likes[m[1]]
        if not true:
            return False
        stated.add(m[0])
    return set(question_facts(w, question)) <= stated


def load_problems(path, limit: int | None = None) -> list[Problem]:
    """Questions from a file with ``id, prompt, answer`` (and ``question``, ``difficulty``);
    every answer is checked against the world, so a file from another world is refused."""
    records = load_records(path, {"prompt": ("prompt",), "answer": ("answer",)}, limit)
    w, problems = world(), []
    for i, rec in enumerate(records):
        question = parse_question(rec["prompt"])
        terms = question.split("+") if question else []
        if not terms or any(t.lstrip("@") not in w.value for t in terms):
            raise BadInput(f"data file {str(path)!r}: record {i} has prompt {rec['prompt']!r}, "
                           f"not a question of this world (\"ask X+Y\" with X and Y the "
                           f"names of its things, either marked @ for the thing it likes).")
        answer = sum(term_value(w, t) for t in terms)
        if rec["answer"] != answer:
            raise BadInput(f"data file {str(path)!r}: record {i} ({question}) has answer "
                           f"{rec['answer']!r}, but this world's facts give {answer}.")
        problems.append(Problem(id=record_id(rec, i), prompt=rec["prompt"],
                                gold={"answer": answer, "question": question},
                                difficulty=int(rec.get("difficulty") or 0),
                                messages=row_messages(rec, path, i)))
    return problems


class KnowledgeTask(InProcessTask):
    """Questions about the world (generated from the held-out bucket, or from a file)."""

    name = "knowledge"

    def __init__(self, cfg: TaskConfig):
        tiers = cfg.tiers or TIERS
        check_tiers("knowledge", tiers, min(TIERS), max(TIERS))
        self.cfg, self._tiers = cfg, tiers
        self._problems: list[Problem] | None = None

    def problems(self) -> list[Problem]:
        if self._problems is None:
            self._problems = file_or_generated(self.cfg, load_problems, held_out,
                                               lambda p: p.gold["question"], self._tiers)
        return list(self._problems)

    def _score(self, problem: Problem, completion: str) -> Score:
        return score_completion(int(problem.gold["answer"]), completion,
                                format_weight=self.cfg.format_weight,
                                require_answer_tag=self.cfg.require_answer_tag,
                                max_completion_chars=self.cfg.max_completion_chars)


@register_task("knowledge", answer_tag=True)
def _build(cfg: TaskConfig) -> KnowledgeTask:
    return KnowledgeTask(cfg)
