"""What several test modules share that is not a fixture: the shared benchmark data, and a tiny
random Llama written to a folder."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
DATA = SHARED / "data"


def shared_data(*parts: str) -> Path:
    """A file from ../shared/data, or skip the test saying why."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared benchmark data is not checked out beside the project")
    return path


def book_default() -> str:
    """The method `ask` runs on books with no --select, as `evsel models info` names it (the
    shipped hybrid.json's test, or EVSEL_HYBRID_WEIGHTS's)."""
    from evsel.engine import Engine
    from evsel.settings import Settings

    return Engine(Settings.resolve()).models_info(load=False)["default_by_kind"]["book"]["method"]


def plant_defaults(folder: Path, **methods: str) -> str:
    """A defaults record naming `methods` by kind (EVSEL_HYBRID_WEIGHTS / hybrid_weights): an
    ingest encodes only the states the kinds' defaults read, and a tiny model's default is BM25."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "defaults.json").write_text(json.dumps({"format": "evsel-defaults/1", "defaults": {
        kind: {"method": method, "why": "planted"} for kind, method in methods.items()}}))
    return str(folder)


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
