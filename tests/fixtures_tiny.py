"""The one tiny random Llama the model tests run on (registered by conftest.py's `pytest_plugins`).

`tiny_llama(words, **shape)` writes a seeded random-weight Llama with a word-level tokenizer over
`words` once per session per distinct vocabulary and shape, and returns its folder. The default is
SmolLM2's head grouping (6 query heads over 2 KV heads, so query head h reads KV head h // 3) that
the QRRanker, BlockSearch, memory and training tests compute by hand; a test that needs another
shape says so (BlockSearch routes at layer 2 of 4, the answer step needs a chat template)."""

from __future__ import annotations

from pathlib import Path

import pytest

WORDS = ["the", "keeper", "light", "storm", "ship", "rock", "night", "lamp", "sea", "gull", "tower", "boat",
         "wind", "wave", "door", "key", "letter", "knife", "blood", "clock", "window", "stair", "rope", "oil",
         "who", "killed", "what", "where", "Query", "N", "A", "User", "Assistant", "[", "]", ":", "?", "/"]
# token ids 0-3, before the words
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
# SmolLM2's grouping at a tiny size: head_dim 8
GQA_SHAPE = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=6,
                 num_key_value_heads=2, max_position_embeddings=2048)
# two layers of four heads over two: what the answer step and UNREAL's hand computations need
SMALL_SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2)
# the answer step's prompts go through the tokenizer's chat template, as SmolLM2's do
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} : {{ m['content'] }} <|im_end|> "
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant : {% endif %}")


def _write(folder: Path, words: list[str], chat: bool, shape: dict) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for word in SPECIAL + list(words):
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<unk>")
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, vocab_size=len(vocab), **shape)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """tiny_llama(words=WORDS, chat=False, **shape) -> the model's folder. `words` follow the four
    special tokens in the vocabulary (ids in order, repeats skipped); `shape` overrides GQA_SHAPE's
    LlamaConfig fields; `chat` adds CHAT_TEMPLATE. Each distinct model is written once."""
    written: dict[tuple, Path] = {}

    def make(words: list[str] = WORDS, *, chat: bool = False, **shape) -> Path:
        shape = {**GQA_SHAPE, **shape}
        key = (tuple(words), chat, tuple(sorted(shape.items())))
        if key not in written:
            written[key] = _write(tmp_path_factory.mktemp("tiny-llama"), words, chat, shape)
        return written[key]

    return make


@pytest.fixture(scope="session")
def gqa_model_dir(tiny_llama) -> Path:
    """The default tiny model, its vocabulary WORDS and the numbers 0-59, no chat template."""
    return tiny_llama(WORDS + [str(i) for i in range(60)])


@pytest.fixture
def tiny_backbone(gqa_model_dir):
    """That model through the real Backbone, in float32 (hand computations compare to 1e-5)."""
    from evsel.models.runtime.backbone import Backbone

    backbone = Backbone(str(gqa_model_dir), "cpu")
    backbone.model.float()
    return backbone
