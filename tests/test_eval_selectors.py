"""The baseline selectors evsel eval compares against: random, rrf (dense is exercised in test_eval_cli)."""

from __future__ import annotations

import hashlib

import pytest

from evsel.errors import EvselError
from evsel.models.selectors import available
from evsel.models.selectors import get_selector as _get_selector
from evsel.store.store import ChunkRecord


def get_selector(name, **kwargs):
    """A selector on the context `evsel eval` gives (chunks in memory, eval's own state cache)."""
    from evsel.engine import Engine

    return _get_selector(name, Engine().selector_context(for_eval=True), **kwargs)


def _chunks(texts):
    return [ChunkRecord(id=i + 1, doc_id=1, seq=i, text=t, content_hash=hashlib.sha256(t.encode()).hexdigest(),
                        n_tokens=len(t.split()), char_start=0, char_end=len(t)) for i, t in enumerate(texts)]


def test_baselines_are_registered():
    assert {"bm25", "dense", "random", "rrf"} <= set(available())


def test_random_is_fixed_by_seed_and_question():
    chunks = _chunks([f"passage {i}" for i in range(50)])
    a = get_selector("random").scores("who?", chunks)
    assert a == get_selector("random").scores("who?", chunks)  # same draw in another instance
    assert a != get_selector("random").scores("where?", chunks)
    assert a != get_selector("random", seed=1).scores("who?", chunks)
    ranked = get_selector("random").rank("who?", chunks)
    assert sorted(s.chunk.id for s in ranked) == list(range(1, 51))


def test_rrf_fuses_reciprocal_ranks():
    chunks = _chunks(["the lighthouse keeper", "a quiet harbour", "the keeper of the lighthouse lamp"])
    fused = get_selector("rrf", other="random")
    bm25 = get_selector("bm25").scores("lighthouse keeper lamp", chunks)
    rand = get_selector("random").scores("lighthouse keeper lamp", chunks)

    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: -values[i])
        return {i: r for r, i in enumerate(order, 1)}

    rb, rr = ranks(bm25), ranks(rand)
    expected = [1 / (60 + rb[i]) + 1 / (60 + rr[i]) for i in range(3)]
    assert fused.scores("lighthouse keeper lamp", chunks) == expected
    assert fused.name == "rrf:random"


def test_spec_with_argument_builds_rrf():
    assert get_selector("rrf:random").name == "rrf:random"
    with pytest.raises(EvselError, match="only hybrid, rrf, qrranker and blocksearch take an argument"):
        get_selector("bm25:dense")
    with pytest.raises(EvselError, match="unknown selector"):
        get_selector("rrf:nope")

