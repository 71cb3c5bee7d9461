"""Chat templates: how a problem's prompt becomes the text a model is sent.

``task.chat.template`` is off (the default, as the ES paper sends Countdown's prompts) or on
(YAML's on/off and true/false alike). Off sends each prompt as the task wrote it; when the
model folder's tokenizer has a chat template, one note in the log says so and how to turn it
on. On renders each prompt through that template once, where a command loads its problems and the
model's tokenizer (``render_prompts``): the messages are ``task.chat.system`` (if set) and
the prompt as a user message, or the data row's own ``messages`` (with the system message
put first when the row has none), rendered with ``add_generation_prompt=True`` and
``task.chat.kwargs``. Every backend and trainer then sees the same string, which samples
store as ``prompt`` (the task's own text stays in ``Problem.raw_prompt``).

Backends tokenize a prompt string with the tokenizer's special tokens, so a template that
writes the BOS token itself would give two: the rendered text drops a leading BOS that the
tokenizer adds anyway.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from es_llm.errors import BadInput
from es_llm.tasks.base import Problem

# apply_chat_template arguments es-llm sets itself; task.chat.kwargs may not override them.
_RESERVED_KWARGS = ("conversation", "tokenize", "add_generation_prompt", "return_dict",
                    "continue_final_message", "chat_template")


@dataclass(frozen=True)
class ChatConfig:
    """``task.chat``: whether prompts go through the model's chat template, and with what."""

    # off (false): send each prompt as written (the ES paper's raw prompts); on (true):
    # render it through the model folder's chat template as a user message (or the data
    # row's own messages).
    template: bool = False
    # With the template on: a system message before the user message (a data row whose
    # messages hold a system message keeps its own); null = none.
    system: str | None = None
    # With the template on: keyword arguments of the template (tokenizer.apply_chat_template),
    # e.g. {enable_thinking: false}.
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.template, bool):
            raise BadInput(f"task.chat.template must be on or off (true or false), got "
                           f"{self.template!r}.")
        if self.system is not None and (not isinstance(self.system, str)
                                        or not self.system.strip()):
            raise BadInput(f"task.chat.system must be a non-empty string or null (no system "
                           f"message), got {self.system!r}.")
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise BadInput(f"task.chat.kwargs must be a mapping of template argument names to "
                           f"values, e.g. {{enable_thinking: false}}; got {self.kwargs!r}.")
        taken = sorted(set(self.kwargs) & set(_RESERVED_KWARGS))
        if taken:
            raise BadInput(f"task.chat.kwargs may not set {', '.join(taken)}: es-llm sets "
                           f"{', '.join(_RESERVED_KWARGS)} itself; pass only the template's "
                           f"own variables (such as enable_thinking).")

    def __hash__(self):
        # TaskConfig is hashable, and kwargs is a dict (of plain YAML data): hash its text.
        return hash((self.template, self.system, repr(sorted(self.kwargs.items()))))


def render_prompts(problems: list[Problem], tokenizer, chat: ChatConfig, model: str
                   ) -> list[Problem]:
    """``problems`` as the model is sent them under ``chat`` (see the module docstring);
    ``model`` is the folder ``tokenizer`` came from. Rendering a rendered problem again gives
    the same problem."""
    if not chat.template:
        if has_template(tokenizer):
            logging.getLogger(__name__).warning(
                "es-llm: the model %s has a chat template, but task.chat.template=off sends "
                "the prompts raw (as the ES paper does); set task.chat.template=on to render "
                "them through it.", model)
        return list(problems)
    if not has_template(tokenizer):
        raise BadInput(f"task.chat.template=on needs a chat template, and the tokenizer of "
                       f"the model {model!r} has none (no chat_template in its "
                       f"tokenizer_config.json or chat_template.jinja); use "
                       f"task.chat.template=off for raw prompts.")
    return [replace(p, prompt=render(chat_messages(p, chat.system), tokenizer, chat.kwargs,
                                     model),
                    raw_prompt=p.task_prompt)
            for p in problems]


def render_for_model(problems: list[Problem], model: str, chat: ChatConfig) -> list[Problem]:
    """``render_prompts`` with the tokenizer of the model folder ``model``."""
    from transformers import AutoTokenizer

    return render_prompts(problems, AutoTokenizer.from_pretrained(model), chat, model)


def has_template(tokenizer) -> bool:
    """Whether ``tokenizer`` carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_messages(problem: Problem, system: str | None) -> list[dict]:
    """The messages of ``problem``: its row's own ``messages``, or its prompt as one user
    message; ``system`` first unless the messages already open with a system message."""
    messages = [dict(m) for m in problem.messages] if problem.messages else \
        [{"role": "user", "content": problem.task_prompt}]
    if system is not None and not (messages and messages[0].get("role") == "system"):
        messages.insert(0, {"role": "system", "content": system})
    return messages


def render(messages: list[dict], tokenizer, kwargs: dict, model: str) -> str:
    """``messages`` through ``tokenizer``'s chat template, ready for the assistant's turn,
    without a leading BOS the tokenizer adds itself."""
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a template's own errors (jinja, raise_exception)
        raise BadInput(f"the chat template of the model {model!r} refused the messages "
                       f"{messages[:2]!r}...: {type(exc).__name__}: {exc}. Check "
                       f"task.chat.system (some templates allow no system message), "
                       f"task.chat.kwargs and the data's messages.") from None
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and adds_bos(tokenizer):
        return text[len(bos):]
    return text


def adds_bos(tokenizer) -> bool:
    """Whether encoding a string with ``tokenizer`` puts its BOS token first."""
    ids = tokenizer("a").input_ids
    return tokenizer.bos_token_id is not None and ids[:1] == [tokenizer.bos_token_id]
