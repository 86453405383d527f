"""The daemon's life: start, status, stop, auto-start, stale files, versions, idle exit, permissions,
kill -9 in the middle of an ingest, Ctrl-C in a client. Real daemons, real sockets, real SQLite.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys

import pytest

from helpers import shared_data
from daemon_helpers import (  # noqa: F401  (daemon_home is a fixture)
    alive, daemon_home, daemon_in_process, evsel, evsel_json, kill_process, pid_of, status, wait_for,
)


def test_protocol_lines_round_trip():
    from evsel.daemon.protocol import LineReader, ProtocolError, encode

    a, b = socket.socketpair()
    try:
        message = {"v": 1, "id": "x", "params": {"path": "caf\u00e9 \u2014 \u201cq\u201d", "n": [1, 2]}}
        a.sendall(encode(message) + encode({"v": 1, "type": "cancel"}) + b"[1, 2]\n")
        reader = LineReader(b)
        assert reader.read() == message
        assert reader.read()["type"] == "cancel"
        with pytest.raises(ProtocolError):
            reader.read()  # a JSON value that is not an object
        a.close()
        assert reader.read() is None
    finally:
        a.close()
        b.close()


def test_lifecycle_start_status_stop(daemon_home):
    started = evsel("daemon", "start", "--no-preload")
    assert "started the evsel daemon" in started.stdout
    info = evsel_json("daemon", "status")
    assert info["running"] and info["pid"] == pid_of(daemon_home)
    assert info["home"] == str(daemon_home) and info["documents"] == 0
    assert info["queue"] == {"running": None, "waiting": [], "background": []}
    assert "already running" in evsel("daemon", "start", "--no-preload").stdout
    assert evsel_json("daemon", "status")["pid"] == info["pid"]  # not restarted

    sock = daemon_home / "daemon.sock"
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE((daemon_home / "daemon.log").stat().st_mode) == 0o600
    human = evsel("daemon", "status").stdout
    assert f"running (pid {info['pid']}" in human and "documents: 0" in human

    assert f"stopped the evsel daemon (pid {info['pid']})" in evsel("daemon", "stop").stdout
    assert not alive(daemon_home)
    assert not sock.exists() and not (daemon_home / "daemon.pid").exists()
    stopped = evsel("daemon", "status", check=False)
    assert stopped.returncode == 3 and "not running" in stopped.stderr
    assert json.loads(evsel("daemon", "status", "--json", check=False).stdout) == {"running": False}
    assert "not running" in evsel("daemon", "stop").stderr
    log = (daemon_home / "daemon.log").read_text()
    assert "daemon started" in log and "stopped" in log


def test_refuses_a_home_other_users_can_write(daemon_home):
    daemon_home.mkdir(parents=True, exist_ok=True)
    os.chmod(daemon_home, 0o777)
    try:
        for args in (("daemon", "start"), ("docs", "list")):  # explicit start and auto-start
            result = evsel(*args, check=False)
            assert result.returncode == 1
            assert result.stderr.startswith("evsel: error: EVSEL_HOME")
            assert "writable by other users" in result.stderr and "chmod 700" in result.stderr
            assert len(result.stderr.strip().splitlines()) == 1
        assert not (daemon_home / "daemon.sock").exists() and not alive(daemon_home)
        run = evsel("daemon", "run", check=False)
        assert run.returncode == 1 and "writable by other users" in run.stderr
        # and in-process too: others could have planted the store there (tests/test_security.py)
        in_process = evsel("--no-daemon", "docs", "list", check=False)
        assert in_process.returncode == 1 and "writable by other users" in in_process.stderr
    finally:
        os.chmod(daemon_home, 0o755)


def test_auto_start_cleans_a_stale_socket_and_pid_file(daemon_home):
    daemon_home.mkdir(parents=True, exist_ok=True)
    # what kill -9 leaves: a socket file nobody listens on, a pid file naming a dead process
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(daemon_home / "daemon.sock"))
    stale.close()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (daemon_home / "daemon.pid").write_text(json.dumps({"pid": dead.pid}))

    listing = evsel("docs", "list")  # any engine command starts the daemon
    assert listing.returncode == 0 and "no documents yet" in listing.stderr
    assert alive(daemon_home)
    pid = pid_of(daemon_home)
    assert pid not in (None, dead.pid)
    assert evsel_json("daemon", "status")["pid"] == pid
    # the next command reuses it
    evsel("docs", "list")
    assert pid_of(daemon_home) == pid


def test_a_daemon_of_another_version_is_restarted(daemon_home, monkeypatch):
    monkeypatch.setenv("EVSEL_DAEMON_BUILD", "old-release")
    evsel("daemon", "start", "--no-preload")
    old = evsel_json("daemon", "status")
    assert old["build"].endswith("+old-release")
    monkeypatch.setenv("EVSEL_DAEMON_BUILD", "new-release")
    result = evsel("docs", "list")
    assert "restarting the evsel daemon" in result.stderr
    new = evsel_json("daemon", "status")
    assert new["build"].endswith("+new-release") and new["pid"] != old["pid"]


def test_idle_daemon_exits_and_removes_its_files(daemon_home):
    evsel("daemon", "start", "--no-preload", "--idle-timeout", "1")
    assert alive(daemon_home)
    wait_for(lambda: not alive(daemon_home), 60, "the idle daemon to exit")
    assert not (daemon_home / "daemon.sock").exists() and not (daemon_home / "daemon.pid").exists()
    assert "idle for 1s: shutting down" in (daemon_home / "daemon.log").read_text()


def test_long_socket_paths_work(tmp_path):
    from evsel.daemon import runtime

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "daemon.sock"
    assert len(str(path)) > 108  # beyond what AF_UNIX can bind directly
    server = runtime.bind_unix(path)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        client = runtime.connect_unix(path, timeout=5)
        conn, _ = server.accept()
        client.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        client.close()
        conn.close()
    finally:
        server.close()


def _documents(home):
    with sqlite3.connect(home / "evsel.db") as db:
        return db.execute("select id, path, n_chunks, (select count(*) from chunks c where c.doc_id = d.id) "
                          "from documents d order by id").fetchall()


def _pending(home):
    with sqlite3.connect(home / "evsel.db") as db:
        return [row[0] for row in db.execute("select path from pending_ingests order by id")]


def _pdf_folder(tmp_path, count: int):
    names = ["BOEING_2022_10K.pdf", "3M_2018_10K.pdf", "PFIZER_2021_10K.pdf", "AMCOR_2023_10K.pdf"]
    folder = tmp_path / "pdfs"
    folder.mkdir()
    for name in names[:count]:
        shutil.copy(shared_data("financebench", "pdfs", name), folder / name)
    return folder


def test_kill_9_during_a_pdf_ingest_loses_nothing_and_resumes(daemon_home, tmp_path):
    folder = _pdf_folder(tmp_path, 3)  # ~130 pages each
    evsel("daemon", "start", "--no-preload")
    sample = evsel("sample").stdout.strip()
    evsel("ingest", sample)
    before = _documents(daemon_home)
    client = subprocess.Popen([sys.executable, "-m", "evsel", "ingest", str(folder)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        # kill it once the first PDF is stored and the next one is being read
        wait_for(lambda: len(_documents(daemon_home)) >= 2, 240, "the first PDF to be stored")
        os.kill(pid_of(daemon_home), signal.SIGKILL)
        out, err = client.communicate(timeout=60)
    finally:
        kill_process(client)
    assert client.returncode == 1
    assert "lost the connection to the evsel daemon" in err
    wait_for(lambda: not alive(daemon_home), 30, "the killed daemon to be gone")

    with sqlite3.connect(daemon_home / "evsel.db") as db:
        assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
    after = _documents(daemon_home)
    assert after[: len(before)] == before  # nothing stored before is lost
    assert all(n_chunks == rows for _, _, n_chunks, rows in after)  # no half-stored document
    stored = {path for _, path, _, _ in after}
    pending = _pending(daemon_home)
    assert pending, "the interrupted files should be recorded for the next start"
    assert not stored & set(pending)
    assert (daemon_home / "daemon.sock").exists()  # stale, as a crash leaves it

    # the next command starts a fresh daemon, which re-ingests what was interrupted
    evsel("docs", "list")
    wait_for(lambda: not _pending(daemon_home) and len(_documents(daemon_home)) == len(before) + 3, 240,
             "the interrupted PDFs to be re-ingested")
    info = evsel_json("daemon", "status")
    assert sorted(info["resumed"]) == sorted(pending)
    final = _documents(daemon_home)
    assert all(n_chunks == rows and rows > 100 for _, path, n_chunks, rows in final if path.endswith(".pdf"))
    assert {p.name for p in folder.iterdir()} == {os.path.basename(path) for _, path, _, _ in final[1:]}


def _notes_held_at_the_second_file(tmp_path, monkeypatch, names: str):
    """A folder of one note a name, and an ingest (in this process: the daemon's) that holds at its
    second file until `release` is set. Returns (folder, second_read, release)."""
    import threading

    from evsel.ingest import run as ingest_module

    folder = tmp_path / "notes"
    folder.mkdir()
    for name in names:
        (folder / f"{name}.md").write_text(f"# {name}\n\nThe keeper lit the lamp at dusk, note {name}.\n")
    second_read, release = threading.Event(), threading.Event()
    real_read = ingest_module.read_file
    reads = []

    def read_held_at_the_second_file(*args, **kwargs):
        reads.append(args[0])
        if len(reads) == 2:
            second_read.set()
            release.wait(120)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(ingest_module, "read_file", read_held_at_the_second_file)
    return folder, second_read, release


def test_ctrl_c_in_a_client_cancels_only_its_request(daemon_home, tmp_path, monkeypatch):
    """The daemon runs in this process, so the ingest is held at its second file until the
    client's Ctrl-C has cancelled it: it cannot finish first, however fast the machine."""
    folder, second_read, release = _notes_held_at_the_second_file(tmp_path, monkeypatch, "abcd")
    client = None
    with daemon_in_process(daemon_home, monkeypatch) as daemon:
        try:
            pid = pid_of(daemon_home)
            # the client gets SIGINT's default action even when the suite runs in the background (a
            # shell starts background jobs with SIGINT ignored, and Python keeps an ignored SIGINT ignored)
            client = subprocess.Popen([sys.executable, "-m", "evsel", "ingest", str(folder)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            assert second_read.wait(120), "the ingest did not reach its second file"
            client.send_signal(signal.SIGINT)
            out, err = client.communicate(timeout=60)
            assert client.returncode == 130 and err.strip().endswith("evsel: error: interrupted")
            wait_for(daemon.scheduler.running.cancelled.is_set, 60, "the daemon to see the cancel")
        finally:
            release.set()
            kill_process(client)
        wait_for(lambda: status(daemon_home)["queue"]["running"] is None, 60, "the cancelled ingest to stop")
        info = status(daemon_home)
        assert info["pid"] == pid  # the daemon carried on
        assert info["recent"][-1]["status"] == "cancelled"
        assert not _pending(daemon_home)  # a cancelled ingest is not resumed later
        assert [os.path.basename(p) for _, p, _, _ in _documents(daemon_home)] == ["a.md"]  # it stopped there
        assert all(n_chunks == rows for _, _, n_chunks, rows in _documents(daemon_home))
        # and serves the next request
        evsel("ingest", evsel("sample").stdout.strip())
        assert evsel_json("docs", "list")[-1]["title"] == "The Gull Point Light"
        assert pid_of(daemon_home) == pid


def test_a_late_ctrl_c_waits_for_the_daemon_and_says_what_was_stored(daemon_home, tmp_path, monkeypatch):
    """The cancel reaches a running ingest after its first file was stored: the client waits for
    the daemon's answer and prints which files stayed stored, with rc 130."""
    folder, second_read, release = _notes_held_at_the_second_file(tmp_path, monkeypatch, "abc")
    client = None
    with daemon_in_process(daemon_home, monkeypatch) as daemon:
        try:
            client = subprocess.Popen([sys.executable, "-m", "evsel", "ingest", str(folder)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            assert second_read.wait(120), "the ingest did not reach its second file"
            client.send_signal(signal.SIGINT)
            wait_for(daemon.scheduler.running.cancelled.is_set, 60, "the daemon to see the cancel")
            release.set()  # the job goes on to its next progress event, where it stops
            out, err = client.communicate(timeout=60)
        finally:
            release.set()
            kill_process(client)
        last = err.strip().splitlines()[-1]
        assert client.returncode == 130, err
        assert last.startswith("evsel: error: interrupted; stored before it: ") and last.endswith("a.md"), err
        assert [os.path.basename(p) for _, p, _, _ in _documents(daemon_home)] == ["a.md"]


def test_requests_carry_the_clients_settings_not_its_environment(tmp_path, monkeypatch):
    """The client resolves its settings once (absolute paths, its variables) and sends them; the
    daemon neither swaps os.environ nor changes directory per job."""
    import inspect

    from evsel.daemon import client, server
    from evsel.settings import Settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVSEL_ENCODE", "0")
    monkeypatch.setenv("EVSEL_UNREAL_ADAPTER", "runs/best")
    settings = Settings.resolve(model="my.gguf")
    assert settings.encode is False and settings.model == str(tmp_path / "my.gguf")
    assert settings.unreal_adapter == str(tmp_path / "runs" / "best")
    assert Settings.from_dict(settings.to_dict()) == settings
    params = client.resolve_paths("ingest", {"targets": ["a.txt", "/abs/b.txt"]})
    assert params["targets"] == [str(tmp_path / "a.txt"), "/abs/b.txt"]
    source = inspect.getsource(server)
    assert "os.environ.update" not in source and "chdir(path)" not in source

def test_scope_data_cache_drops_the_entries_of_changed_documents():
    from evsel.daemon.cache import ScopeDataCache

    memo = ScopeDataCache(max_entries=3)
    builds = []

    def build(value):
        return lambda: builds.append(value) or value

    assert memo.get_or_build("bm25", ("a",), lambda _v: {1, 2}, build("A")) == "A"
    assert memo.get_or_build("bm25", ("a",), lambda _v: {1, 2}, build("A2")) == "A"  # a hit
    memo.get_or_build("bm25", ("b",), lambda _v: {3}, build("B"))
    assert memo.invalidate({2}) == 1
    assert memo.get_or_build("bm25", ("a",), lambda _v: {1, 2}, build("A3")) == "A3"  # rebuilt
    assert memo.get_or_build("bm25", ("b",), lambda _v: {3}, build("B2")) == "B"  # untouched
    for key in "cde":  # the least recently used go first
        memo.get_or_build("chunks", (key,), lambda _v: set(), build(key))
    assert memo.stats()["entries"] == 3
    assert builds == ["A", "B", "A3", "c", "d", "e"]
    assert memo.stats()["bm25"] == {"hits": 2, "misses": 3, "hit_rate": 0.4}


def test_daemon_run_stays_in_the_foreground_until_sigterm(daemon_home):
    process = subprocess.Popen([sys.executable, "-m", "evsel", "daemon", "run", "--no-preload", "--idle-timeout", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (daemon_home / "daemon.sock").exists() and status(daemon_home), 60, "the daemon to listen")
        info = status(daemon_home)
        assert info["pid"] == process.pid and info["idle_timeout_s"] == 0
        second = evsel("daemon", "run", check=False)  # one daemon per home
        assert second.returncode == 1 and f"already running for {daemon_home} (pid {process.pid})" in second.stderr
        process.send_signal(signal.SIGTERM)  # what systemctl stop sends
        _, err = process.communicate(timeout=60)
    finally:
        kill_process(process)
    assert process.returncode == 0
    assert "evsel daemon: daemon started" in err and "evsel daemon: stopped" in err  # the log, on stderr too
    assert not (daemon_home / "daemon.sock").exists() and not alive(daemon_home)


def test_eval_runs_in_the_daemon_and_leaves_the_store_alone(daemon_home, tmp_path):
    """eval is a request like ask: it runs where the model is resident, with relative paths
    resolved by the client, and never writes the user's store (its states go to cache/eval.db)."""
    places = {"Lighthouse": "The lighthouse keeper lit the lamp at dusk.", "Orchard": "The gardener grafted pears.",
              "Harbour": "Boats brought mackerel and herring.", "School": "The teacher loved geography.",
              "Mill": "The mill ground barley until the river froze in January."}
    body = "\n\n".join(f"## {name}\n\n{text} " + "Nothing else happened. " * 8 for name, text in places.items())
    (tmp_path / "notes.md").write_text(f"# Notes\n\n{body}\n", encoding="utf-8")
    (tmp_path / "mine.jsonl").write_text(json.dumps({
        "question": "What did the mill do with the barley?", "answer": "ground it", "document": "notes.md",
        "evidence": ["until the river froze in January"]}) + "\n", encoding="utf-8")
    evsel("ingest", evsel("sample").stdout.strip())
    db = sqlite3.connect(daemon_home / "evsel.db")
    before = db.execute("select count(*), (select count(*) from chunk_states) from chunks").fetchone()
    result = evsel_json("eval", "mine.jsonl", "--methods", "bm25", "--k", "1", cwd=str(tmp_path))
    assert result["methods"]["bm25"]["recall@1"] == 1.0
    assert db.execute("select count(*), (select count(*) from chunk_states) from chunks").fetchone() == before
    db.close()
    recent = [r for r in status(daemon_home)["recent"] if r["method"] == "eval"]
    assert recent and recent[-1]["status"] == "ok"
