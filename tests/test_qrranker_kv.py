"""QRRanker's block KV files (models/qrranker/kv.py): scores read from them (8-bit K/V) stay within
a stated tolerance of scores computed fresh, with the same ranking; the files are private, keyed
so that another backbone, encoding or head set never reads them, checked by a header and digest
(a damaged one is deleted with a warning and encoded again), capped on disk, and deleted with the
last chunk holding their text (also when it goes while they are written); a full disk stops the
background work in one line. Ingest computes them (inline, and through a real daemon in the
background). A tiny random-weight Llama with SmolLM2's head grouping; the real model on the
Sherlock Holmes book: the same top 10 as fresh KV, scores within 1e-2."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from evsel.ingest.chunker import content_hash
from evsel.models.qrranker import rerank as qr
from evsel.models.qrranker import kv as qrranker_kv

from daemon_helpers import daemon_home  # noqa: F401  (a fixture)
from fixtures_tiny import WORDS

HEADS = [(0, 4), (1, 0), (1, 5), (2, 2)]
HEAD_SETTING = "0-4,1-0,1-5,2-2"
QUESTION = "who killed the keeper ?"
# scores from stored (quantized) KV: this close to the fresh ones, relative to the scores' spread, with
# every part in 8 bits (`exact_bits`: the plumbing; the random tiny model's values have no structure
# that 3 bits keep, so the shipped bits are checked by the codec's own bounds here and by the real
# model on a book)
TOLERANCE = {"float32": 2e-2, "bfloat16": 2e-2}


@pytest.fixture
def exact_bits(monkeypatch):
    monkeypatch.setattr(qrranker_kv, "BITS", (8, 8, 8))


def _text(seed: int, n: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS[:24], size=n))


TEXTS = [_text(1, 9), _text(2, 4), _text(3, 13), _text(4, 6), _text(5, 1), _text(6, 21), _text(7, 3)]


def _backbone(gqa_model_dir, dtype: str):
    from evsel.models.runtime.backbone import Backbone

    backbone = Backbone(str(gqa_model_dir), "cpu")
    backbone.model.to(getattr(torch, dtype))
    return backbone


def _adapter(backbone):
    from evsel.models.shared.lora import LoRAAdapter

    adapter = qr.new_adapter(backbone.model, HEADS, rank=4, alpha=8.0, seed=0)
    with torch.no_grad():
        for name, p in adapter.params.items():
            if name.endswith("B"):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    assert isinstance(adapter, LoRAAdapter)
    return adapter


def _scorer(backbone, store_dir=None, heads=HEADS, adapter=None, max_bytes=None, warnings=None, **config):
    scorer = qr.QRScorer(backbone, heads, qr.ScorerConfig(**config), adapter=adapter)
    scorer.use_kv_files(store_dir, max_bytes, None if warnings is None else warnings.append)
    return scorer


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("adapted", [False, True], ids=["heads", "adapter"])
def test_scores_from_files_equal_scores_computed_fresh(gqa_model_dir, tmp_path, dtype, adapted, exact_bits):
    backbone = _backbone(gqa_model_dir, dtype)
    adapter = _adapter(backbone) if adapted else None
    fresh = _scorer(backbone, None, adapter=adapter).scores(QUESTION, TEXTS)  # memory only, as before

    writer = _scorer(backbone, tmp_path, adapter=adapter)
    assert np.array_equal(writer.scores(QUESTION, TEXTS), fresh)  # encoded now, and written
    assert writer.kv_files.writes == len(TEXTS) and writer.kv_files.reads == 0

    reader = _scorer(backbone, tmp_path, adapter=adapter)  # a new process: nothing in memory
    got = reader.scores(QUESTION, TEXTS)
    assert reader.kv_files.reads == len(TEXTS) and reader.kv_files.writes == 0
    _assert_close(got, fresh, dtype)
    assert not np.array_equal(got, fresh)  # the stored KV is quantized: read, not recomputed
    # a candidate list mixing stored and new texts reads the one and writes the other (the stored
    # ones were encoded in another batch than a fresh encode of this list: within the tolerance)
    mixed = TEXTS[:3] + [_text(99, 7)]
    again = _scorer(backbone, tmp_path, adapter=adapter)
    _assert_close(again.scores(QUESTION, mixed), _scorer(backbone, None, adapter=adapter).scores(QUESTION, mixed),
                  dtype)
    assert (again.kv_files.reads, again.kv_files.writes) == (3, 1)


def _assert_close(got, fresh, dtype: str) -> None:
    assert np.abs(got - fresh).max() <= TOLERANCE[dtype] * (fresh.max() - fresh.min()), (got, fresh)
    assert list(np.argsort(-got, kind="stable")) == list(np.argsort(-fresh, kind="stable"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_written_at_ingest_in_other_batches_scores_within_tolerance(gqa_model_dir, tmp_path, dtype, exact_bits):
    backbone = _backbone(gqa_model_dir, dtype)
    adapter = _adapter(backbone)
    background = _scorer(backbone, tmp_path, adapter=adapter)
    for part in (TEXTS[:2], TEXTS[2:3], TEXTS[3:]):  # ingest's slices
        assert background.store_kv(part) == len(part)
    assert background.store_kv(TEXTS) == 0  # nothing left to do
    assert len(background.kv_cache) == 2  # the prefix KV and its k_proj inputs alone: no block enters memory
    got = _scorer(backbone, tmp_path, adapter=adapter)
    scores = got.scores(QUESTION, TEXTS)
    assert got.kv_files.reads == len(TEXTS) and got.kv_files.writes == 0
    _assert_close(scores, _scorer(backbone, None, adapter=adapter).scores(QUESTION, TEXTS), dtype)


def test_files_are_private_atomic_and_sized_as_documented(gqa_model_dir, tmp_path):
    backbone = _backbone(gqa_model_dir, "float32")
    scorer = _scorer(backbone, tmp_path)
    scorer.scores(QUESTION, TEXTS)
    folder = scorer.kv_files.folder
    files = sorted(folder.glob("*.npy"))
    assert {f.stem for f in files} == {content_hash(t) for t in TEXTS}
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    at = folder
    while at != tmp_path:  # every folder made, 0700
        assert stat.S_IMODE(at.stat().st_mode) == 0o700, at
        at = at.parent
    assert not list(folder.glob(".*.tmp"))  # written to a temp sibling, renamed
    # the payload as documented: the keys the QR heads read (layer 0: KV head 1, layer 1: both,
    # layer 2: KV head 0; query head h reads KV head h // 3) in 6 bits, layer 0's other key in 3
    # bits, each with a float16 (min, step) per channel; V of layers 0-1 (not of layer 2, the
    # deepest: nothing above it runs) in 3 bits with a float16 max per token and layer
    files_ = scorer.kv_files
    assert files_.bits == qrranker_kv.BITS == (6, 3, 3)
    assert files_.read_keys == [(0, 1), (1, 0), (1, 1), (2, 0)] and files_.other_keys == [(0, 0)]
    assert files_.value_layers == [0, 1]
    for block in scorer.pieces(TEXTS, None)[1]:
        n = len(block)
        read, other, values = 4 * n * 8, 1 * n * 8, 2 * 2 * n * 8  # values stored, head_dim 8
        assert files_.payload_bytes(n) == (-(-read * 6 // 8) + 4 * 8 * 4 + -(-other * 3 // 8) + 1 * 8 * 4
                                           + -(-values * 3 // 8) + 2 * n * 2)
    payload = sum(files_.payload_bytes(len(b)) for b in scorer.pieces(TEXTS, None)[1])
    headers = sum(f.stat().st_size for f in files) - payload
    assert 0 < headers < len(files) * 400  # the .npy header and ours: a few hundred bytes a file


def test_codec_round_trip_is_within_half_a_step_and_keeps_the_adapter_deltas(gqa_model_dir, tmp_path):
    backbone = _backbone(gqa_model_dir, "float32")
    adapter = _adapter(backbone)
    scorer = _scorer(backbone, tmp_path, adapter=adapter)
    states, _ = scorer.block_states(TEXTS[:1])
    kv, inputs = states.blocks[0], states.block_inputs[0]
    files = scorer.kv_files
    got_kv, got_inputs = files.decode("a" * 64, files.encode("a" * 64, kv, inputs), int(kv[0][0].shape[1]))
    read_bits, key_bits, value_bits = files.bits
    for layer in range(files.depth):
        for h in range(files.kv_heads):
            want, got = kv[layer][0][h], got_kv[layer][0][h]
            bits = read_bits if (layer, h) in files.read_keys else key_bits if (layer, h) in files.other_keys else 0
            if bits:  # before RoPE, 2**bits - 1 steps between the minimum and the maximum of each channel
                want, got = files.unrope(want.float()), files.unrope(got.float())
                spread = want.amax(dim=0) - want.amin(dim=0)
                assert ((got - want).abs().amax(dim=0) <= spread / (2 ** bits - 1) / 2 + 1e-3).all(), (layer, h)
            else:  # never read: not stored
                assert not got.any()
        want, got = kv[layer][1], got_kv[layer][1]
        if layer in files.value_layers:  # turned, per token and layer: 2**bits levels over [-max, max]
            want, got = want.float() @ files.turn, got.float() @ files.turn
            top = want.abs().amax(dim=(0, 2))
            assert ((got - want).abs().amax(dim=(0, 2)) <= top / (2 ** value_bits - 1) + 1e-3).all(), layer
            assert torch.allclose(got @ files.turn.T, kv[layer][1].float(), atol=float(top.max()))  # turned back
        else:
            assert not got.any()
    with torch.no_grad():
        for layer in files.capture:  # the adapter's key deltas from the lifted inputs equal the true ones
            want = adapter.delta(layer, "k", inputs[layer])
            assert torch.allclose(adapter.delta(layer, "k", got_inputs[layer]), want, atol=1e-2 * float(want.abs().max()))


def _damage(path: Path, how: str, other: Path) -> None:
    whole = path.read_bytes()
    if how == "torn":
        path.write_bytes(whole[:-10])
    elif how == "zeroed":  # the size kept, the data after the .npy header zeroed
        path.write_bytes(whole[:128] + bytes(len(whole) - 128))
    elif how == "random":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, len(whole), dtype=np.uint8).tobytes())
    elif how == "one bit":
        flipped = bytearray(whole)
        flipped[-5] ^= 1
        path.write_bytes(bytes(flipped))
    elif how == "another chunk's":
        path.write_bytes(other.read_bytes())
    elif how == "symlink":  # to a file outside the store (another user's, say): never followed
        planted = path.parents[3] / "planted.npy"
        planted.write_bytes(whole)
        path.unlink()
        path.symlink_to(planted)
    elif how == "fifo":  # a reader that opened it would block until a writer came
        path.unlink()
        os.mkfifo(path)


@pytest.mark.parametrize("how", ["torn", "zeroed", "random", "one bit", "another chunk's", "symlink", "fifo"])
def test_a_damaged_file_is_deleted_with_a_warning_and_encoded_again(gqa_model_dir, tmp_path, how, exact_bits):
    backbone = _backbone(gqa_model_dir, "float32")
    writer = _scorer(backbone, tmp_path)
    writer.scores(QUESTION, TEXTS)
    want = _scorer(backbone, tmp_path).scores(QUESTION, TEXTS)  # every block from its intact file
    folder = writer.kv_files.folder
    damaged, other = folder / f"{content_hash(TEXTS[0])}.npy", folder / f"{content_hash(TEXTS[1])}.npy"
    size = damaged.stat().st_size
    _damage(damaged, how, other)
    warnings: list[str] = []
    reader = _scorer(backbone, tmp_path, warnings=warnings)
    done: list = []  # in a thread: a FIFO opened blocking would hang the test, not fail it
    worker = threading.Thread(target=lambda: done.append(reader.scores(QUESTION, TEXTS)), daemon=True)
    worker.start()
    worker.join(300)
    assert done, "the rerank did not return (a FIFO in the KV folder blocked it)"
    got = done[0]
    assert (reader.kv_files.reads, reader.kv_files.writes, reader.kv_files.rejected) == (len(TEXTS) - 1, 1, 1)
    assert len(warnings) == 1 and "damaged" in warnings[0] and "encoded again" in warnings[0]
    _assert_close(got, want, "float32")  # that one block fresh, the others as before
    assert damaged.stat().st_size == size and stat.S_ISREG(damaged.lstat().st_mode)  # written again, whole
    if how == "symlink":
        assert (tmp_path / "planted.npy").stat().st_size == size  # the link's target left alone
    again = _scorer(backbone, tmp_path, warnings=warnings)
    again.scores(QUESTION, TEXTS)
    assert again.kv_files.reads == len(TEXTS) and len(warnings) == 1  # and read back intact


def test_the_disk_cap_evicts_the_least_recently_read_files(gqa_model_dir, tmp_path):
    backbone = _backbone(gqa_model_dir, "float32")
    writer = _scorer(backbone, tmp_path)
    writer.store_kv(TEXTS[:4])
    folder = writer.kv_files.folder
    sizes = {p.stem: p.stat().st_size for p in folder.glob("*.npy")}
    old = os.path.getmtime(folder / f"{content_hash(TEXTS[0])}.npy") - 100
    for i, text in enumerate(TEXTS[:4]):  # read order: 1, 0, 3, 2 (oldest first)
        os.utime(folder / f"{content_hash(text)}.npy", (old + [1, 0, 3, 2][i], old + [1, 0, 3, 2][i]))
    cap = sum(sizes.values())  # room for these four and not one more
    capped = _scorer(backbone, tmp_path, max_bytes=cap)
    capped.store_kv(TEXTS[4:5])
    left = {p.stem for p in folder.glob("*.npy")}
    assert content_hash(TEXTS[4]) in left and content_hash(TEXTS[1]) not in left  # the oldest read went
    assert sum(p.stat().st_size for p in folder.glob("*.npy")) <= cap
    # a read makes a file the most recent: it outlives older ones
    capped.kv_files.load(content_hash(TEXTS[0]), len(capped.pieces(TEXTS[:1], None)[1][0]))
    capped.store_kv(TEXTS[6:7])
    left = {p.stem for p in folder.glob("*.npy")}
    assert content_hash(TEXTS[0]) in left and content_hash(TEXTS[3]) not in left


def test_another_backbone_encoding_or_head_set_never_reads_the_files(gqa_model_dir, tmp_path):
    backbone = _backbone(gqa_model_dir, "float32")
    first = _scorer(backbone, tmp_path)
    first.scores(QUESTION, TEXTS)
    folders = {first.kv_files.folder}
    for other in (_scorer(backbone, tmp_path, heads=[(0, 4), (1, 0)]),  # shallower: fewer layers run
                  _scorer(backbone, tmp_path, adapter=_adapter(backbone)),  # k_proj inputs kept too
                  _scorer(_backbone(gqa_model_dir, "bfloat16"), tmp_path)):  # another compute dtype
        other.scores(QUESTION, TEXTS)
        assert other.kv_files.reads == 0 and other.kv_files.folder not in folders
        folders.add(other.kv_files.folder)
    # untrained (no adapter) with the same heads and depth shares the trained one's KV? No: the
    # trained one also keeps inputs; the untrained reads the first folder again
    again = _scorer(backbone, tmp_path)
    again.scores(QUESTION, TEXTS)
    assert again.kv_files.reads == len(TEXTS)
    # another backbone (fingerprint): another folder
    fingerprint = backbone.fingerprint
    backbone._fingerprint = "0" * 64
    try:
        assert _scorer(backbone, tmp_path).kv_files.folder.parent.name == "0" * 64
    finally:
        backbone._fingerprint = fingerprint
    # slot labels and causal encoding keep no files (a block's KV depends on its slot there)
    assert _scorer(backbone, tmp_path, block_labels="slot").kv_files is None
    assert _scorer(backbone, tmp_path, encoding="causal").kv_files is None


def _engine(gqa_model_dir, **settings):
    from evsel.engine import Engine
    from evsel.settings import Settings

    return Engine(Settings.resolve().with_(**{"model": str(gqa_model_dir), "device": "cpu", "qrranker_heads": HEAD_SETTING,
                                              "qrranker_kv": True, "encode": True, **settings}))


def _story(folder: Path, name: str, seed: int) -> Path:
    path = folder / name
    path.write_text("\n\n".join(_text(seed + i, 40) + " ." for i in range(12)), encoding="utf-8")
    return path


def _kv_files(home: Path) -> set[str]:
    return {p.stem for p in (home / qrranker_kv.FOLDER).rglob("*.npy")} if (home / qrranker_kv.FOLDER).is_dir() else set()


def _defaults_reading_the_qr_heads(folder: Path) -> str:
    """A defaults record whose book default reads the QR heads' stored KV: an ingest encodes only
    what the kinds' defaults read, and the tiny model's default is BM25."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "defaults.json").write_text(json.dumps({"format": "evsel-defaults/1", "defaults": {
        "book": {"method": "hybrid:bm25+qr", "why": "planted: the book default reads the QR heads"}}}))
    return str(folder)


def test_ingest_writes_the_files_the_reranker_reads_and_removal_deletes_them(gqa_model_dir, tmp_path, evsel_home,
                                                                           exact_bits):
    engine = _engine(gqa_model_dir, hybrid_weights=_defaults_reading_the_qr_heads(tmp_path / "weights"))
    first, second = _story(tmp_path, "a.md", 10), _story(tmp_path, "b.md", 200)
    engine.ingest([str(first), str(second)])
    chunks = engine.store.chunks()
    assert _kv_files(evsel_home) == {c.content_hash for c in chunks}
    # an ask reranking with the reranker reads them and encodes nothing
    from evsel.models.selectors import get_selector

    selector = get_selector("qrranker", engine.selector_context())
    candidates = chunks[:6]
    scores = selector.scores(QUESTION, candidates)
    assert selector.scorer.kv_files.reads == 6 and selector.scorer.kv_files.writes == 0
    fresh = qr.QRScorer(engine.backbone, HEADS).scores(QUESTION, [c.text for c in candidates])
    assert np.abs(np.array(scores) - fresh).max() <= TOLERANCE["bfloat16"] * (fresh.max() - fresh.min())
    # the files of a removed document go with it (not those of the other)
    doc_a = next(d["id"] for d in engine.docs_list() if d["path"].endswith("a.md"))
    engine.docs_rm([doc_a])
    assert _kv_files(evsel_home) == {c.content_hash for c in engine.store.chunks()}
    assert _kv_files(evsel_home) and not any(c.doc_id == doc_a for c in engine.store.chunks())


def test_a_document_removed_while_its_kv_is_written_leaves_no_file(gqa_model_dir, tmp_path, evsel_home,
                                                                   monkeypatch):
    engine = _engine(gqa_model_dir, encode=False)
    engine.ingest([str(_story(tmp_path, "a.md", 10)), str(_story(tmp_path, "b.md", 200))])
    from evsel.models.selectors import get_selector

    doc_a = next(d["id"] for d in engine.docs_list() if d["path"].endswith("a.md"))
    chunks_a = [c for c in engine.store.chunks() if c.doc_id == doc_a]
    write = qrranker_kv.BlockKVFiles.store

    def rm_during_write(files, items):  # `docs rm` commits while this slice is being written
        engine.docs_rm([doc_a])
        write(files, items)

    monkeypatch.setattr(qrranker_kv.BlockKVFiles, "store", rm_during_write)
    selector = get_selector("qrranker", engine.selector_context())
    assert selector.encode_store_kv(chunks_a) == len({c.content_hash for c in chunks_a})
    assert not any(c.doc_id == doc_a for c in engine.store.chunks())
    assert _kv_files(evsel_home) == set()  # what the slice wrote after the removal is gone too


def test_a_full_disk_stops_the_background_work_until_space_is_freed(gqa_model_dir, tmp_path, evsel_home,
                                                                     monkeypatch):
    import errno
    import shutil
    from collections import namedtuple

    engine = _engine(gqa_model_dir, encode=False)
    engine.ingest([str(_story(tmp_path, "a.md", 10))])
    attempts = []

    def full(self, path, array):
        attempts.append(path)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(qrranker_kv.ArrayCache, "_write", full)
    usage = namedtuple("usage", "total used free")
    free = [1 << 20]
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(1 << 40, (1 << 40) - free[0], free[0]))
    outcome = engine.encode_states()  # no error: the full disk is noted
    assert outcome["qrranker_kv"] == 0 and len(attempts) == 1
    notes = qrranker_kv.disk_full_notes()
    assert len(notes) == 1 and "disk" in notes[0] and "full" in notes[0] and "unexpected" not in notes[0]
    engine.encode_states()  # nothing freed: not tried again
    assert len(attempts) == 1
    free[0] += 1 << 30  # space freed: the work goes on (and the note goes)
    monkeypatch.undo()
    assert engine.encode_states()["qrranker_kv"] == len({c.content_hash for c in engine.store.chunks()})
    assert qrranker_kv.disk_full_notes() == [] and _kv_files(evsel_home)


def test_numpys_short_write_on_a_full_disk_is_a_full_disk(gqa_model_dir, tmp_path, evsel_home, monkeypatch):
    """numpy reports a short write ("716354 requested and 413568 written") with no errno: it is
    the full disk, noted in one line (daemon status shows it), not an unexpected OSError."""
    engine = _engine(gqa_model_dir, encode=False)
    engine.ingest([str(_story(tmp_path, "a.md", 10))])

    def short(handle, array, allow_pickle=False):
        handle.write(b"\x93NUMPY")
        raise OSError(f"{array.nbytes} requested and 6 written")

    monkeypatch.setattr(np.lib.format, "write_array", short)
    said = []
    outcome = engine.encode_states(on_event=said.append)
    assert outcome["qrranker_kv"] == 0
    [warning] = [e["message"] for e in said if e.get("type") == "warning"]
    assert warning.startswith("QRRanker block KV not written: the disk of") and "is full" in warning
    [note] = qrranker_kv.disk_full_notes()
    assert "is full" in note and "unexpected" not in note
    assert _kv_files(evsel_home) == set() and not list(evsel_home.rglob("*.tmp"))  # no torn file left
    monkeypatch.undo()
    qrranker_kv._full.clear()


def test_off_keeps_no_files(gqa_model_dir, tmp_path, evsel_home):
    engine = _engine(gqa_model_dir, qrranker_kv=False)
    engine.ingest([str(_story(tmp_path, "a.md", 10))])
    from evsel.models.selectors import get_selector

    selector = get_selector("qrranker", engine.selector_context())
    selector.scores(QUESTION, engine.store.chunks()[:3])
    assert selector.scorer.kv_files is None and not (evsel_home / qrranker_kv.FOLDER).exists()


def test_settings_read_the_switch():
    from evsel.settings import Settings

    assert Settings.resolve(env={}).qrranker_kv is True  # on by default
    assert Settings.resolve(env={"EVSEL_QRRANKER_KV": "0"}).qrranker_kv is False
    assert Settings.resolve(env={}).qrranker_kv_max_mb == 4096
    assert Settings.resolve(env={"EVSEL_QRRANKER_KV_MAX_MB": "10"}).qrranker_kv_max_mb == 10


def test_background_job_through_a_real_daemon(gqa_model_dir, tmp_path, daemon_home, monkeypatch):  # noqa: F811
    """Ingest returns, the daemon computes the files in the background (yielding to requests),
    an ask reads them, and removing the document deletes them."""
    from daemon_helpers import evsel_json, status, wait_for

    monkeypatch.setenv("EVSEL_MODEL", str(gqa_model_dir))
    monkeypatch.setenv("EVSEL_DEVICE", "cpu")
    monkeypatch.setenv("EVSEL_ENCODE", "1")
    monkeypatch.setenv("EVSEL_QRRANKER_KV", "1")
    monkeypatch.setenv("EVSEL_QRRANKER_HEADS", HEAD_SETTING)
    monkeypatch.setenv("EVSEL_HYBRID_WEIGHTS", _defaults_reading_the_qr_heads(tmp_path / "weights"))
    story = _story(tmp_path, "a.md", 10)
    ingested = evsel_json("ingest", str(story))
    assert ingested["files"][0]["states"] == "background"
    doc = ingested["files"][0]["doc_ids"][0]
    import sqlite3

    def hashes() -> set[str]:
        conn = sqlite3.connect(daemon_home / "evsel.db")
        try:
            return {h for (h,) in conn.execute("select content_hash from chunks")}
        finally:
            conn.close()

    wait_for(lambda: not status(daemon_home)["queue"]["background"] and _kv_files(daemon_home) == hashes(),
             timeout=300, what="the background QRRanker KV")
    result = evsel_json("ask", "--select", "bm25", "--rerank", "qrranker", "--evidence-only", QUESTION)
    assert result["method"]["rerank"] == "qrranker" and result["evidence"]
    assert _kv_files(daemon_home) == hashes()  # the ask found them all: nothing new written
    assert status(daemon_home)["disk_full"] == []  # the line a full disk would put in `daemon status`
    for path in (daemon_home / qrranker_kv.FOLDER).rglob("*.npy"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    evsel_json("docs", "rm", str(doc))
    assert _kv_files(daemon_home) == set() and os.path.isdir(daemon_home / qrranker_kv.FOLDER)


@pytest.mark.model
def test_real_model_stored_kv_gives_the_fresh_top_10_on_a_book(tmp_path):
    """SmolLM2 with the shipped heads and trained adapter on the Sherlock Holmes book: BM25's top
    50 for a question, their KV written in ingest's slices (8-bit, as stored by default) and read
    back, give the scores of a fresh encode within 1e-2 and the same top 10, in order."""
    from evsel.engine import Engine
    from evsel.models.selectors import get_selector
    from evsel.settings import Settings
    from helpers import shared_data

    book = shared_data("nocha", "books", "the_adventures_of_sherlock_holmes_arthur_conan_doyle.txt")
    engine = Engine(Settings.resolve().with_(qrranker_kv=True, encode=False))
    engine.ingest([str(book)])
    question = "What was the speckled band?"
    chunks = [s.chunk for s in get_selector("bm25", engine.selector_context()).rank(
        question, engine.store.chunks(), 50)]
    selector = get_selector("qrranker", engine.selector_context())
    assert selector.encode_store_kv(chunks[:7]) == 7 and selector.encode_store_kv(chunks[7:]) == 43
    reader = get_selector("qrranker", engine.selector_context())  # nothing of these blocks in memory
    stored = np.array(reader.scores(question, chunks))
    assert reader.scorer.kv_files.reads == 50
    fresh = qr.QRScorer(engine.backbone, selector.heads, selector.config, adapter=selector.adapter).scores(
        question, [c.text for c in chunks])
    assert np.abs(stored - fresh).max() <= 1e-2
    assert list(np.argsort(-stored, kind="stable")[:10]) == list(np.argsort(-fresh, kind="stable")[:10])
