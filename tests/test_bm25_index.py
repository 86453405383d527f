"""BM25's persisted index (m004): the scores read from the store equal rank-bm25's BM25Okapi built
from the scope's chunks, bit for bit, for every scope; ingest, re-ingest, rm and a store from before
the migration keep it in step."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from evsel.store import bm25_index
from evsel.store import migrations
from evsel.store.bm25_index import chunk_tokens, tokenize
from evsel.models.selectors import SelectorContext, get_selector
from evsel.store.migrations import MIGRATIONS
from evsel.store.store import Store

WORDS = ("king queen fox wolf river ring key golden old woman son youngest hide found forest castle "
         "letter letters killed kill bridge miller daughter gold silver horse").split()
QUESTIONS = [
    "What did the king give to the youngest son?",
    "Who found the golden key by the river?",
    "the fox, the fox and the wolf",  # repeated query words count again
    "letters killed",  # stemmed: letter, kill
    "zebra unicorn",  # no word of the scope
    "castle",
]


def text(rng: random.Random, n_words: int, extra: str = "") -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words)) + extra


def document(part: str, texts: list[str]) -> dict:
    chunks = [{"seq": i, "text": t, "content_hash": hashlib.sha256(t.encode()).hexdigest(), "n_tokens": len(t.split()),
               "char_start": 0, "char_end": len(t)} for i, t in enumerate(texts)]
    return {"part": part, "kind": "book", "title": part or "book", "metadata": {}, "n_chars": 0, "chunks": chunks}


def corpus(seed: int, n_chunks: int, common: str | None = None) -> list[str]:
    """Chunk texts; `common` is put in two thirds of them (idf < 0: the floor), one chunk has no words."""
    rng = random.Random(seed)
    texts = [text(rng, rng.randint(1, 30), f" {common}" if common and i % 3 else "") for i in range(n_chunks)]
    texts[n_chunks // 2] = "... !!"  # no words: indexed as one '<empty>' token, as the in-memory build does
    return texts


@pytest.fixture
def store() -> Store:
    """Two collections: a file with two parts and a book in 'default', a third book in 'other'."""
    store = Store()
    default = store.collection_id("default", create=True)
    other = store.collection_id("other", create=True)
    store.replace_file(default, "/chats.json", "s1", [document("a", corpus(1, 40, "said")),
                                                      document("b", corpus(2, 25, "said"))])
    store.replace_file(default, "/book.txt", "s2", [document("", corpus(3, 60, "said"))])
    store.replace_file(other, "/other.txt", "s3", [document("", corpus(4, 35, "said"))])
    return store


def persisted(store: Store, chunks, query: list[str], k1: float = 1.5, b: float = 0.75):
    scope = store.bm25_scope(chunks)
    return None if scope is None else store.bm25_scores(scope, query, k1, b)


def reference(chunks, query: list[str], k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    return BM25Okapi([chunk_tokens(c.text) for c in chunks], k1=k1, b=b).get_scores(query)


def scopes(store: Store) -> dict[str, list]:
    return {
        "store": store.chunks(),
        "doc": store.chunks(doc_ids=[3]),
        "docs": store.chunks(doc_ids=[1, 4]),
        "collection": store.chunks(collection="default"),
        "other collection": store.chunks(collection="other"),
        "doc in collection": store.chunks(doc_ids=[2], collection="default"),
    }


def assert_same_scores(store: Store, chunks, k1: float = 1.5, b: float = 0.75) -> None:
    for question in QUESTIONS:
        query = tokenize(question)
        got = persisted(store, chunks, query, k1, b)
        assert got is not None, question
        want = reference(chunks, query, k1, b)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want), (question, np.abs(got - want).max())


def test_scores_equal_bm25okapi_on_every_scope(store):
    for name, chunks in scopes(store).items():
        assert chunks, name
        assert_same_scores(store, chunks)
    assert_same_scores(store, store.chunks(), k1=1.2, b=0.5)


def test_the_idf_floor_uses_the_average_idf_of_the_whole_scope(store):
    for name, chunks in scopes(store).items():
        query = tokenize("the king said")
        okapi = BM25Okapi([chunk_tokens(c.text) for c in chunks])
        # 'said' is in two thirds of the chunks: its idf is the floor, epsilon * average idf
        assert okapi.idf["said"] == okapi.epsilon * okapi.average_idf != 0, name
        assert np.array_equal(persisted(store, chunks, query), okapi.get_scores(query)), name


def test_selector_uses_the_store_and_ranks_as_in_memory(store, monkeypatch):
    chunks = store.chunks()
    in_memory = get_selector("bm25", SelectorContext(load_backbone=None, states=None))
    built = []
    monkeypatch.setattr(bm25_index, "chunk_tokens", lambda t: built.append(t) or chunk_tokens(t))
    monkeypatch.setattr("evsel.models.selectors.bm25.chunk_tokens", bm25_index.chunk_tokens)
    persisted = get_selector("bm25", SelectorContext(load_backbone=None, states=None, store=store))
    for question in QUESTIONS:
        got = [(s.chunk.id, s.score) for s in persisted.rank(question, chunks)]
        assert not built  # nothing tokenized: read from the index
        assert got == [(s.chunk.id, s.score) for s in in_memory.rank(question, chunks)]
        built.clear()
    # rrf's BM25 part goes the same way
    rrf = get_selector("rrf:random", SelectorContext(load_backbone=None, states=None, store=store))
    rrf.rank(QUESTIONS[0], chunks)
    assert not built


def test_chunks_that_are_not_whole_stored_documents_are_built_in_memory(store):
    chunks = store.chunks()
    query = tokenize(QUESTIONS[0])
    candidates = chunks[5:55]  # a reranker's candidates: part of documents
    assert store.bm25_scope(candidates) is None
    shuffled = chunks[::-1]
    assert store.bm25_scope(shuffled) is None
    interleaved = [chunks[0], *store.chunks(doc_ids=[2]), *chunks[1:40]]
    assert store.bm25_scope(interleaved) is None
    selector = get_selector("bm25", SelectorContext(load_backbone=None, states=None, store=store))
    for subset in (candidates, shuffled):
        assert selector.scores(QUESTIONS[0], subset) == reference(subset, query).tolist()


def test_stale_chunk_records_are_not_scored_from_the_new_version(store):
    before = store.chunks(doc_ids=[3])
    collection = store.collection_id("default")
    texts = corpus(3, 60, "said")
    texts[7] = "the miller's daughter spun gold"
    store.replace_file(collection, "/book.txt", "s2b", [document("", texts)])
    query = tokenize("miller daughter gold said")
    assert store.bm25_scope(before) is None  # the old chunks: not what is stored now
    after = store.chunks(doc_ids=[3])
    assert after[7].text != before[7].text
    assert np.array_equal(persisted(store, after, query), reference(after, query))


def test_a_document_replaced_under_an_open_scope_is_not_scored_from_the_new_version(store):
    chunks = store.chunks()
    scope = store.bm25_scope(chunks)
    selector = get_selector("bm25", SelectorContext(load_backbone=None, states=None, store=store,
                                                    scope_data=lambda _kind, _chunks, _build, *_: scope))  # a kept scope
    store.replace_file(store.collection_id("default"), "/book.txt", "s2b", [document("", corpus(7, 60))])
    query = tokenize(QUESTIONS[1])
    assert store.bm25_scores(scope, query, 1.5, 0.75) is None
    assert selector.scores(QUESTIONS[1], chunks) == reference(chunks, query).tolist()  # the chunks in hand


def index_rows(store: Store) -> dict[str, int]:
    db = store.db
    return {
        "docs": db.execute("select count(*) from bm25_docs").fetchone()[0],
        "postings": db.execute("select count(*) from bm25_postings").fetchone()[0],
        "orphan docs": db.execute("select count(*) from bm25_docs where doc_id not in (select id from documents)").fetchone()[0],
        "orphan postings": db.execute(
            "select count(*) from bm25_postings where doc_id not in (select id from documents)").fetchone()[0],
    }


def expected_postings(store: Store) -> int:
    return sum(len({t for c in store.chunks(doc_ids=[d["id"]]) for t in chunk_tokens(c.text)}) for d in store.documents())


def test_ingest_reingest_and_rm_keep_the_index_in_step(store):
    assert index_rows(store) == {"docs": 4, "postings": expected_postings(store), "orphan docs": 0, "orphan postings": 0}
    collection = store.collection_id("default")
    # a new version of the two-part file: part a changes, part b vanishes
    store.replace_file(collection, "/chats.json", "s1b", [document("a", corpus(9, 30, "said"))])
    assert [d["id"] for d in store.documents()] == [1, 3, 4]
    assert index_rows(store) == {"docs": 3, "postings": expected_postings(store), "orphan docs": 0, "orphan postings": 0}
    for chunks in (store.chunks(), store.chunks(doc_ids=[1]), store.chunks(collection="default")):
        assert_same_scores(store, chunks)
    store.remove_documents([3])
    assert index_rows(store) == {"docs": 2, "postings": expected_postings(store), "orphan docs": 0, "orphan postings": 0}
    assert_same_scores(store, store.chunks())
    store.remove_documents([1, 4])
    assert index_rows(store) == {"docs": 0, "postings": 0, "orphan docs": 0, "orphan postings": 0}


def test_a_failed_replace_leaves_the_index_as_it_was(store):
    before = index_rows(store), store.db.execute("select * from bm25_docs order by doc_id").fetchall()
    collection = store.collection_id("default")
    broken = document("b", ["fine text", "more"])
    broken["chunks"][1].pop("content_hash")
    with pytest.raises(KeyError):
        store.replace_file(collection, "/chats.json", "s1c", [document("a", corpus(8, 10)), broken])
    assert (index_rows(store), store.db.execute("select * from bm25_docs order by doc_id").fetchall()) == before
    assert_same_scores(store, store.chunks())


def test_a_store_from_before_the_migration_is_backfilled():
    # the store as evsel wrote it before m004: no BM25 tables, chunks stored without an index
    # (a patch context of its own: undoing the test's monkeypatch would also undo EVSEL_HOME)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(migrations, "MIGRATIONS", [m for m in MIGRATIONS if m[0] < "m004"])
        patch.setattr(bm25_index, "index_document", lambda *_, **__: None)
        patch.setattr(bm25_index, "drop_document", lambda *_, **__: None)

        class NoIndex:  # replace_file streams into the index through this
            def __init__(self, *_):
                pass

            def add(self, chunks):
                list(chunks)

            def finish(self, **_):
                pass

        patch.setattr(bm25_index, "DocumentIndexer", NoIndex)
        old = Store()
        collection = old.collection_id("default", create=True)
        old.replace_file(collection, "/one.txt", "s1", [document("", corpus(5, 50, "said"))])
        old.replace_file(collection, "/two.txt", "s2", [document("", corpus(6, 20))])
        assert "bm25_docs" not in old.db.table_names()

    store = Store()  # connect() applies m004, which indexes what is already stored
    applied = [r[0] for r in store.db.execute("select name from _evsel_migrations order by rowid")]
    assert "m004_bm25_index" in applied
    assert index_rows(store)["docs"] == 2
    for chunks in (store.chunks(), store.chunks(doc_ids=[2])):
        assert_same_scores(store, chunks)


def test_empty_question_and_single_chunk_scopes(store):
    collection = store.collection_id("other")
    store.replace_file(collection, "/tiny.txt", "s9", [document("", ["The king."])])
    [tiny] = [d["id"] for d in store.documents() if d["path"] == "/tiny.txt"]
    chunks = store.chunks(doc_ids=[tiny])
    assert_same_scores(store, chunks)
    selector = get_selector("bm25", SelectorContext(load_backbone=None, states=None, store=store))
    assert selector.scores("the of and", chunks) == [0.0]  # only stopwords
