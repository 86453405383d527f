"""QRRanker's memory prefix: blocks and sessions, the summaries' cache, the prefix a question's
candidates get, the block-encoded memory against explicit masked attention, and the real model
writing summaries at ingest (in-process and through the daemon) and reading them at ask."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
import torch
from evsel.errors import EvselError
from evsel.models.qrranker import memory as mem
from evsel.models.qrranker import rerank as qr
from evsel.store.store import ChunkRecord, Store

from daemon_helpers import daemon_home, evsel, evsel_json, status, wait_for  # noqa: F401  (fixture)
from test_qrranker import (HEADS, QUESTION, TEXTS, _block_reference, _eager, _reference_attention,
                           _reference_scores)


def _chunk(i: int, doc: int = 1, session: str | None = None, text: str | None = None) -> ChunkRecord:
    text = text or f"chunk {i} of document {doc}"
    return ChunkRecord(id=doc * 1000 + i, doc_id=doc, seq=i, text=text, content_hash=f"{doc}-{i}-{text}",
                       n_tokens=5, char_start=0, char_end=len(text), session=session, title=f"doc {doc}")


def test_blocks_are_twenty_chunks_of_prose_or_one_session_of_a_dialogue():
    prose = [_chunk(i) for i in range(45)]
    blocks = mem.blocks_of(list(reversed(prose)))
    assert [len(b.chunks) for b in blocks] == [20, 20, 5]
    assert [b.label for b in blocks] == ["chunks 1-20", "chunks 21-40", "chunks 41-45"]
    assert all(b.kind == "block" for b in blocks)
    dialogue = [_chunk(i, doc=2, session=f"session_{1 + i // 3}") for i in range(7)]
    sessions = mem.blocks_of(dialogue)
    assert [(b.kind, b.label, len(b.chunks)) for b in sessions] == [
        ("session", "session_1", 3), ("session", "session_2", 3), ("session", "session_3", 1)]
    # the key follows the content and the writer, not the chunk ids
    moved = [ChunkRecord(**{**c.__dict__, "id": c.id + 7}) for c in prose[:20]]
    config = mem.SummaryConfig()
    assert mem.Block(1, "block", "x", moved).key("m", config) == blocks[0].key("m", config)
    assert blocks[0].key("other model", config) != blocks[0].key("m", config)
    assert blocks[0].key("m", config) != blocks[1].key("m", config)


def test_summaries_are_cut_to_a_hundred_words_at_a_sentence_end():
    short = "Ann meets Bob at the mill. They talk about the flood."
    assert mem.clean_summary("Summary: " + short) == short
    long = " ".join(f"Sentence {i} has five words." for i in range(40))
    cut = mem.clean_summary(long)
    assert len(cut.split()) <= mem.MAX_WORDS and cut.endswith(".")


def test_the_memory_prefers_blocks_holding_more_candidates_and_keeps_its_budget():
    blocks = mem.blocks_of([_chunk(i) for i in range(60)])  # three blocks
    keys = [f"k{i}" for i in range(3)]
    summaries = {"k0": "first block " * 10, "k1": "second block " * 10, "k2": "third block " * 10}
    candidates = [c for b in (blocks[2], blocks[2], blocks[0]) for c in b.chunks[:2]]
    words = lambda text: len(text.split())  # noqa: E731
    items = mem.memory_for(candidates, blocks, summaries, keys, words, budget=1000)
    assert [i["label"] for i in items] == ["chunks 1-20", "chunks 41-60"]  # shown in document order
    # a budget for one summary keeps the block with more candidates (the third)
    one = words(mem.memory_text(items[1:]))
    assert [i["label"] for i in mem.memory_for(candidates, blocks, summaries, keys, words, budget=one)] == \
        ["chunks 41-60"]
    assert mem.memory_text(items).startswith("- doc 1, chunks 1-20: first block")


def test_summaries_are_cached_and_deleted_with_the_last_chunk_holding_them(tmp_path):
    store = Store(_db(tmp_path / "evsel.db"))
    store.put_summary("key-a", "model", "block", "hash-1", "a summary", 1.5)
    store.put_summary("key-a", "model", "block", "hash-1", "ignored: already there", 1.0)
    assert store.get_summaries(["key-a", "key-b"]) == {"key-a": "a summary"}
    assert store.count_summaries() == 1
    store._drop_orphan_states(["hash-1"])  # no chunk holds hash-1: its summary goes too
    assert store.get_summaries(["key-a"]) == {}


def _db(path):
    import sqlite_utils

    from evsel.store.store import migrate

    db = sqlite_utils.Database(path)
    migrate(db)
    return db


def test_block_memory_equals_masked_full_attention_and_keeps_the_candidates_cached(tiny_backbone):
    scorer = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="block", batch_tokens=24))
    memory = "- doc 1, chunks 1-20: who killed the keeper"
    plain = scorer.scores(QUESTION, TEXTS)
    misses = scorer.kv_cache.misses
    got = scorer.scores(QUESTION, TEXTS, memory)
    assert scorer.kv_cache.misses == misses + 1  # only the memory block was encoded
    assert not np.allclose(got, plain)

    ref = _eager(tiny_backbone)
    ids, positions, mask, spans, ctx_len, s0, _ = _block_reference(scorer, TEXTS, QUESTION, memory, labels="same")
    real, _ = _reference_attention(ref, ids, range(ctx_len + s0, len(ids)), mask, positions)
    null_ids, null_pos, null_mask, _, _, n0, _ = _block_reference(scorer, TEXTS, "N/A", memory, labels="same")
    null, _ = _reference_attention(ref, null_ids, range(ctx_len + n0, len(null_ids)), null_mask, null_pos)
    assert np.allclose(got, _reference_scores(real, null, spans, HEADS), atol=1e-5, rtol=1e-4)


def test_causal_memory_goes_into_the_prefix(tiny_backbone):
    scorer = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="causal"))
    (_, context), = scorer.contexts(TEXTS, "who killed the keeper")
    (_, without), = scorer.contexts(TEXTS)
    extra = len(scorer.prompt.prefix("who killed the keeper")) - len(scorer.prompt.prefix())
    assert extra > 0 and context.length == without.length + extra


def test_the_selector_writes_each_summary_once_and_reads_them(gqa_model_dir, tmp_path):
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.selectors import SelectorContext, get_selector
    from evsel.models.shared.statecache import StateCache
    from evsel.settings import Settings

    backbone = Backbone(str(gqa_model_dir), "cpu")
    store = Store(_db(tmp_path / "eval.db"))
    events = []
    context = SelectorContext(load_backbone=lambda: backbone, states=StateCache(store), on_event=events.append,
                              settings=Settings(qrranker_heads="0-4,1-0,1-5,2-2"))
    scope = [_chunk(i, text=TEXTS[i % len(TEXTS)] + f" {i}") for i in range(25)]  # two blocks
    selector = get_selector("qrranker:memory", context)
    assert selector.name == "qrranker:memory" and selector.use_memory
    selector.prepare(scope)
    ranked = selector.rank(QUESTION, scope[18:23])  # candidates in both blocks
    assert len(ranked) == 5
    assert [m["label"] for m in selector.memory_used] == ["chunks 1-20", "chunks 21-25"]
    assert store.count_summaries() == 2
    assert any(e.get("task") == "summaries" for e in events)
    before = store.count_summaries()
    found = selector.ranking(QUESTION, scope[:3])
    assert store.count_summaries() == before  # cached: nothing written again
    assert [m["label"] for m in found.extras["memory"]] == ["chunks 1-20"]  # what ask reports


def test_memory_needs_the_qrranker_reranker():
    from evsel.models.selectors import MethodSpec, methods_with_memory

    spec = MethodSpec.of("bm25", "qrranker:untrained").with_memory()
    assert spec.rerank.text == "qrranker:untrained+memory" and spec.memory and spec.name == "bm25>qrranker:untrained+memory"
    assert spec.rerank.variants == ["untrained", "memory"] and spec.first.text == "bm25"
    assert MethodSpec.of("bm25", "qrranker:memory,untrained").with_memory().rerank.text == "qrranker:memory+untrained"
    methods = [MethodSpec.parse(m) for m in ("bm25", "bm25>qrranker", "bm25 >qrranker:causal")]
    assert [m.name for m in methods_with_memory(methods)] == ["bm25", "bm25>qrranker:memory",
                                                              "bm25 >qrranker:causal+memory"]
    with pytest.raises(EvselError, match="--memory applies to the qrranker reranker") as raised:
        MethodSpec.of("bm25", "unreal").with_memory()
    assert raised.value.hint == "add --rerank qrranker (or drop --memory)"
    with pytest.raises(EvselError, match="--memory applies to the qrranker reranker") as raised:
        methods_with_memory([MethodSpec.parse("bm25"), MethodSpec.parse("dense")])
    assert raised.value.hint == "add a method like bm25>qrranker"
    with pytest.raises(EvselError, match="unknown qrranker variant 'big'"):
        MethodSpec.of("bm25", "qrranker:untrained+big").with_memory()
    from evsel.models.selectors.qrranker import parse_variants

    with pytest.raises(EvselError, match="unknown qrranker variant"):
        parse_variants("untrained+big")


# the real model


def _summary_rows(home) -> list[tuple]:
    conn = sqlite3.connect(home / "evsel.db")
    try:
        return conn.execute("select kind, text from summaries").fetchall()
    finally:
        conn.close()


@pytest.mark.model
def test_ingest_summaries_then_ask_with_memory(capsys, evsel_home):
    from evsel.cli import main
    from evsel.paths import sample_story_path

    assert main(["--no-daemon", "ingest", "--no-encode", "--summaries", "--json", str(sample_story_path())]) == 0
    capsys.readouterr()
    rows = _summary_rows(evsel_home)
    assert len(rows) >= 2 and all(kind == "block" for kind, _ in rows)
    assert all(10 <= len(text.split()) <= mem.MAX_WORDS + 1 for _, text in rows), rows
    assert main(["--no-daemon", "ask", "--rerank", "qrranker", "--memory", "--evidence-only", "--json",
                 "Who killed Ambrose Tenterden?"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["method"]["rerank"] == "qrranker:memory"
    assert result["memory"] and all(m["kind"] == "block" and m["text"] for m in result["memory"])
    assert len(_summary_rows(evsel_home)) == len(rows)  # nothing written at ask: ingest wrote them all
    top3 = [e for e in result["evidence"] if e["rank"] <= 3]
    assert any("Roland Pryce killed Ambrose Tenterden" in e["text"] for e in top3), \
        [(e["rank"], e["text"][:80]) for e in result["evidence"]]


@pytest.mark.model
def test_the_daemon_writes_summaries_in_the_background(daemon_home, tmp_path):  # noqa: F811
    talk = tmp_path / "talk.json"
    talk.write_text(json.dumps([{"sample_id": "talk", "conversation": {"speaker_a": "Ann", "speaker_b": "Bob",
                                "session_1_date_time": "1:00 pm on 8 May, 2023",
                                "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a cat named Pixel."},
                                              {"speaker": "Bob", "dia_id": "D1:2", "text": "Lovely! I bought a kayak."}],
                                "session_2_date_time": "2:00 pm on 9 June, 2023",
                                "session_2": [{"speaker": "Bob", "dia_id": "D2:1", "text": "The kayak sank in the lake."},
                                              {"speaker": "Ann", "dia_id": "D2:2", "text": "Pixel hid under the bed."}]}}]))
    ingested = evsel_json("ingest", "--no-encode", "--summaries", str(talk))
    assert ingested["failed"] == 0, ingested
    assert ingested["files"][0]["summaries"] == "background" and "states" not in ingested["files"][0]
    wait_for(lambda: len(_summary_rows(daemon_home)) == 2 and not status(daemon_home)["queue"]["background"],
             timeout=600, what="the background summaries")
    assert sorted(kind for kind, _ in _summary_rows(daemon_home)) == ["session", "session"]
    # BM25 first: the default's fusion for chats would encode the chunks' UNREAL states (--no-encode above)
    result = evsel_json("ask", "--select", "bm25", "--rerank", "qrranker", "--memory", "--evidence-only",
                        "What did Ann adopt?")
    assert [m["kind"] for m in result["memory"]] == ["session", "session"]
    assert result["evidence"][0]["text"]

    # a summaries job a crash left in pending_encodes (summaries, no states) is resumed as that
    evsel("daemon", "stop")
    conn = sqlite3.connect(daemon_home / "evsel.db")
    try:
        settings = json.dumps(__import__("evsel.settings", fromlist=["Settings"]).Settings.resolve().to_dict())
        conn.execute("delete from summaries")
        conn.execute("insert into pending_encodes (doc_ids, settings, created_at, states, summaries) "
                     "values (?, ?, 0, 0, 1)",
                     [json.dumps([result["evidence"][0]["doc_id"]]), settings])
        conn.commit()
    finally:
        conn.close()
    evsel("daemon", "start")
    assert any(r.startswith("summaries of documents") for r in status(daemon_home)["resumed"]), \
        status(daemon_home)["resumed"]
    wait_for(lambda: len(_summary_rows(daemon_home)) == 2 and not status(daemon_home)["queue"]["background"],
             timeout=600, what="the resumed summaries")
    conn = sqlite3.connect(daemon_home / "evsel.db")
    try:
        assert conn.execute("select count(*) from pending_encodes").fetchone()[0] == 0
        assert conn.execute("select count(*) from chunk_states").fetchone()[0] == 0  # states = 0
    finally:
        conn.close()
