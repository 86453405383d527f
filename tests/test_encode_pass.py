"""The shared encode pass (models/encode_pass.py): one forward gives QRRanker's stored block KV
exactly as the scorer's own background encode writes it, and the residual states read in that
block context, kept apart from UNREAL's own. The tiny random Llama with SmolLM2's head grouping."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from evsel.ingest.chunker import content_hash
from evsel.models import encode_pass
from evsel.models.qrranker import kv as qrranker_kv
from evsel.models.unreal import selection as unreal
from evsel.models.qrranker import rerank as qr
from evsel.models.runtime.backbone import run_layers

from fixtures_tiny import WORDS

HEADS = [(0, 4), (1, 0), (1, 5), (2, 2)]


def _text(seed: int, n: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS[:24], size=n))


TEXTS = [_text(1, 9), _text(2, 4), _text(3, 13), _text(4, 6), _text(5, 1), _text(6, 21), _text(7, 3)]


@dataclass
class Chunk:
    text: str
    content_hash: str


def _scorer(backbone, folder, adapter=None):
    scorer = qr.QRScorer(backbone, HEADS, qr.ScorerConfig(encoding="block", batch_tokens=40), adapter=adapter)
    scorer.use_kv_files(folder)
    return scorer


@pytest.mark.parametrize("adapted", [False, True], ids=["heads", "adapter"])
def test_one_pass_writes_the_kv_files_the_scorer_writes_alone(tiny_backbone, tmp_path, adapted):
    adapter = None
    if adapted:
        adapter = qr.new_adapter(tiny_backbone.model, HEADS, rank=4, alpha=8.0, seed=0)
    alone = _scorer(tiny_backbone, tmp_path / "alone", adapter)
    assert alone.store_kv(TEXTS) == len(TEXTS)
    shared = _scorer(tiny_backbone, tmp_path / "shared", adapter)
    chunks = [Chunk(t, content_hash(t)) for t in TEXTS]
    assert encode_pass.BlockPass(shared, 3, 2).encode_store(chunks) == len(TEXTS)
    for chunk in chunks:  # the same bytes: the same KV through the same codec
        assert shared.kv_files.files.path(chunk.content_hash).read_bytes() == \
            alone.kv_files.files.path(chunk.content_hash).read_bytes()
    assert shared.kv_files.writes == len(TEXTS)


def test_residual_states_are_those_of_the_block_after_the_prefix(tiny_backbone, tmp_path):
    scorer = _scorer(tiny_backbone, tmp_path)
    layer, pool = 2, 3
    block_pass = encode_pass.BlockPass(scorer, layer, pool)
    _, _, pooled = block_pass.encode(TEXTS)
    prefix = scorer.prompt.prefix(None)
    label = len(scorer.prompt.ids("[1]"))
    for i, text in enumerate(TEXTS):  # a block after the prefix is the causal pass of prefix + block
        block, start = scorer.prompt.candidate(1, text)
        with torch.inference_mode():
            states = run_layers(tiny_backbone.model, [layer], input_ids=torch.tensor([prefix + block]))[layer]
        first = len(prefix) + min(start + label, len(block) - 1)
        want = unreal.pool_states(states[:, first:], [states.shape[1] - first], pool, offset=0)[0].numpy()
        assert np.allclose(pooled[i].astype(np.float32), want, atol=2e-3, rtol=2e-3)


def test_states_are_kept_apart_from_unreals_own(tiny_backbone, tmp_path, evsel_home):
    from evsel.models.shared.statecache import StateCache
    from evsel.store.store import Store

    store = Store()
    scorer = _scorer(tiny_backbone, tmp_path)
    chunks = [Chunk(t, content_hash(t)) for t in TEXTS[:3]]
    encode_pass.BlockPass(scorer, 3, 2).encode_store(chunks, StateCache(store))
    fingerprint = tiny_backbone.fingerprint
    hashes = [c.content_hash for c in chunks]
    assert store.stored_state_hashes(fingerprint, unreal.METHOD, encode_pass.block_state_key(3, 2), hashes) == set(hashes)
    assert store.stored_state_hashes(fingerprint, unreal.METHOD, unreal.state_key(3, 2), hashes) == set()
    assert encode_pass.block_state_key(3, 2) != unreal.state_key(3, 2)
    assert qrranker_kv.FORMAT.endswith("/3")


@pytest.mark.model
def test_real_model_one_pass_gives_the_stored_kv_and_the_states_measured(tmp_path):
    """SmolLM2 with the shipped heads, adapter and UNREAL adapter on the Sherlock Holmes book's first
    chunks: the pass's KV files are the scorer's own byte for byte (same batches), and its residual
    states sit as close to UNREAL's own as docs/UNREAL.md states (not closer: they are not UNREAL's)."""
    from evsel.engine import Engine
    from evsel.models.selectors import get_selector
    from evsel.settings import Settings
    from helpers import shared_data

    book = shared_data("nocha", "books", "the_adventures_of_sherlock_holmes_arthur_conan_doyle.txt")
    cut = tmp_path / "start.txt"
    cut.write_text(book.read_text(encoding="utf-8")[:9000], encoding="utf-8")
    engine = Engine(Settings.resolve().with_(qrranker_kv=True, encode=False))
    engine.ingest([str(cut)])
    chunks = engine.store.chunks()
    alone = get_selector("qrranker", engine.selector_context()).scorer
    alone.use_kv_files(tmp_path / "alone")
    assert alone.store_kv([c.text for c in chunks], [c.content_hash for c in chunks]) == len(chunks)
    shared = get_selector("qrranker", engine.selector_context()).scorer
    shared.use_kv_files(tmp_path / "shared")
    config = unreal.adapter_config(engine.backbone)
    assert encode_pass.BlockPass(shared, config.layer, config.pool).encode_store(chunks) == len(chunks)
    for chunk in chunks:
        assert shared.kv_files.files.path(chunk.content_hash).read_bytes() == \
            alone.kv_files.files.path(chunk.content_hash).read_bytes()
    selector = get_selector("unreal", engine.selector_context())
    own = unreal.ChunkEncoder(engine.backbone, [config.layer], config.pool).encode([c.text for c in chunks])[config.layer]
    _, _, block = encode_pass.BlockPass(shared, config.layer, config.pool).encode([c.text for c in chunks])
    cosine = torch.nn.functional.cosine_similarity(selector.query.chunk_keys(own), selector.query.chunk_keys(block),
                                                   dim=-1)
    assert 0.8 < float(cosine.mean()) < 0.99  # near, and not the same states
