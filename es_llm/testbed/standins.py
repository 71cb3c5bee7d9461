"""Random-init stand-ins of published decoder architectures, for tests and GPU checks.

A stand-in is a Hugging Face model folder (config.json, model.safetensors, tokenizer files)
that transformers and vLLM both load: one of ``ARCHITECTURES`` (Qwen2, Qwen3, Llama,
Mistral, Gemma, each with the layout details that make it differ: Qwen2's q/k/v biases,
Qwen3's q/k norms, Gemma's (1 + w) norms and scaled embedding, tied or untied output heads)
at one of ``SHAPES`` (``ci``: tiny; ``qwen2.5-0.5b``, ``qwen2.5-1.5b``: the published shapes
of Qwen2.5-0.5B and 1.5B). Its weights are random (no training, no download), its tokenizer
a byte-level BPE trained here on the Countdown data it ships under ``data/`` (the layout of a
testbed folder, so ``es-llm es model=FOLDER`` finds its prompts), with a ChatML chat
template. Everything follows from ``seed``: two builds with the same arguments write the same
files.

transformers loads a qwen2 folder's tokenizer as ``Qwen2Tokenizer``, rebuilt from the saved
vocabulary and merges with Qwen2's own pre-tokenizer (digits one by one); vLLM loads it the
same way, so both backends encode a prompt to the same ids (tested).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from es_llm.errors import BadInput

# The tokenizer's special tokens, in id order (ids 0..4).
SPECIAL_TOKENS = ("<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>", "<|bos|>")
# ChatML, with Qwen3's switch: enable_thinking=false pre-fills an empty think block.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")


@dataclass(frozen=True)
class Shape:
    """Sizes of a stand-in. ``head_dim * num_heads == hidden_size``, as the architectures
    that derive the head size (Qwen2, Llama, Mistral) need. ``tokenizer_vocab``: the BPE's
    target size; ``vocab_size`` None: the tokenizer's size rounded up to 64."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_positions: int
    rope_theta: float
    tokenizer_vocab: int
    vocab_size: int | None = None


SHAPES = {
    # head_dim 32 is the smallest vLLM's CPU attention serves.
    "ci": Shape(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                intermediate_size=256, max_positions=2048, rope_theta=10000.0,
                tokenizer_vocab=512),
    # Qwen2.5-0.5B (config.json of Qwen/Qwen2.5-0.5B), with the same small tokenizer.
    "qwen2.5-0.5b": Shape(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                          head_dim=64, intermediate_size=4864, max_positions=32768,
                          rope_theta=1000000.0, tokenizer_vocab=512, vocab_size=151936),
    # Qwen2.5-1.5B (config.json of Qwen/Qwen2.5-1.5B); the tokenizer is the small one, which
    # the 151936-row embedding covers.
    "qwen2.5-1.5b": Shape(hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                          head_dim=128, intermediate_size=8960, max_positions=32768,
                          rope_theta=1000000.0, tokenizer_vocab=512, vocab_size=151936),
}


@dataclass(frozen=True)
class Architecture:
    """A transformers model type and what its stand-in sets beyond the shape."""

    model_type: str
    tie_word_embeddings: bool
    # Config keys of this architecture only (head_dim where the config reads it, ...).
    extra: dict = field(default_factory=dict)
    # Whether head_dim is written into the config (the others derive it as hidden / heads).
    explicit_head_dim: bool = False


ARCHITECTURES = {
    # q/k/v carry biases in Qwen2 itself; the small Qwen2.5 models tie their embeddings.
    "qwen2": Architecture("qwen2", tie_word_embeddings=True,
                          extra={"use_sliding_window": False}),
    # RMS norms on q and k per head, no biases.
    "qwen3": Architecture("qwen3", tie_word_embeddings=True, explicit_head_dim=True,
                          extra={"attention_bias": False}),
    "llama": Architecture("llama", tie_word_embeddings=False),
    "mistral": Architecture("mistral", tie_word_embeddings=False,
                            extra={"sliding_window": None}),
    # (1 + w) RMS norms, embeddings scaled by sqrt(hidden), GeGLU, tied head.
    "gemma": Architecture("gemma", tie_word_embeddings=True, explicit_head_dim=True,
                          extra={"hidden_activation": "gelu_pytorch_tanh"}),
}
DTYPES = ("float32", "bfloat16", "float16")


def _choice(kind: str, name: str, valid) -> None:
    if name not in valid:
        raise BadInput(f"unknown stand-in {kind} {name!r}; valid choices are: "
                       f"{', '.join(valid)}.")


def countdown_sets(seed: int) -> dict[str, list[dict]]:
    """The ci testbed's held-out Countdown files for ``seed``: ``countdown_eval`` (90
    problems) and ``countdown_rl`` (300), as rows of data/<name>.jsonl."""
    from es_llm.testbed.config import load_testbed_config
    from es_llm.testbed.train import held_out_sets, record

    sets, _ = held_out_sets(load_testbed_config("ci", overrides=[f"seed={seed}"]))
    return {name: [record(p) for p in sets[name]] for name in ("countdown_eval", "countdown_rl")}


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE (GPT-2's byte alphabet, so every string encodes, and a completion
    can end inside a multi-byte character) trained on ``texts``, with ``SPECIAL_TOKENS``,
    no BOS added to encodings (as Qwen) and ``CHAT_TEMPLATE``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    core.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|pad|>",
        bos_token="<|bos|>", additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False, chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20)


def model_config(arch: str, shape: str, tokenizer):
    """The transformers config of stand-in ``arch`` at ``shape`` (both known) for
    ``tokenizer``."""
    from transformers import AutoConfig

    a, s = ARCHITECTURES[arch], SHAPES[shape]
    vocab = s.vocab_size or -(-len(tokenizer) // 64) * 64
    head = {"head_dim": s.head_dim} if a.explicit_head_dim else {}
    return AutoConfig.for_model(
        a.model_type, vocab_size=vocab, hidden_size=s.hidden_size,
        num_hidden_layers=s.num_layers, num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads, intermediate_size=s.intermediate_size,
        max_position_embeddings=s.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta},
        tie_word_embeddings=a.tie_word_embeddings, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        **head, **a.extra)


def build_standin(arch: str, shape: str, out_dir: Path, dtype: str = "float32",
                  seed: int = 0) -> Path:
    """Write stand-in ``arch`` at ``shape`` into ``out_dir`` (created; its files replaced):
    weights in ``dtype`` drawn from transformers' own initialisation under ``seed``, the
    tokenizer, and data/countdown_{eval,rl}.jsonl. Returns ``out_dir``."""
    from transformers import AutoModelForCausalLM

    from es_llm.io import write_jsonl_atomic

    _choice("architecture", arch, ARCHITECTURES)
    _choice("shape", shape, SHAPES)
    _choice("dtype", dtype, DTYPES)
    out_dir = Path(out_dir)
    sets = countdown_sets(seed)
    texts = [r[k] for rows in sets.values() for r in rows for k in ("prompt", "reference")]
    tokenizer = train_tokenizer(texts, SHAPES[shape].tokenizer_vocab)
    config = model_config(arch, shape, tokenizer)
    # A private RNG state: the build never moves the caller's.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    for name, rows in sets.items():
        write_jsonl_atomic(out_dir / "data" / f"{name}.jsonl", rows)
    return out_dir
