"""Every test gets its own EVSEL_HOME; the dense model copy is shared across the session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
DATA = SHARED / "data"


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(autouse=True)
def evsel_home(tmp_path, monkeypatch, model_cache) -> Path:
    home = tmp_path / "evsel-home"
    monkeypatch.setenv("EVSEL_HOME", str(home))
    monkeypatch.setenv("EVSEL_MODEL_CACHE", str(model_cache))
    monkeypatch.setenv("EVSEL_NO_DAEMON", "1")
    monkeypatch.setenv("EVSEL_ENCODE", "0")  # chunk states at ingest cost minutes on CPU; tests that need them ask
    monkeypatch.delenv("EVSEL_MODEL", raising=False)
    monkeypatch.delenv("EVSEL_DEVICE", raising=False)
    return home


def write_tiny_llama(folder: Path, vocab: dict[str, int], **config) -> Path:
    """A random-weight Llama (seeded) with a word-level tokenizer over `vocab`, saved in `folder`;
    `config` sets its shape (hidden_size, num_hidden_layers, heads, ...)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<unk>")
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, **config)).save_pretrained(folder)
    return folder


def shared_data(*parts: str) -> Path:
    """A file from ../shared/data, or skip the test saying why."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared benchmark data is not checked out beside the project")
    return path


@pytest.fixture(scope="session")
def backbone_tokenizer(model_cache):
    """The real SmolLM2 tokenizer (no model weights needed)."""
    os.environ.setdefault("EVSEL_MODEL_CACHE", str(model_cache))
    from evsel.models.backbone import Backbone

    previous = os.environ.get("EVSEL_MODEL_CACHE")
    os.environ["EVSEL_MODEL_CACHE"] = str(model_cache)
    try:
        backbone = Backbone()
        _ = backbone.tokenizer
        _ = backbone.fingerprint
    finally:
        if previous is None:
            os.environ.pop("EVSEL_MODEL_CACHE", None)
        else:
            os.environ["EVSEL_MODEL_CACHE"] = previous
    return backbone
