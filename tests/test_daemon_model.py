"""The daemon with the real SmolLM2 backbone: the same answers as in-process, the same errors, many
clients at once, and scope data served from memory. One daemon is shared by the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import book_default
from daemon_helpers import evsel, kill_daemon, kill_process, outcome, pid_of, run_cli, status, use_daemon, wait_for
from evsel.errors import NotFoundError

pytestmark = pytest.mark.model

QUESTION = "Who killed Ambrose Tenterden?"


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory, model_cache):
    home = tmp_path_factory.mktemp("daemon-model") / "evsel-home"
    yield home
    kill_daemon(home)


@pytest.fixture
def home(shared_home, monkeypatch):
    use_daemon(monkeypatch, shared_home)
    return shared_home


@pytest.fixture(scope="module")
def sample_ingested(shared_home, model_cache):
    """The sample story ingested through an auto-started daemon (model loaded in the background)."""
    env = dict(os.environ, EVSEL_HOME=str(shared_home), EVSEL_MODEL_CACHE=str(model_cache),
               EVSEL_DAEMON_BUILD="tests", EVSEL_ENCODE="0", OMP_NUM_THREADS="1")
    env.pop("EVSEL_NO_DAEMON", None)
    sample = evsel("sample", env=env).stdout.strip()
    result = evsel("ingest", sample, env=env)
    assert "ingested" in result.stdout
    return sample


def _without_timings(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "timings"}


def test_daemon_and_in_process_give_the_same_results(home, sample_ingested, capsys):
    """Each command through the daemon (a DaemonClient) and in-process (--no-daemon: an Engine),
    both through main() in this process: the same outcome (exit code, the JSON result without its
    timings or the text, the error and warning lines), whatever progress rows the load brings."""
    assert pid_of(home) is not None  # ingest started the daemon
    cases = [("ask", QUESTION, "--max-new-tokens", "12", "--json"),
             ("ask", QUESTION, "--evidence-only", "--top-n", "3", "--json"), ("docs", "list", "--json"),
             ("docs", "show", "1", "--chunks", "--json"), ("ask", QUESTION, "--evidence-only")]
    results = {}
    for args in cases:
        through_daemon = outcome(*run_cli(capsys, *args))
        in_process = outcome(*run_cli(capsys, "--no-daemon", *args))
        assert through_daemon == in_process, args
        code, results[args], told = through_daemon
        assert code == 0, (args, told)
    answered = results[cases[0]]
    assert answered["answer"] == "Roland Pryce"
    assert any("Pryce killed Ambrose Tenterden" in e["text"] for e in answered["evidence"])


def test_bad_requests_fail_alone_with_the_in_process_messages(home, sample_ingested, tmp_path, capsys,
                                                              monkeypatch):
    pid = pid_of(home)
    (tmp_path / "empty.txt").write_text("")
    monkeypatch.chdir(tmp_path)  # relative paths are the client's, whatever the daemon's directory
    bad = [
        ("ask", ""),
        ("ask", QUESTION, "--doc", "999"),
        ("ask", QUESTION, "--collection", "nope"),
        ("ask", QUESTION, "--select", "no-such-selector"),
        ("ask", QUESTION, "--top-n", "0"),
        ("docs", "show", "999"),
        ("docs", "rm", "1", "999"),
        ("ingest", "missing-book.txt"),  # named as typed, in both modes
        ("ingest", "empty.txt"),
        ("ingest", "--chunk-tokens", "3", "x.txt"),
        ("--model", "no-such-model.gguf", "ask", QUESTION),
    ]
    for args in bad:
        through_daemon = outcome(*run_cli(capsys, *args))
        in_process = outcome(*run_cli(capsys, "--no-daemon", *args))
        assert through_daemon == in_process, args
        code, _, told = through_daemon
        assert code == 1 and told and told[-1].startswith("evsel: error: "), (args, told)
    # one as a whole process too
    result = evsel("ask", QUESTION, "--doc", "999", check=False)
    assert result.returncode == 1 and result.stderr.startswith("evsel: error: no document with id 999")
    info = status(home)
    assert info["pid"] == pid  # still the same daemon
    assert run_cli(capsys, "docs", "show", "1")[0] == 0  # nothing was removed by the failed rm


def test_concurrent_clients_are_all_served(home, sample_ingested, tmp_path):
    story = tmp_path / "harbour.md"
    story.write_text("# The Harbour\n\nThe harbour master, Edith Crane, rang the fog bell at dawn. "
                     "Nobody else in Saltmere was allowed to touch the bell rope.\n")
    procs = []
    try:
        # a free-form answer: generation keeps the model busy (a short prose answer takes no model time)
        # (BM25's passages: the known wrong sentence below is the one written from them)
        procs.append(subprocess.Popen([sys.executable, "-m", "evsel", "ask", QUESTION, "--max-new-tokens", "12",
                                       "--style", "sentence", "--select", "bm25", "--json"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        procs.append(subprocess.Popen([sys.executable, "-m", "evsel", "ask", "Who rang the fog bell?",
                                       "--evidence-only", "--json"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        procs.append(subprocess.Popen([sys.executable, "-m", "evsel", "ingest", str(story), "--json"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        seen_busy = []

        def all_done():
            info = status(home)  # answered while model work runs: status never queues
            if info["queue"]["running"] is not None:
                seen_busy.append(info["queue"])
            return all(p.poll() is not None for p in procs)

        wait_for(all_done, 300, "the three clients")
        outputs = [p.communicate() for p in procs]
    finally:
        for p in procs:
            kill_process(p)
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
    answer, evidence, ingest = (json.loads(out) for out, _ in outputs)
    assert any("Pryce" in e["text"] for e in answer["evidence"])
    assert ingest["files"][0]["status"] == "ingested"
    assert seen_busy, "status was never asked while a model request ran"
    # the evidence-only ask ran before or after the ingest: either way its evidence is real
    assert evidence["evidence"] and evidence["method"]["select"] == book_default()
    # after the ingest the new story is found
    after = json.loads(evsel("ask", "Who rang the fog bell?", "--evidence-only", "--top-n", "1", "--json").stdout)
    assert "Edith Crane" in after["evidence"][0]["text"]
    # last, as an xfail ends the test: the generated answer
    if answer["answer"] == "Lionel Pryce killed Ambrose Tenterden":  # this wrong answer only
        pytest.xfail("known wrong: the generated sentence names Lionel Pryce; the story has only Roland Pryce")
    assert "Roland Pryce" in answer["answer"], answer["answer"]


def test_scope_data_is_served_from_memory_and_invalidated(home, sample_ingested, tmp_path):
    from evsel.daemon.client import DaemonClient

    def counts():
        cache = status(home)["cache"]
        return cache.get("bm25", {"hits": 0, "misses": 0}), cache.get("chunks", {"hits": 0, "misses": 0})

    client = DaemonClient()
    try:
        # BM25's scope data (the default for books may be a fusion that reads the model too)
        ask = dict(question="What did the keeper write in the log?", doc_ids=[1], evidence_only=True, select="bm25")
        events = []
        first = client.ask(**ask, on_event=events.append)  # progress is relayed as it happens
        assert {"type": "progress", "task": "select", "label": "selecting evidence (bm25)", "done": 0,
                "total": 1} in events
        bm25_before, chunks_before = counts()
        second = client.ask(**ask)
        bm25_after, chunks_after = counts()
        assert bm25_after["hits"] == bm25_before["hits"] + 1 and bm25_after["misses"] == bm25_before["misses"]
        assert chunks_after["hits"] == chunks_before["hits"] + 1
        assert _without_timings(first) == _without_timings(second)

        # a changed document is never answered from the old entries
        story = tmp_path / "story.md"
        story.write_text("# Notes\n\nThe lamp was lit by Agnes Moor.\n")
        doc_id = client.ingest([str(story)])[0]["doc_ids"][0]
        ask_new = dict(question="Who lit the lamp?", doc_ids=[doc_id], evidence_only=True, select="bm25")
        assert "Agnes Moor" in client.ask(**ask_new)["evidence"][0]["text"]
        story.write_text("# Notes\n\nThe lamp was lit by Wilfred Tarn.\n")
        client.ingest([str(story)])
        assert "Wilfred Tarn" in client.ask(**ask_new)["evidence"][0]["text"]
        # also when another process changed the store behind the daemon's back
        story.write_text("# Notes\n\nThe lamp was lit by Hester Vane.\n")
        evsel("--no-daemon", "ingest", str(story))
        assert "Hester Vane" in client.ask(**ask_new)["evidence"][0]["text"]
        client.docs_rm([doc_id])
        with pytest.raises(NotFoundError, match=f"no document with id {doc_id}"):
            client.ask(**ask_new)
    finally:
        client.close()
