"""Hardening, round four (issue 48): the daemon's start-up clean-up of torn KV writes, thread
records, collection names, stdout faults and the counts a user compares."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_helpers import daemon_home, evsel, evsel_json, outcome, run_cli, wait_for  # noqa: F401  (a fixture)


def _private(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for level in [folder, *folder.parents]:
        if level == Path(os.environ["EVSEL_HOME"]).parent:
            break
        level.chmod(0o700)
    return folder


def test_the_daemon_removes_temp_kv_files_a_killed_writer_left(daemon_home):
    """A kill -9 during a KV write leaves its temp sibling; the next daemon removes it (one being
    written now by another process, younger than a minute, is left alone)."""
    daemon_home.mkdir(mode=0o700, exist_ok=True)
    folder = _private(daemon_home / "qrranker" / "0123456789abcdef" / "fedcba9876543210")
    keys = _private(daemon_home / "blocksearch" / "0123456789abcdef" / "00112233aabbccdd")
    torn, writing, kept = folder / ".abc123.k2j3.tmp", folder / ".def456.x9y8.tmp", folder / "abc123.npy"
    torn_keys = keys / ".aa.q1.tmp"
    for path in (torn, writing, kept, torn_keys):
        path.write_bytes(b"\x93NUMPY partial")
    an_hour_ago = time.time() - 3600
    for path in (torn, torn_keys):
        os.utime(path, (an_hour_ago, an_hour_ago))
    evsel("daemon", "start", "--no-preload")
    wait_for(lambda: not torn.exists() and not torn_keys.exists(), what="the torn temp files removed")
    assert writing.exists() and kept.exists()


BAD_NAME = "r\udcffx"  # the byte 0xff on the command line, as Python reads it (surrogateescape)


def test_a_collection_name_that_is_not_utf8_is_one_clear_line(daemon_home, tmp_path, capsys):
    """Through the daemon and in-process alike (main() here; the name reaches it as Python reads
    argv): exit 1 and one line that names the bytes."""
    story = tmp_path / "story.md"
    story.write_text("The keeper lit the lamp at dusk.\n")
    assert run_cli(capsys, "ingest", str(story))[0] == 0
    for args in (("docs", "list"), ("ingest", str(story)), ("ask", "who lit the lamp?", "--select", "bm25",
                                                             "--evidence-only")):
        through_daemon = run_cli(capsys, *args, "--collection", BAD_NAME)
        in_process = run_cli(capsys, "--no-daemon", *args, "--collection", BAD_NAME)
        if args[0] != "ingest":  # an in-process ingest names the file it was reading; the client refuses first
            assert outcome(*through_daemon) == outcome(*in_process), args
        for code, _, err in (through_daemon, in_process):
            assert code == 1, (args, err)
            [line] = err.strip().splitlines()
            assert "the collection name 'r\\xffx' is not UTF-8 text" in line and "unexpected" not in line, args
    for first in ((), ("--no-daemon",)):
        assert len(json.loads(run_cli(capsys, *first, "docs", "list", "--json")[1])) == 1  # nothing stored lost


def _run(args: list[str], stdout, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evsel", *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


@pytest.fixture
def story_in_daemon(daemon_home, tmp_path):
    story = tmp_path / "story.md"
    story.write_text("Caf\u00e9 notes. The keeper lit the lamp at dusk.\n\n" + "The sea was grey all day. " * 400)
    evsel("ingest", str(story))
    return story


ASK = ["ask", "who lit the lamp?", "--select", "bm25", "--evidence-only"]
PATHS = {"fast path": [], "Typer": ["--no-daemon"]}  # the daemon's fast path reads `ask` without Typer


def test_a_closed_pipe_is_the_same_on_both_paths(story_in_daemon):
    """`evsel ask ... | head -c 20`: exit 0, nothing on stderr, through the fast path and Typer."""
    got = {}
    runs = {**{name: [*first, *ASK] for name, first in PATHS.items()},
            "rich through Typer": ["docs", "show", "1", "--chunks"]}  # rich's own handler exited 1
    for name, args in runs.items():
        read, write = os.pipe()
        os.close(read)  # the reader is gone before evsel writes a byte
        with os.fdopen(write, "w") as pipe:
            done = _run(args, pipe)
        got[name] = (done.returncode, done.stderr)
    assert got["fast path"] == got["Typer"] == got["rich through Typer"] == (0, "")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device whose writes fail: disk full)")
def test_a_full_stdout_is_reported_as_stdout_not_the_store(story_in_daemon):
    for name, first in PATHS.items():
        for args in (["docs", "list"], [*ASK, "--json"]):
            with open("/dev/full", "w") as full:
                done = _run([*first, *args], full)
            assert done.returncode == 1, (name, args)
            [line] = done.stderr.strip().splitlines()
            assert line.startswith("evsel: error: standard output is full"), (name, args, line)
            assert "EVSEL_HOME" not in line, (name, args)


def test_json_on_an_ascii_stdout_is_written_as_escapes(story_in_daemon):
    for name, first in PATHS.items():
        for args in (["docs", "list", "--json"], [*ASK, "--json"]):
            done = _run([*first, *args], subprocess.PIPE, env={"PYTHONIOENCODING": "ascii"})
            assert done.returncode == 0 and done.stderr == "", (name, args, done.stderr)
            assert done.stdout.isascii()
            data = json.loads(done.stdout)
            text = json.dumps(data, ensure_ascii=False)
            assert "Caf\u00e9" in text or "story.md" in text, (name, args)
    evidence = json.loads(_run([*ASK, "--json"], subprocess.PIPE, env={"PYTHONIOENCODING": "ascii"}).stdout)
    assert any("Caf\u00e9" in e["text"] for e in evidence["evidence"])


def test_shell_completion_is_left_to_typer_on_the_fast_path(story_in_daemon):
    """With _EVSEL_COMPLETE set the command completes words: the fast path does not run the ask."""
    env = {"_EVSEL_COMPLETE": "complete_bash", "COMP_WORDS": "evsel ask --sel", "COMP_CWORD": "2"}
    got = {name: _run([*first, "ask", "who lit the lamp?"], subprocess.PIPE, env=env) for name, first in PATHS.items()}
    assert got["fast path"].stdout == got["Typer"].stdout and got["fast path"].stdout.split() == ["--select"]
    assert got["fast path"].returncode == got["Typer"].returncode == 0


def test_a_ctrl_c_after_the_result_was_read_gives_the_result(daemon_home, tmp_path):
    """The daemon committed the ingest and its result was read when Ctrl-C came: the result is
    returned (and printed), not a bare "interrupted" after waiting for a reply that never comes."""
    from evsel.daemon import runtime
    from evsel.daemon.client import try_connect
    from evsel.settings import Settings

    class InterruptedAfterTheResult(dict):
        def update(self, *args, **kwargs):  # the first thing done with the result's reply
            raise KeyboardInterrupt

    story = tmp_path / "story.md"
    story.write_text("The keeper lit the lamp at dusk.\n")
    evsel("daemon", "start", "--no-preload")
    connection = try_connect(runtime.DaemonFiles(daemon_home))
    try:
        result = connection.request("ingest", {"targets": [str(story)]}, settings=Settings.resolve().to_dict(),
                                    meta=InterruptedAfterTheResult())
    except KeyboardInterrupt:  # raised on, it is the bare "interrupted" (and would stop pytest)
        pytest.fail("the result already read was dropped for a bare interrupt")
    finally:
        connection.close()
    assert [f["status"] for f in result] == ["ingested"]
    assert len(evsel_json("docs", "list")) == 1


def test_daemon_status_counts_what_the_encoders_count(daemon_home, capsys):
    """Encoders count a text once, so a 10-K's 1,222 chunks were 0/1,216 in daemon status: the row
    says distinct chunk texts, not chunks."""
    from evsel.commands.daemon import _print_status
    from daemon_helpers import status

    evsel("daemon", "start", "--no-preload")
    info = status(daemon_home)
    info["queue"]["background"] = [{"method": "encode", "running": True, "progress": {"done": 0, "total": 1216}},
                                   {"method": "encode", "running": True,
                                    "progress": {"done": 5, "total": 1216, "label": "QRRanker block KV"}}]
    capsys.readouterr()
    _print_status(info)
    shown = capsys.readouterr().out
    assert "background: encode (running, 0/1216 distinct chunk texts)" in shown
    assert "QRRanker block KV 5/1216 distinct chunk texts" in shown


@pytest.mark.model
def test_ask_json_counts_the_tokens_the_answer_step_read(tmp_path, capsys):
    """The reader reads the question and passages without generating: its tokens are the usage,
    not 0 for an answer that took seconds of model time."""
    from evsel.cli import main

    story = tmp_path / "story.md"
    story.write_text("The keeper of the light was Tom Pell. He lit the lamp at dusk every night.\n")
    assert main(["--no-daemon", "ingest", "--no-encode", str(story)]) == 0
    capsys.readouterr()
    assert main(["--no-daemon", "ask", "Who was the keeper of the light?", "--select", "bm25", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["grounding"]["kind"] != "abstained" and result["usage"]["prompt_tokens"] > 10


def test_the_ingest_summary_and_daemon_start_and_stop_go_to_stdout(daemon_home, tmp_path):
    """Results go to stdout (README): a script reading stdout gets the summary."""
    story = tmp_path / "story.md"
    story.write_text("The keeper lit the lamp at dusk.\n")
    started = evsel("daemon", "start", "--no-preload")
    assert started.stdout.startswith("started the evsel daemon") and "started" not in started.stderr
    done = evsel("ingest", str(story))
    assert done.stdout.startswith(f"ingested {story}: 1 document(s), 1 chunks") and "ingested" not in done.stderr
    assert evsel("ingest", str(story)).stdout.startswith(f"unchanged {story}")
    stopped = evsel("daemon", "stop")
    assert stopped.stdout.startswith("stopped the evsel daemon") and "stopped" not in stopped.stderr


def test_a_very_long_question_is_capped_for_the_models_with_a_warning(tmp_path, capsys):
    from evsel.cli import main
    from evsel.engine import MAX_QUESTION_CHARS

    story = tmp_path / "story.md"
    story.write_text("The keeper lit the lamp at dusk.\n")
    assert main(["--no-daemon", "ingest", "--no-encode", str(story)]) == 0
    capsys.readouterr()
    question = "who lit the lamp " * 10000
    assert main(["--no-daemon", "ask", question, "--select", "bm25", "--evidence-only", "--json"]) == 0
    out, err = capsys.readouterr()
    assert f"the models read its first {MAX_QUESTION_CHARS:,}" in err
    assert json.loads(out)["evidence"][0]["text"].startswith("The keeper lit the lamp")
