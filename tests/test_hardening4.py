"""Hardening, round four (issue 48): the daemon's start-up clean-up of torn KV writes, thread
records, collection names, stdout faults and the counts a user compares."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from daemon_helpers import daemon_home, evsel, evsel_json, wait_for  # noqa: F401  (a fixture)


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


@pytest.mark.parametrize("daemon", [False, True], ids=["no-daemon", "daemon"])
def test_a_collection_name_that_is_not_utf8_is_one_clear_line(daemon_home, tmp_path, daemon):
    story = tmp_path / "story.md"
    story.write_text("The keeper lit the lamp at dusk.\n")
    first = () if daemon else ("--no-daemon",)
    evsel(*first, "ingest", str(story))
    for args in (("docs", "list"), ("ingest", str(story)), ("ask", "who lit the lamp?", "--select", "bm25",
                                                             "--evidence-only")):
        done = evsel(*first, *args, "--collection", BAD_NAME, check=False, env={**os.environ})
        assert done.returncode == 1, (args, done.stderr)
        [line] = done.stderr.strip().splitlines()
        assert "the collection name 'r\\xffx' is not UTF-8 text" in line and "unexpected" not in line, args
    assert len(evsel_json(*first, "docs", "list")) == 1  # nothing stored lost
