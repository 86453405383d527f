"""Requests before background work: a background encode runs in short slices and yields to a
waiting request between them; the client checks a request before any daemon is involved and
reports the wall time it saw. Real daemons over a Unix socket, real SQLite (and SmolLM2 where marked)."""

from __future__ import annotations

import time

import pytest

from daemon_helpers import alive, daemon_home, daemon_in_process, evsel, evsel_json, status, wait_for  # noqa: F401
from evsel.paths import sample_story_path


def test_timed_slices_grow_to_the_budget_and_stop_between_slices():
    from evsel.models.selectors.base import timed_slices

    now = [0.0]

    def clock() -> float:
        return now[0]

    def work(part: list) -> None:
        now[0] += 0.125 * len(part)  # 1/8 s an item (exact in binary)
        done.extend(part)

    done: list = []
    seen: list[int] = []
    timed_slices(list(range(23)), work, 0.5, seen.append, most=16, clock=clock)
    assert done == list(range(23))
    assert seen == [0, 1, 3, 7, 11, 15, 19, 23]  # one item first, doubling up to what 0.5 s holds

    # the machine gets busy: one slow slice, then a quick one; the next is sized by half the slow
    # item time, not by the quick one alone (a request waits for the whole slice)
    costs = iter([0.1, 0.1, 0.4, 0.05] + [0.05] * 50)

    def uneven(part: list) -> None:
        for _ in part:
            now[0] += next(costs)

    seen.clear()
    timed_slices(list(range(30)), uneven, 0.5, seen.append, most=16, clock=clock)
    # after the slow slice (0.25 s an item) the next holds 2; once items are quick again, the
    # estimate halves slice by slice and the size doubles, never jumping to the full 10 at once
    sizes = [b - a for a, b in zip(seen, seen[1:])]
    assert sizes[:4] == [1, 2, 2, 4] and max(sizes) <= 10

    class Stop(BaseException):
        pass

    def stop_after_first(count: int) -> None:
        seen.append(count)
        if count:
            raise Stop

    done.clear()
    seen.clear()
    with pytest.raises(Stop):
        timed_slices(list(range(23)), work, 0.5, stop_after_first, clock=clock)
    assert done == [0] and seen == [0, 1]  # a caller that stops waits one slice at most

    done.clear()
    seen.clear()
    timed_slices(list(range(5)), work, 0.01, seen.append, clock=clock)
    assert seen == [0, 1, 2, 3, 4, 5]  # an item over the budget: one at a time, never none


def test_a_bad_select_fails_before_any_daemon_is_contacted(daemon_home):  # noqa: F811
    result = evsel("ask", "who?", "--select", "foo", check=False)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown selector 'foo'" in lines[0], result.stderr
    assert not (daemon_home / "daemon.sock").exists() and not (daemon_home / "daemon.pid").exists()
    assert not alive(daemon_home)
    # the same check, in the daemon, for a client that skips it
    from evsel.daemon.checks import check_params

    assert "unknown selector 'foo'" in check_params("ask", {"question": "who?", "select": "foo"})["message"]
    assert "unknown selector 'bar'" in check_params("ask", {"question": "who?", "rerank": "bar"})["message"]
    assert check_params("ask", {"question": "who?", "select": "bm25", "rerank": "qrranker"}) is None
    bad_memory = evsel("ask", "who?", "--memory", check=False)
    assert bad_memory.returncode == 1 and len(bad_memory.stderr.strip().splitlines()) == 1
    assert not alive(daemon_home)
    # eval's methods too, before any data is read or a daemon started
    bad_eval = evsel("eval", "locomo", "--methods", "bm25,bm25>nosuch", check=False)
    assert bad_eval.returncode == 1 and "unknown selector 'nosuch'" in bad_eval.stderr, bad_eval.stderr
    assert not alive(daemon_home)
    assert "unknown selector 'nosuch'" in check_params("eval", {"dataset": "locomo",
                                                                "methods": ["bm25", "nosuch"]})["message"]
    assert check_params("eval", {"dataset": "locomo", "methods": ["bm25", "oracle", "bm25>qrranker"]}) is None


def test_ask_json_reports_the_wall_time_the_client_saw(daemon_home):  # noqa: F811
    evsel("daemon", "start", "--no-preload")
    evsel_json("ingest", "--no-encode", str(sample_story_path()))
    started = time.perf_counter()
    result = evsel_json("ask", "--evidence-only", "--select", "bm25", "Who keeps the light?")
    waited = time.perf_counter() - started
    timings = result["timings"]
    assert {"queued_s", "run_s", "engine_s", "total_s", "select_s"} <= set(timings), timings
    # the whole process's time: more than the daemon's part, within what this test waited
    assert timings["queued_s"] + timings["run_s"] <= timings["total_s"] <= waited
    assert timings["engine_s"] <= timings["run_s"]


@pytest.mark.model
def test_a_bm25_ask_is_answered_while_a_background_encode_is_mid_document(daemon_home, monkeypatch,  # noqa: F811
                                                                          tmp_path):
    """The daemon runs in this process, so the encode is held after its first slice until the
    evidence-only ask is answered: it cannot finish first, however fast the machine."""
    import threading

    from evsel.daemon import scheduler as scheduler_module

    monkeypatch.setenv("EVSEL_ENCODE", "1")
    asked = threading.Event()
    real_emitter = scheduler_module.Scheduler.emitter

    def emitter_held_mid_encode(self, job):
        emit = real_emitter(self, job)

        def held(event: dict) -> None:
            if job.background and event.get("task") == "encode" and event.get("done") and not asked.is_set():
                job.last_event = event  # what status shows while it is held
                asked.wait(600)
            emit(event)

        return held

    monkeypatch.setattr(scheduler_module.Scheduler, "emitter", emitter_held_mid_encode)
    with daemon_in_process(daemon_home, monkeypatch):
        _ask_beside_a_background_encode(daemon_home, tmp_path, asked)


def _ask_beside_a_background_encode(daemon_home, tmp_path, asked):  # noqa: F811
    story = sample_story_path().read_text(encoding="utf-8")
    book = tmp_path / "book.md"  # one long document: two differently worded copies of the story
    book.write_text(story.replace(" the ", " that ") + "\n\n" + story.replace(" a ", " one "), encoding="utf-8")
    assert evsel_json("ingest", str(book))["files"][0]["states"] == "background"

    def encoding() -> dict | None:
        background = status(daemon_home)["queue"]["background"]
        progress = background[0]["progress"] if background else None
        return progress if progress and progress.get("task") == "encode" and progress["done"] > 0 else None

    before = wait_for(encoding, timeout=600, what="the background encode to store its first slice")
    # an ask that reads no model runs beside the encode: the encode neither finishes nor stops for it
    # (BM25 named: the default for books may be a fusion that reads the states being encoded)
    result = evsel_json("ask", "--evidence-only", "--select", "bm25", "Who keeps the light?")
    assert len(result["evidence"]) == 5
    after = encoding()
    asked.set()
    assert after is not None
    assert after["total"] == before["total"] and before["done"] <= after["done"] < after["total"]
    recent = status(daemon_home)["recent"]
    assert [r["status"] for r in recent if r["method"] == "ask"] == ["ok"]
    assert status(daemon_home)["requests"]["served_between_slices"] == 0

    # an ask that generates waits for the encode's current slice, and runs between it and the next
    answered = evsel_json("ask", "Who keeps the light?", "--select", "bm25", "--max-new-tokens", "8")
    assert answered["answer"] is not None or answered["grounding"]["kind"] == "abstained"
    recent = status(daemon_home)["recent"]
    assert [r["status"] for r in recent if r["method"] == "ask"] == ["ok", "ok"]
    assert status(daemon_home)["requests"]["served_between_slices"] == 1
    assert not any("encoding" in r["method"] for r in recent), recent  # the encode never stopped
    # and goes on after it, its count going on from where it was, never reset
    resumed = wait_for(lambda: (p := encoding()) and p["done"] > after["done"] and p, timeout=600,
                       what="the encode to resume")
    assert resumed["total"] == before["total"]


@pytest.mark.model
def test_removing_a_document_drops_its_background_work_at_once(daemon_home, monkeypatch, tmp_path):  # noqa: F811
    import re
    import sqlite3

    monkeypatch.setenv("EVSEL_ENCODE", "1")
    book = tmp_path / "book.md"
    book.write_text(sample_story_path().read_text(encoding="utf-8").replace(" the ", " this "), encoding="utf-8")
    ingested = evsel_json("ingest", str(book))
    doc_id = ingested["files"][0]["doc_ids"][0]
    wait_for(lambda: status(daemon_home)["queue"]["background"], timeout=60, what="the background encode")
    evsel("docs", "rm", str(doc_id))
    assert status(daemon_home)["queue"]["background"] == []  # at once, not after the running slice
    conn = sqlite3.connect(daemon_home / "evsel.db")
    try:
        assert conn.execute("select count(*) from pending_encodes").fetchone()[0] == 0
    finally:
        conn.close()

    # the backbone's load time: one measurement, in status and in the log alike
    info = wait_for(lambda: (s := status(daemon_home)) and s["preload"] == "done" and s, timeout=600,
                    what="the preload")
    logged = re.search(r"backbone loaded: .* in ([0-9.]+)s", (daemon_home / "daemon.log").read_text())
    assert logged and abs(info["backbones"][0]["load_s"] - float(logged.group(1))) <= 0.06  # the log's rounding
