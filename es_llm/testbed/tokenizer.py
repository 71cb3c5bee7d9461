"""The testbed's character-level tokenizer, saved as ordinary Hugging Face tokenizer files.

Every printable ASCII character and the newline is one token; anything else maps to
``<unk>``. The post-processor adds ``<bos>`` itself, so a prompt encodes to the same ids in
the training code, in ``AutoTokenizer`` and inside vLLM (a model evaluated without the BOS it
was trained with loses most of its accuracy).
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>", "<mask>")


def char_vocab() -> dict[str, int]:
    """Token -> id: the special tokens first, then newline and printable ASCII (32..126)."""
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    tokens = list(SPECIAL_TOKENS) + chars
    return {tok: i for i, tok in enumerate(tokens)}


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = char_vocab()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # An empty-pattern split isolates every character, spaces and newlines included.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(""), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
