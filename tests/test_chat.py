"""Chat templates (``task.chat``): rendering, data rows' messages, the BOS token, the refusal
without a template, the log note with one unused, and ``es-llm eval`` storing the rendered
prompt."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from es_llm.cli import main
from es_llm.errors import BadInput
from es_llm.io import read_jsonl
from es_llm.tasks import Problem, TaskConfig, build_task
from es_llm.tasks.chat import ChatConfig, render_prompts
from es_llm.testbed.tokenizer import build_tokenizer

# A ChatML-like template: BOS, one line per message, and the assistant's turn, which opens
# with an empty think block when enable_thinking is false.
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>"
            "{% if enable_thinking is defined and not enable_thinking %}<think></think>"
            "{% endif %}{% endif %}")


def chat_tokenizer():
    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


PROBLEM = Problem(id="p0", prompt="nums 1 2 make 3\n", gold={"numbers": [1, 2], "target": 3})


def test_on_renders_system_and_user_with_the_kwargs_and_keeps_the_raw_prompt():
    tok = chat_tokenizer()
    chat = ChatConfig(template=True, system="Be brief.", kwargs={"enable_thinking": False})
    [p] = render_prompts([PROBLEM], tok, chat, "m")
    # The template's BOS is dropped: the tokenizer adds its own when it encodes the prompt.
    assert p.prompt == ("<|system|>Be brief.\n<|user|>nums 1 2 make 3\n\n"
                        "<|assistant|><think></think>")
    assert p.raw_prompt == p.task_prompt == PROBLEM.prompt
    assert (p.id, p.gold) == (PROBLEM.id, PROBLEM.gold)
    ids = tok(p.prompt).input_ids
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    # Rendering again changes nothing; thinking on drops the empty think block.
    assert render_prompts([p], tok, chat, "m") == [p]
    [thinking] = render_prompts([PROBLEM], tok, ChatConfig(template=True), "m")
    assert thinking.prompt == "<|user|>nums 1 2 make 3\n\n<|assistant|>"


def test_a_row_with_messages_renders_them_and_keeps_its_own_system_message():
    chat = ChatConfig(template=True, system="Default.")
    turns = ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes?"},
             {"role": "user", "content": "solve"})
    [p] = render_prompts([Problem("q", "raw", 0, messages=turns)], chat_tokenizer(), chat, "m")
    assert p.prompt == ("<|system|>Default.\n<|user|>hi\n<|assistant|>yes?\n<|user|>solve\n"
                        "<|assistant|>")
    own = ({"role": "system", "content": "Own."}, {"role": "user", "content": "go"})
    [q] = render_prompts([Problem("q", "raw", 0, messages=own)], chat_tokenizer(), chat, "m")
    assert q.prompt == "<|system|>Own.\n<|user|>go\n<|assistant|>"


def test_messages_ride_along_from_a_data_file_and_bad_ones_are_refused(tmp_path):
    data = tmp_path / "cd.jsonl"
    rows = [{"numbers": [1, 2], "target": 3, "messages": [{"role": "user", "content": "3?"}]},
            {"numbers": [2, 2], "target": 4}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, second = build_task(TaskConfig(name="countdown", data=str(data))).problems()
    assert first.messages == ({"role": "user", "content": "3?"},) and second.messages is None
    [p] = render_prompts([first], chat_tokenizer(), ChatConfig(template=True), "m")
    assert p.prompt == "<|user|>3?\n<|assistant|>" and p.raw_prompt == first.prompt
    data.write_text(json.dumps({"numbers": [1, 2], "target": 3, "messages": ["hi"]}) + "\n")
    with pytest.raises(BadInput, match="record 0 has messages"):
        build_task(TaskConfig(name="countdown", data=str(data))).problems()


def test_on_without_a_template_is_refused_naming_the_model():
    with pytest.raises(BadInput, match="tokenizer of the model 'models/plain' has none"):
        render_prompts([PROBLEM], build_tokenizer(), ChatConfig(template=True), "models/plain")


def test_off_sends_prompts_raw_with_one_note_when_the_model_has_a_template(caplog):
    with caplog.at_level(logging.INFO, logger="es_llm.tasks.chat"):
        assert render_prompts([PROBLEM, PROBLEM], chat_tokenizer(), ChatConfig(), "m") == \
            [PROBLEM, PROBLEM]
        notes = [r for r in caplog.records if "chat template" in r.getMessage()]
        assert len(notes) == 1 and "task.chat.template=on" in notes[0].getMessage()
        caplog.clear()
        render_prompts([PROBLEM], build_tokenizer(), ChatConfig(), "m")
        assert not caplog.records


@pytest.mark.parametrize("chat, message", [
    ({"template": "maybe"}, "task.chat.template must be on or off"),
    ({"system": ""}, "task.chat.system must be a non-empty string"),
    ({"kwargs": {"tokenize": True}}, "task.chat.kwargs may not set tokenize"),
])
def test_bad_chat_settings_are_refused(chat, message):
    with pytest.raises(BadInput, match=message):
        ChatConfig(**chat)


def templated_copy(ci_testbed, folder):
    """The ci testbed saved again with ``TEMPLATE`` as its tokenizer's chat template."""
    from transformers import AutoTokenizer

    shutil.copytree(ci_testbed, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(folder)
    return folder


def test_eval_stores_the_rendered_prompt_and_off_leaves_one_note(ci_testbed, tmp_path):
    model = templated_copy(ci_testbed, tmp_path / "model")
    out = tmp_path / "on"
    assert main(["eval", "--model", str(model), "--task", "countdown", "--n", "1",
                 "--temperature", "0", "--backend", "hf", "--out", str(out), "--no-progress",
                 "task.limit=3", "task.chat.template=on", "task.chat.system=Solve.",
                 "task.chat.kwargs={enable_thinking: false}"]) == 0
    held_out = read_jsonl(model / "data" / "countdown_eval.jsonl")[:3]
    rows = read_jsonl(out / "samples.jsonl")
    assert [r["prompt"] for r in rows] == [
        f"<|system|>Solve.\n<|user|>{h['prompt']}\n<|assistant|><think></think>"
        for h in held_out]
    assert [r["raw_prompt"] for r in rows] == [h["prompt"] for h in held_out]
    off = tmp_path / "off"
    assert main(["eval", "--model", str(model), "--task", "countdown", "--n", "1",
                 "--temperature", "0", "--backend", "hf", "--out", str(off), "--no-progress",
                 "task.limit=3"]) == 0
    assert [r["prompt"] for r in read_jsonl(off / "samples.jsonl")] == \
        [h["prompt"] for h in held_out]
    assert (off / "log.txt").read_text().count("task.chat.template=off sends") == 1


def test_es_and_grpo_train_on_the_same_rendered_prompts(ci_testbed, tmp_path):
    from es_llm.comm.serial import SerialComm
    from es_llm.es.config import ESRunConfig
    from es_llm.es.setup import build_edges
    from gradient.config import GRPORunConfig
    from gradient.loop.setup import build

    model = templated_copy(ci_testbed, tmp_path / "model")
    task = TaskConfig(name="countdown", data=str(model / "data" / "countdown_rl.jsonl"),
                      limit=4, chat=ChatConfig(template=True, system="S."))
    _, es_problems = build_edges(ESRunConfig(model=str(model), task=task, backend="hf"),
                                 SerialComm())
    _, grpo_problems, _ = build(GRPORunConfig(model=str(model), task=task, backend="hf"))
    raw = build_task(task).problems()
    assert [p.prompt for p in es_problems] == [p.prompt for p in grpo_problems] == \
        [f"<|system|>S.\n<|user|>{p.prompt}\n<|assistant|>" for p in raw]


@pytest.mark.vllm
def test_hf_and_vllm_encode_a_rendered_prompt_to_the_same_ids(vllm_engine, hf_engine):
    """The rendered string (template BOS dropped) gets one BOS from either backend."""
    from vllm import SamplingParams as VLLMParams

    [p] = render_prompts([PROBLEM], chat_tokenizer(), ChatConfig(template=True, system="S."),
                         "m")
    hf_ids = hf_engine.tokenizer(p.prompt).input_ids
    [out] = vllm_engine.llm.generate([p.prompt], VLLMParams(max_tokens=1), use_tqdm=False)
    assert list(out.prompt_token_ids) == hf_ids
    assert hf_ids.count(hf_engine.tokenizer.bos_token_id) == 1


def test_settings_where_a_template_cannot_apply_are_refused():
    from es_llm.compare.config import BlindSpotConfig, CompareConfig
    from es_llm.evaluate import EvalConfig
    from es_llm.testtime.run import TestTimeConfig

    task = TaskConfig(chat=ChatConfig(template=True))
    with pytest.raises(BadInput, match="testtime writes its own role prompts"):
        TestTimeConfig(model="m", task=task)
    with pytest.raises(BadInput, match="the blind spot reorders raw Countdown prompts"):
        CompareConfig(task=task, blind_spot=BlindSpotConfig(enabled=True))
    with pytest.raises(BadInput, match="no --model is given"):
        EvalConfig(backend="reference", task=task)
    assert CompareConfig(task=task).task.chat.template  # the sampled comparison renders
