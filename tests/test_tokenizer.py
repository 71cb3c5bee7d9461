"""The testbed tokenizer: character level, BOS added by the tokenizer itself, and the same
ids in training, transformers and vLLM."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from es_llm.io import read_jsonl
from es_llm.testbed.tokenizer import build_tokenizer, char_vocab


def test_every_character_is_one_token_and_bos_comes_first():
    tok = build_tokenizer()
    text = "nums 7 3 4 make 25\n"
    ids = tok(text).input_ids
    vocab = char_vocab()
    assert ids == [vocab["<bos>"]] + [vocab[c] for c in text]
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_unknown_characters_map_to_unk():
    tok = build_tokenizer()
    assert tok("é").input_ids == [char_vocab()["<bos>"], char_vocab()["<unk>"]]


def test_saved_model_folder_encodes_like_training(ci_testbed):
    # A model folder's config.json can make AutoTokenizer pick a model-specific tokenizer
    # class that rebuilds the tokenizer (it happens with model_type qwen2); check the
    # saved folder round-trips exactly.
    train_tok = build_tokenizer()
    auto = AutoTokenizer.from_pretrained(ci_testbed)
    for row in read_jsonl(ci_testbed / "data" / "countdown_eval.jsonl")[:20]:
        assert auto(row["prompt"]).input_ids == train_tok(row["prompt"]).input_ids


@pytest.mark.vllm
def test_vllm_feeds_the_model_the_training_ids(vllm_engine, ci_testbed):
    train_tok = build_tokenizer()
    for row in read_jsonl(ci_testbed / "data" / "countdown_eval.jsonl")[:10]:
        assert vllm_engine.prompt_token_ids(row["prompt"]) == train_tok(row["prompt"]).input_ids
