"""Ingest through the daemon returns once the text is stored; the chunks' UNREAL states are computed
in the background (progress in `evsel daemon status`), an ask that needs them computes only what is
missing, and a daemon killed mid-encode resumes at its next start. Real SmolLM2, shipped adapter."""

from __future__ import annotations

import json
import os
import signal
import sqlite3

import pytest

from daemon_helpers import alive, daemon_home, evsel, evsel_json, pid_of, status, wait_for  # noqa: F401
from evsel.paths import sample_story_path

pytestmark = pytest.mark.model


def _db(home):
    return sqlite3.connect(home / "evsel.db")


def _pending(home) -> int:
    conn = _db(home)
    try:
        return conn.execute("select count(*) from pending_encodes").fetchone()[0]
    finally:
        conn.close()


def _missing_states(home) -> int:
    """Distinct chunk texts without an UNREAL state."""
    conn = _db(home)
    try:
        return conn.execute(
            "select count(distinct content_hash) from chunks ch where not exists (select 1 from chunk_states s "
            "where s.content_hash = ch.content_hash and s.method = 'unreal')").fetchone()[0]
    finally:
        conn.close()


def test_ingest_returns_then_states_come_in_the_background(daemon_home, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("EVSEL_ENCODE", "1")
    ingested = evsel_json("ingest", str(sample_story_path()))
    assert ingested["failed"] == 0
    assert ingested["files"][0]["states"] == "background"
    info = status(daemon_home)
    background = info["queue"]["background"]
    assert background or _missing_states(daemon_home) == 0  # queued, running, or (fast machine) done
    assert all("encoding chunk states" in b["method"] for b in background)

    # an ask that needs the states runs now (computing whatever is still missing) and cites evidence
    result = evsel_json("ask", "--select", "unreal", "--evidence-only", "Who killed Ambrose Tenterden?")
    assert result["method"]["select"] == "unreal" and len(result["evidence"]) == 5
    wait_for(lambda: _pending(daemon_home) == 0 and _missing_states(daemon_home) == 0, timeout=900,
             what="the background encode to finish")
    assert not status(daemon_home)["queue"]["background"]

    # killed mid-encode: the next daemon resumes the documents' states
    story = tmp_path / "copy.md"
    # every chunk's text differs from the first story's, so none of its states exist yet
    story.write_text(sample_story_path().read_text(encoding="utf-8").replace(" the ", " that "), encoding="utf-8")
    assert evsel_json("ingest", str(story))["files"][0]["states"] == "background"
    wait_for(lambda: any(b["running"] for b in status(daemon_home)["queue"]["background"]), timeout=300,
             what="the background encode to start")
    os.kill(pid_of(daemon_home), signal.SIGKILL)
    wait_for(lambda: not alive(daemon_home), timeout=30, what="the daemon to die")
    assert _pending(daemon_home) == 1 and _missing_states(daemon_home) > 0
    evsel("daemon", "start")
    resumed = status(daemon_home)["resumed"]
    assert any("chunk states" in r for r in resumed), resumed
    wait_for(lambda: _pending(daemon_home) == 0 and _missing_states(daemon_home) == 0, timeout=900,
             what="the resumed encode to finish")


def test_no_encode_leaves_states_to_the_first_ask(daemon_home):  # noqa: F811
    ingested = evsel_json("ingest", "--no-encode", str(sample_story_path()))
    assert "states" not in ingested["files"][0]
    assert _pending(daemon_home) == 0
    assert json.loads(evsel("daemon", "status", "--json").stdout)["queue"]["background"] == []
