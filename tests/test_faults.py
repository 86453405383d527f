"""Faults and hostile input: a crash keeps an ingest's
options, removing a watch cancels its syncs, the protocol refuses params of the wrong type or
relative paths, watched symlinks are tracked by their own path, document ids are never reused,
a BM25 ask that matches nothing says so, parse errors read well."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from daemon_helpers import (  # noqa: F401  (daemon_home is a fixture)
    alive, daemon_home, docs_by_name, evsel, evsel_json, kill_process, pid_of, run_cli, status, wait_for,
)


def _db(home):
    return sqlite3.connect(home / "evsel.db")


def _big_text(path, copies: int = 40):
    from evsel.paths import sample_story_path

    story = sample_story_path().read_text(encoding="utf-8")
    path.write_text("\n\n".join(story.replace("Tenterden", f"Tenterden{i}") for i in range(copies)),
                    encoding="utf-8")
    return path


# 5. a resumed ingest keeps its options
def test_kill_9_during_a_no_encode_ingest_resumes_without_encoding(daemon_home, tmp_path, monkeypatch):
    monkeypatch.setenv("EVSEL_ENCODE", "1")  # the daemon's own settings would encode: the request's must win
    folder = tmp_path / "books"
    folder.mkdir()
    _big_text(folder / "big.md")
    evsel("daemon", "start", "--no-preload")
    client = subprocess.Popen([sys.executable, "-m", "evsel", "ingest", str(folder), "--no-encode",
                               "--collection", "books", "--chunk-tokens", "100"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def pending():
            with _db(daemon_home) as db:
                return db.execute("select path, collection, chunk_tokens, options, settings "
                                  "from pending_ingests").fetchall()

        rows = wait_for(pending, 120, "the ingest to be recorded", interval=0.01)
        os.kill(pid_of(daemon_home), signal.SIGKILL)
        client.communicate(timeout=60)
    finally:
        kill_process(client)
    wait_for(lambda: not alive(daemon_home), 30, "the killed daemon to be gone")
    path, collection, chunk_tokens, options, settings = rows[0]
    assert path == str(folder / "big.md") and collection == "books" and chunk_tokens == 100
    options = json.loads(options)
    assert options["encode"] is False and options["kind"] == "auto" and options["collection"] == "books"
    assert json.loads(settings)["encode"] is True  # the client's settings (EVSEL_ENCODE=1), kept as sent
    with _db(daemon_home) as db:
        assert db.execute("select count(*) from documents").fetchone()[0] == 0  # killed mid-file

    evsel("docs", "list")  # a fresh daemon (EVSEL_ENCODE=1 in its environment) resumes the file
    wait_for(lambda: not pending() and docs_by_name("books"), 240, "the interrupted ingest to be resumed")
    wait_for(lambda: status(daemon_home)["queue"] == {"running": None, "waiting": [], "background": []}, 60,
             "the queue to be idle")
    info = status(daemon_home)
    assert info["resumed"] == [str(folder / "big.md")]
    with _db(daemon_home) as db:
        assert db.execute("select count(*) from pending_encodes").fetchone()[0] == 0
        assert db.execute("select count(*) from chunk_states").fetchone()[0] == 0
        (meta,) = db.execute("select metadata from documents").fetchone()
    assert json.loads(meta)["chunker"]["tokens"] == 100


# 6. removing a watch cancels its queued and running syncs
def test_removing_a_watch_cancels_its_queued_and_running_jobs(tmp_path):
    from evsel.daemon.scheduler import Job, RequestCancelled
    from evsel.daemon.server import Daemon
    from evsel.daemon.watcher import Watcher
    from evsel.engine import Engine
    from evsel.store.store import Store

    folder, other = tmp_path / "a", tmp_path / "b"
    folder.mkdir()
    other.mkdir()
    daemon = Daemon(preload=False)
    daemon.fast_store = Store()
    daemon.fast_engine = Engine(daemon.settings, store=daemon.fast_store)
    daemon.watcher = daemon.scheduler.watcher = Watcher(lambda *args: None)
    daemon.watcher.roots[str(folder)] = {"collection": "default", "watch": None, "error": None}
    daemon.fast_engine.journal.add_watch(str(folder), "default")
    submitted = []
    scheduler = daemon.scheduler
    scheduler.enqueue = lambda job: submitted.append(job) or scheduler.waiting.append(job)
    scheduler.submit_watch(str(folder), "default", None)
    scheduler.submit_watch(str(other), "default", None)  # another folder's sync is left alone
    running = Job("watch", {}, daemon.settings, label="watch sync")
    running.watch_root = str(folder)
    scheduler.running = running
    emit = scheduler.emitter(running)
    emit({"type": "progress"})  # runs on until the watch is removed

    assert daemon._watch_remove(str(folder)) == {"path": str(folder), "removed": True}
    assert submitted[0].cancelled.is_set() and submitted[0] not in scheduler.waiting
    assert not submitted[1].cancelled.is_set() and submitted[1] in scheduler.waiting
    with pytest.raises(RequestCancelled):
        emit({"type": "progress"})  # the running sync stops at its next progress event
    # a sync already on its way to the queue when the watch went does nothing
    with pytest.raises(RequestCancelled):
        submitted[0].task(None, lambda event: None)


def _settled_syncs(home):
    """The finished syncs once nothing runs or waits (then nothing can ingest any more), else None."""
    info = status(home)
    if info["queue"]["running"] is not None or info["queue"]["waiting"]:
        return None
    return [r for r in info["recent"] if r["method"].startswith("watch sync")]


def test_watch_remove_stops_a_sync_in_progress(daemon_home, tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    # enough files that the sync still runs when the remove arrives (an ingest needs no transformers
    # import any more, so 40 went by before it)
    for i in range(400):
        (folder / f"n{i:03}.txt").write_text(f"Note {i}. The keeper lit the lamp at dusk.\n" * 200)
    evsel("daemon", "start", "--no-preload")
    evsel("watch", str(folder))
    evsel("watch", "--remove", str(folder))
    syncs = wait_for(lambda: _settled_syncs(daemon_home), 120, "the cancelled sync to stop")
    assert syncs[-1]["status"] == "cancelled"
    assert len(docs_by_name()) < 400


def test_watch_remove_without_the_daemon_stops_the_daemons_sync(daemon_home, tmp_path):
    """`evsel --no-daemon watch --remove` changes only the store: the daemon sees the watch gone
    and stops the sync it is running."""
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(400):
        (folder / f"n{i:03}.txt").write_text(f"Note {i}. The keeper lit the lamp at dusk.\n" * 200)
    evsel("daemon", "start", "--no-preload")
    evsel("--no-daemon", "watch", str(folder))
    wait_for(lambda: (status(daemon_home)["queue"]["running"] or {}).get("method", "").startswith("watch sync"),
             120, "the sync to start")
    evsel("--no-daemon", "watch", "--remove", str(folder))
    syncs = wait_for(lambda: _settled_syncs(daemon_home), 120, "the sync to stop")
    assert syncs[-1]["status"] == "cancelled"
    assert len(docs_by_name()) < 400


# 7. params are checked against a schema before anything runs
def _raw(home, message: dict) -> list[dict]:
    """Send one request over a raw socket; the replies until its result or error."""
    from evsel.daemon.protocol import LineReader, encode

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(home / "daemon.sock"))
    try:
        sock.sendall(encode({"v": 2, "id": "t1", "type": "request", "settings": None, **message}))
        reader, replies = LineReader(sock), []
        while True:
            reply = reader.read()
            assert reply is not None, replies
            replies.append(reply)
            if reply["type"] in ("result", "error"):
                return replies
    finally:
        sock.close()


def test_params_of_the_wrong_type_or_relative_paths_get_one_clear_error(daemon_home, tmp_path):
    from evsel.settings import Settings

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("Text.\n")
    evsel("daemon", "start", "--no-preload")
    settings = Settings.resolve().to_dict()
    for method, params, message in (
        ("watch_add", {"path": "tmp"}, "bad request for watch_add: path must be an absolute path, not 'tmp'"),
        ("watch_remove", {"path": "tmp"}, "path must be an absolute path"),
        ("ingest", {"targets": "ab"}, 'bad request for ingest: targets must be a list of strings, not a string ("ab")'),
        ("ingest", {"targets": ["a"]}, "targets must hold absolute paths only, not 'a'"),
        ("ingest", {"targets": [str(tmp_path / "a")], "chunk_tokens": "100"}, "chunk_tokens must be an integer"),
        ("ask", {"question": "q", "doc_ids": [1, "2"]}, "doc_ids must be a list of integers or null"),
        ("ask", {"question": "q", "top_n": 2.5}, "top_n must be an integer"),
        ("docs_rm", {"doc_ids": 3}, "doc_ids must be a list of integers"),
        ("docs_show", {"doc_id": "1"}, "doc_id must be an integer"),
        ("eval", {"dataset": "data/q.jsonl", "methods": ["bm25"]}, "dataset must be an absolute path"),
        ("eval", {"dataset": "locomo", "methods": "bm25"}, "methods must be a list of strings"),
        ("train_unreal", {"out": "runs/x"}, "out must be an absolute path"),
    ):
        replies = _raw(daemon_home, {"method": method, "params": params, "settings": settings})
        assert [r["type"] for r in replies] == ["error"], (method, params, replies)
        assert message in replies[0]["error"]["message"], (method, params, replies)
    info = status(daemon_home)
    assert info["watches"] == [] and info["documents"] == 0 and info["recent"] == []  # nothing ran
    # a good request still works on the same daemon
    good = _raw(daemon_home, {"method": "watch_list", "params": {}})
    assert good[-1]["type"] == "result" and good[-1]["result"] == []


# 8. a symlink in a watched folder is tracked by its own path
def test_a_watched_symlink_is_stored_under_its_own_path_and_removed_with_it(daemon_home, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    target = outside / "real.txt"
    target.write_text("Mabel Frost kept the ledger of the Gull Point light.\n")
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "plain.txt").write_text("Silas Quint trimmed the wick.\n")
    (folder / "link.txt").symlink_to(target)
    evsel("daemon", "start", "--no-preload")
    evsel("watch", str(folder))
    docs = wait_for(lambda: len(docs_by_name()) == 2 and docs_by_name(), 120, "the first sync")
    assert docs["link.txt"]["path"] == str(folder / "link.txt")  # not elsewhere/real.txt
    assert "real.txt" not in docs

    (folder / "link.txt").unlink()  # an event for the link: its document goes
    wait_for(lambda: set(docs_by_name()) == {"plain.txt"}, 60, "the link's document to be removed")
    assert target.exists()

    # and a link deleted while the daemon was down goes at the next start's full sync
    (folder / "link2.txt").symlink_to(target)
    wait_for(lambda: "link2.txt" in docs_by_name(), 60, "the second link to be ingested")
    evsel("daemon", "stop")
    (folder / "link2.txt").unlink()
    evsel("daemon", "start", "--no-preload")
    wait_for(lambda: set(docs_by_name()) == {"plain.txt"}, 120, "the full sync to remove the link's document")


def test_ingest_resolves_links_unless_told_not_to(tmp_path, backbone_tokenizer):
    from evsel.engine import Engine

    target = tmp_path / "real.txt"
    target.write_text("Agnes Moor lit the lamp.\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    engine = Engine()
    engine._backbone = backbone_tokenizer
    assert engine.ingest([str(link)])[0]["path"] == str(target)
    kept = engine.ingest([str(link)], collection="links", resolve_links=False)
    assert kept[0]["path"] == str(link) and kept[0]["status"] == "ingested"


# 9. document ids are never reused
def test_document_ids_are_never_reused(tmp_path, capsys):
    for name in "abc":
        (tmp_path / f"{name}.txt").write_text(f"Document {name}. The lamp was lit.\n")
    assert run_cli(capsys, "ingest", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"))[0] == 0
    assert run_cli(capsys, "docs", "rm", "2")[0] == 0
    assert run_cli(capsys, "ingest", str(tmp_path / "c.txt"))[0] == 0
    code, out, _ = run_cli(capsys, "docs", "list", "--json")
    assert {d["path"].rsplit("/", 1)[-1]: d["id"] for d in json.loads(out)} == {"a.txt": 1, "c.txt": 3}


def test_the_migration_keeps_documents_chunks_and_the_bm25_index(monkeypatch):
    from evsel.store import store as store_module

    from evsel.store import migrations

    old = [m for m in migrations.MIGRATIONS if m[0] < "m006"]
    monkeypatch.setattr(migrations, "MIGRATIONS", old)
    db = store_module.connect()
    store = store_module.Store(db)
    cid = store.collection_id("default", create=True)

    def put(name):
        chunk = {"seq": 0, "text": f"the {name} lamp", "content_hash": name, "n_tokens": 3, "char_start": 0,
                 "char_end": 9}
        return store.replace_file(cid, f"/x/{name}", "sha", [{"part": "", "kind": "book", "title": name,
                                                              "n_chars": 9, "chunks": [chunk]}])

    put("a"), put("b"), put("c")
    store.remove_documents([2])
    monkeypatch.undo()  # every migration again
    assert "m007_document_ids_never_reused" in migrations.migrate(db)
    assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
    assert db.execute("pragma foreign_key_check").fetchall() == []
    assert db.execute("pragma foreign_keys").fetchone()[0] == 1
    assert [d["id"] for d in store.documents()] == [1, 3]
    assert [c.doc_id for c in store.chunks()] == [1, 3]
    assert db.execute("select count(*) from bm25_docs").fetchone()[0] == 2
    assert put("d") == [4]
    store.remove_documents([4])
    assert put("e") == [5]
    chunks = store.chunks()
    scope = store.bm25_scope(chunks)
    assert scope is not None and list(store.bm25_scores(scope, ["lamp"], 1.5, 0.75)) != []


# weaker spots
@pytest.mark.parametrize("table", ["bm25_postings", "bm25_docs", "bm25_terms"])
def test_a_dropped_bm25_table_is_rebuilt_from_the_chunks(table, tmp_path, capsys):
    from evsel.cli import main
    from evsel.paths import sample_story_path

    assert main(["ingest", str(sample_story_path())]) == 0
    capsys.readouterr()  # the ingest's summary (stdout)
    question = ["ask", "Who killed Ambrose Tenterden?", "--evidence-only", "--json"]
    assert main(question) == 0
    before = json.loads(capsys.readouterr().out)["evidence"]
    with _db(Path(os.environ["EVSEL_HOME"])) as db:
        db.execute(f"drop table {table}")
    assert main(question) == 0
    out, err = capsys.readouterr()
    assert "unexpected" not in err
    assert [(e["doc_id"], e["seq"], e["score"]) for e in json.loads(out)["evidence"]] == \
        [(e["doc_id"], e["seq"], e["score"]) for e in before]


def test_a_bm25_ask_that_matches_nothing_says_so(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("The keeper of Gull Point was Silas Quint.\n")
    assert run_cli(capsys, "ingest", str(tmp_path / "a.txt"))[0] == 0
    code, out, err = run_cli(capsys, "ask", "zebra xylophone", "--evidence-only", "--select", "bm25")
    assert code == 0 and "no passage shares a word with the question" in err
    assert "Silas Quint" in out  # the passages are still shown
    code, out, err = run_cli(capsys, "ask", "zebra xylophone", "--evidence-only", "--select", "bm25", "--json")
    result = json.loads(out)
    assert result["method"]["no_match"] is True and result["evidence"]
    code, out, err = run_cli(capsys, "ask", "who was the keeper", "--evidence-only", "--select", "bm25", "--json")
    assert "no_match" not in json.loads(out)["method"] and "shares a word" not in err


def test_parse_errors_read_well(tmp_path, capsys):
    broken = tmp_path / "chat.json"
    broken.write_text('{"conversation": {"speaker_a": "A",\n "session_1": [{"text": "unterminated}]}}\n')
    epub = tmp_path / "book.epub"
    epub.write_bytes(b"this is not a zip file at all")
    lines = tmp_path / "chat.jsonl"
    lines.write_text('{"speaker": "A", "text": "hi"}\n{"speaker": "B", "text": "oops}\n')
    code, _, err = run_cli(capsys, "ingest", str(broken), str(epub), str(lines))
    assert code == 1
    assert "unterminated string starting at line 2 column" in err and "at at" not in err
    assert "not an EPUB file" in err and "not a EPUB" not in err
    assert "at line 2 column" in err.split("chat.jsonl")[-1]


# hardening issue, item 3: the sha256 stored is of the very bytes whose text is stored
_FLIP = """
import os, sys, time
path, staged = sys.argv[1], sys.argv[2:]
i = 0
while True:  # a new version every millisecond, each written whole (an atomic rename)
    i += 1
    copy = path + f".next{i % 2}"
    with open(staged[i % 2], "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    os.replace(copy, path)
    time.sleep(0.001)
"""


def test_a_file_rewritten_during_ingest_is_stored_with_the_hash_of_the_text_stored(tmp_path, backbone_tokenizer):
    import hashlib

    from evsel.engine import Engine
    from evsel.store.store import Store

    versions = [f"Version {name}. The keeper of Gull Point was {name}.\n".encode() * 200 for name in ("Ann", "Bo")]
    sha = {hashlib.sha256(v).hexdigest(): v.decode() for v in versions}
    staged = []
    for i, data in enumerate(versions):
        staged.append(tmp_path / f"v{i}.staged")
        staged[-1].write_bytes(data)
    path = tmp_path / "flip.txt"
    path.write_bytes(versions[0])
    flipper = subprocess.Popen([sys.executable, "-c", _FLIP, str(path), *map(str, staged)])  # no shared GIL
    engine = Engine()
    mismatched = []
    try:
        for _ in range(40):
            engine.ingest([str(path)], encode=False)
            [doc] = Store().documents()
            text = "".join(c.text for c in Store().chunks([doc["id"]]))
            if sha.get(doc["sha256"]) != text:
                mismatched.append(doc["sha256"][:8])
    finally:
        kill_process(flipper)
    assert not mismatched, f"{len(mismatched)} of 40 ingests stored one version's hash with another's text"


# a cancel during the store write rolls the file back, and says so
def _two_versions(tmp_path):
    """A file ingested in a short version, then rewritten long enough to be written in many batches."""
    path = tmp_path / "book.txt"
    path.write_text("The keeper of Gull Point was Ann.\n", encoding="utf-8")
    _big_text(tmp_path / "long.md", copies=4)
    return path, (tmp_path / "long.md").read_text(encoding="utf-8")


def _stored(home):
    with _db(home) as db:
        return [db.execute(f"select * from {table} order by 1").fetchall()
                for table in ("documents", "chunks", "bm25_docs", "pending_ingests")]


def test_a_cancel_during_the_store_write_leaves_the_old_version(evsel_home, tmp_path, monkeypatch, backbone_tokenizer):
    from evsel.store import store as store_module
    from evsel.engine import Engine, IngestOptions

    monkeypatch.setattr(store_module, "WRITE_BATCH", 20)
    path, long_text = _two_versions(tmp_path)
    engine = Engine()
    options = IngestOptions(chunk_tokens=16, encode=False)
    engine.ingest_files([str(path)], options)
    before = _stored(evsel_home)
    path.write_text(long_text, encoding="utf-8")

    class Cancelled(BaseException):
        pass

    writes = []

    def cancel_in_the_write(event):
        if event["type"] == "progress" and event["task"] == "store":
            writes.append((event["done"], event["total"]))
            if 0 < event["done"] < event["total"]:
                raise Cancelled()

    with pytest.raises(Cancelled):
        engine.ingest_files([str(path)], options, cancel_in_the_write, journal=True)
    assert writes[-1][0] == 20 and writes[-1][1] > 100  # stopped after one batch of many
    assert _stored(evsel_home) == before  # the old version, and nothing left to resume


@pytest.mark.parametrize("reason", ["cancelled", "shutdown"])
def test_the_daemon_reports_a_cancel_in_the_store_write_as_cancelled_and_stores_nothing(
        evsel_home, tmp_path, monkeypatch, backbone_tokenizer, reason, caplog):
    import logging
    import queue

    from evsel.store import store as store_module
    from evsel.daemon.scheduler import Job
    from evsel.daemon.server import Daemon
    from evsel.store.store import Store

    monkeypatch.setattr(store_module, "WRITE_BATCH", 20)
    path, long_text = _two_versions(tmp_path)
    path.write_text(long_text, encoding="utf-8")
    daemon = Daemon(preload=False)
    daemon.scheduler.worker_store = Store()
    job = Job("ingest", {"targets": [str(path)], "chunk_tokens": 16, "encode": False}, daemon.settings)

    class CancelInTheWrite(queue.Queue):
        """What the client receives; it cancels (or the daemon stops) once a batch is written."""

        def put(self, message, *args, **kwargs):
            event = message.get("event") or {}
            if event.get("task") == "store" and 0 < event["done"] < event["total"]:
                job.cancel(reason)
            super().put(message, *args, **kwargs)

    job.outbox = CancelInTheWrite()
    daemon.scheduler.queue.put(job)
    daemon.scheduler.queue.put(None)
    with caplog.at_level(logging.INFO, logger="evsel.daemon"):
        daemon.scheduler.worker()
    assert daemon.scheduler.recent[-1]["status"] == "cancelled" and daemon.counts["cancelled"] == 1
    assert "cancelled; nothing stored" in caplog.text  # the log and the store agree
    replies = [job.outbox.get_nowait() for _ in range(job.outbox.qsize())]
    assert not [r for r in replies if r["type"] == "result"]
    if reason == "shutdown":  # "run the command again" is true: nothing of the file was stored
        assert replies[-1]["type"] == "error" and "stopped" in replies[-1]["error"]["message"]
    assert _stored(evsel_home) == [[], [], [], []]


# a stopped or cancelled ingest is not resumed at the next start
def test_daemon_stop_during_an_ingest_leaves_nothing_to_resume(daemon_home, tmp_path):
    folder = tmp_path / "books"
    folder.mkdir()
    _big_text(folder / "big.md")
    evsel("daemon", "start", "--no-preload")
    client = subprocess.Popen([sys.executable, "-m", "evsel", "ingest", str(folder), "--no-encode",
                               "--chunk-tokens", "16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def pending():
            with _db(daemon_home) as db:
                return db.execute("select path from pending_ingests").fetchall()

        wait_for(pending, 120, "the ingest to be recorded", interval=0.01)
        evsel("daemon", "stop")
        _out, err = client.communicate(timeout=60)
    finally:
        kill_process(client)
    wait_for(lambda: not alive(daemon_home), 30, "the stopped daemon to be gone")
    assert client.returncode != 0 and "stopped" in err
    assert pending() == []  # the user stopped it: the next start resumes nothing
    with _db(daemon_home) as db:
        assert db.execute("select count(*) from documents").fetchone()[0] == 0


def test_a_stopping_daemon_drops_the_pending_rows_of_an_ingest_it_abandons(evsel_home, tmp_path, monkeypatch,
                                                                              backbone_tokenizer):
    import threading

    from evsel.ingest import run as ingest_module
    from evsel.daemon import scheduler
    from evsel.daemon.scheduler import Job
    from evsel.daemon.server import Daemon
    from evsel.store.journal import Journal
    from evsel.store.store import Store

    path = tmp_path / "a.md"
    path.write_text("# A\n\nThe keeper lit the lamp.\n")
    reading, release = threading.Event(), threading.Event()
    real_read = ingest_module.read_file

    def read_that_does_not_stop(*args, **kwargs):  # a phase that never looks at the cancel
        reading.set()
        release.wait(60)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(ingest_module, "read_file", read_that_does_not_stop)
    monkeypatch.setattr(scheduler, "SHUTDOWN_WAIT_S", 0.2)
    daemon = Daemon(preload=False)
    daemon.scheduler.worker_store = Store()
    daemon.sock = socket.socket(socket.AF_UNIX)
    daemon.socket_inode = None
    worker = threading.Thread(target=daemon.scheduler.worker, daemon=True)
    worker.start()
    job = Job("ingest", {"targets": [str(path)], "encode": False}, daemon.settings)
    daemon.scheduler.enqueue(job)
    try:
        assert reading.wait(60)
        assert [p.path for p in Journal(Store()).pending_ingests()] == [str(path)]
        daemon._shutdown()
        assert daemon.scheduler.running is job  # abandoned, still inside the read
        assert Journal(Store()).pending_ingests() == []
    finally:
        release.set()
        worker.join(60)
    assert daemon.scheduler.recent[-1]["status"] == "cancelled" and Store().documents() == []
