"""The tiny random Llama with SmolLM2's head grouping (6 query heads over 2 KV heads, so query head
h reads KV head h // 3) that the QRRanker, BlockSearch, memory and training tests run on, built
once per session (registered by conftest.py's `pytest_plugins`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import write_tiny_llama

WORDS = ["the", "keeper", "light", "storm", "ship", "rock", "night", "lamp", "sea", "gull", "tower", "boat",
         "wind", "wave", "door", "key", "letter", "knife", "blood", "clock", "window", "stair", "rope", "oil",
         "who", "killed", "what", "where", "Query", "N", "A", "User", "Assistant", "[", "]", ":", "?", "/"]


@pytest.fixture(scope="session")
def gqa_model_dir(tmp_path_factory) -> Path:
    """A random-weight Llama: 3 layers, hidden 48, 6 query heads over 2 KV heads (groups of 3, as
    SmolLM2's 9 over 3), head_dim 8, with a word-level tokenizer over WORDS and the numbers 0-59,
    and no chat template."""
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<unk>": 3}
    for word in WORDS + [str(i) for i in range(60)]:
        vocab.setdefault(word, len(vocab))
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-gqa-llama"), vocab, vocab_size=len(vocab), hidden_size=48,
                            intermediate_size=96, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                            max_position_embeddings=2048)


@pytest.fixture
def tiny_backbone(gqa_model_dir):
    """That model through the real Backbone, in float32 (hand computations compare to 1e-5)."""
    from evsel.models.runtime.backbone import Backbone

    backbone = Backbone(str(gqa_model_dir), "cpu")
    backbone.model.float()
    return backbone
