"""Everything evsel reads or writes under EVSEL_HOME and EVSEL_MODEL_CACHE is the user's own, not a
symbolic link, and not writable by others (evsel.paths.refuse_unsafe, the one check): what another
user planted there while the home was open (1777, as /tmp) is refused in one line, and nothing is
read from it or written into it. The planting is done by another user (nobody, through runuser),
so these tests need root."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers import plant_defaults

NOBODY = 65534
HEAD_SETTING = "0-4,1-0,1-5,2-2"  # heads of the tiny GQA Llama (as tests/test_qrranker_kv.py)


def _needs_root() -> None:
    if os.getuid() != 0:
        pytest.skip("needs root: another user (nobody, through runuser) plants the files")
    if shutil.which("runuser") is None:
        pytest.skip("needs runuser (util-linux) to act as another user")


def as_nobody(*command) -> None:
    subprocess.run(["runuser", "-u", "nobody", "--", *map(str, command)], check=True, capture_output=True, timeout=60)


@pytest.fixture
def open_root(monkeypatch):
    """A folder other users can reach (pytest's tmp_path is root's 0700), with EVSEL_HOME in it."""
    _needs_root()
    root = Path(tempfile.mkdtemp(prefix="evsel-trust-", dir="/tmp"))
    os.chmod(root, 0o755)
    monkeypatch.setenv("EVSEL_HOME", str(root / "home"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _one_error(capsys) -> str:
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if not line.startswith("evsel: progress:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("evsel: error: ") and "unexpected" not in lines[0], lines[0]
    return lines[0]


def _story(folder: Path) -> Path:
    from fixtures_tiny import WORDS

    path = folder / "story.md"
    path.write_text("\n\n".join(" ".join(WORDS[(i + j) % 24] for j in range(40)) + " ." for i in range(6)))
    return path


def _tiny_model_env(monkeypatch, model_dir, kv: bool) -> None:
    if kv:  # a book default that reads the QR heads' stored KV, so an ingest writes it
        monkeypatch.setenv("EVSEL_HYBRID_WEIGHTS", plant_defaults(Path(tempfile.mkdtemp()), book="hybrid:bm25+qr"))
    monkeypatch.setenv("EVSEL_MODEL", str(model_dir))
    monkeypatch.setenv("EVSEL_DEVICE", "cpu")
    monkeypatch.setenv("EVSEL_ENCODE", "1" if kv else "0")
    monkeypatch.setenv("EVSEL_QRRANKER_KV", "1" if kv else "0")
    monkeypatch.setenv("EVSEL_QRRANKER_HEADS", HEAD_SETTING)


# 1. a planted qrranker/ (a link to another user's folder) is refused, not written into
def test_a_planted_qrranker_link_is_refused_and_nothing_is_written_through_it(open_root, gqa_model_dir, monkeypatch,
                                                                              capsys):
    from evsel.cli import main

    home = open_root / "home"
    home.mkdir()
    os.chmod(home, 0o1777)
    theirs = open_root / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    as_nobody("chmod", "777", theirs)
    as_nobody("ln", "-s", theirs, home / "qrranker")  # while the home is open
    assert main(["--no-daemon", "docs", "list"]) == 1
    line = _one_error(capsys)
    fix = re.search(r"run: (chmod \S+ \S+)", line)
    assert fix, line
    subprocess.run(fix.group(1), shell=True, check=True)  # exactly what evsel says to run

    _tiny_model_env(monkeypatch, gqa_model_dir, kv=True)
    story = _story(open_root)
    link = home / "qrranker"
    for args in (["ingest", str(story)], ["ask", "--rerank", "qrranker", "--evidence-only", "who ?"],
                 ["docs", "list"]):
        assert main(["--no-daemon", *args]) == 1, args
        assert _one_error(capsys) == (f"evsel: error: {link} is a symbolic link, so evsel will not use it; "
                                      f"remove it (rm {link}), then run the command again"), args
    assert os.listdir(theirs) == []  # no block KV (no chunk hash names) in their folder
    assert os.path.islink(link)
    monkeypatch.delenv("EVSEL_NO_DAEMON")  # the client refuses before it starts a daemon there
    assert main(["docs", "list"]) == 1
    assert _one_error(capsys).startswith(f"evsel: error: {link} is a symbolic link, so evsel will not use it")
    assert os.listdir(home) == ["qrranker"]
    monkeypatch.setenv("EVSEL_NO_DAEMON", "1")

    link.unlink()  # as the line says: then it works, and the files are ours and private
    assert main(["--no-daemon", "ingest", str(story)]) == 0
    capsys.readouterr()
    assert link.is_dir() and not link.is_symlink() and stat.S_IMODE(link.stat().st_mode) == 0o700
    files = list(link.rglob("*.npy"))
    assert files and all(f.stat().st_uid == 0 and stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert os.listdir(theirs) == []


def test_a_planted_level_inside_our_qrranker_folder_is_refused(open_root, gqa_model_dir, monkeypatch, capsys):
    """Deeper than the home's own entries: the folder of the backbone's KV files, made by another user
    while the home was open, is refused by the KV files' own check (models/shared/caches.py)."""
    from evsel.cli import main
    from evsel.models.runtime.backbone import Backbone

    _tiny_model_env(monkeypatch, gqa_model_dir, kv=False)
    story = _story(open_root)
    assert main(["--no-daemon", "ingest", str(story)]) == 0
    capsys.readouterr()
    home = open_root / "home"
    ours = home / "qrranker"
    ours.mkdir(mode=0o700)
    os.chmod(home, 0o777)
    os.chmod(ours, 0o777)
    planted = ours / Backbone(str(gqa_model_dir), "cpu").fingerprint
    as_nobody("mkdir", "-m", "777", planted)
    os.chmod(home, 0o700)
    os.chmod(ours, 0o700)

    monkeypatch.setenv("EVSEL_QRRANKER_KV", "1")
    assert main(["--no-daemon", "ask", "--rerank", "qrranker", "--evidence-only", "who ?"]) == 1
    line = _one_error(capsys)
    assert line.startswith(f"evsel: error: {planted} belongs to another user (uid {NOBODY}), so evsel will not use it")
    assert f"mv {planted} {planted}.untrusted" in line
    assert os.listdir(planted) == []
    subprocess.run(["mv", planted, f"{planted}.untrusted"], check=True)  # as it says: then the KV is ours
    assert main(["--no-daemon", "ask", "--rerank", "qrranker", "--evidence-only", "who ?"]) == 0
    capsys.readouterr()
    assert planted.is_dir() and planted.stat().st_uid == 0 and list(planted.rglob("*.npy"))
    assert os.listdir(f"{planted}.untrusted") == []


# 2. a foreign models/ (fingerprints, tokenizer, the dense copy) is never trusted
def test_a_foreign_open_models_folder_is_refused(open_root, monkeypatch, capsys, tmp_path):
    from evsel.cli import main

    monkeypatch.delenv("EVSEL_MODEL_CACHE")  # the model cache in the home: EVSEL_HOME/models
    home = open_root / "home"
    home.mkdir()
    os.chmod(home, 0o1777)
    as_nobody("mkdir", "-m", "777", home / "models")
    as_nobody("sh", "-c", f"echo '{{not json' > {home / 'models' / 'fingerprints.json'}")
    os.chmod(home, 0o700)
    doc = tmp_path / "harbour.txt"
    doc.write_text("The harbour master kept a log of every ship.\n")
    models = home / "models"
    for args in (["ingest", str(doc)], ["docs", "list"]):
        assert main(["--no-daemon", *args]) == 1
        assert _one_error(capsys).startswith(
            f"evsel: error: {models} belongs to another user (uid {NOBODY}), so evsel will not use it; "
            f"move it aside (mv {models} {models}.untrusted: evsel leaves that name alone)")
    assert sorted(os.listdir(models)) == ["fingerprints.json"]  # nothing of ours written there
    subprocess.run(["mv", models, f"{models}.untrusted"], check=True)
    assert main(["--no-daemon", "docs", "list"]) == 0  # as it says: the home is usable again
    capsys.readouterr()


def test_a_model_cache_of_another_user_or_with_their_files_is_refused(open_root, monkeypatch, capsys, tmp_path):
    from evsel.cli import main

    doc = tmp_path / "harbour.txt"
    doc.write_text("The harbour master kept a log of every ship.\n")
    theirs = open_root / "their-cache"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    as_nobody("chmod", "777", theirs)
    monkeypatch.setenv("EVSEL_MODEL_CACHE", str(theirs))
    assert main(["--no-daemon", "ingest", str(doc)]) == 1
    assert _one_error(capsys) == (
        f"evsel: error: EVSEL_MODEL_CACHE {theirs} belongs to another user (uid {NOBODY}), so evsel will not keep "
        "models there; point EVSEL_MODEL_CACHE at a folder you own")
    assert os.listdir(theirs) == []

    # our own cache, opened for a while: a file another user left in it is refused, not parsed
    ours = open_root / "our-cache"
    ours.mkdir(mode=0o777)
    os.chmod(ours, 0o777)
    as_nobody("sh", "-c", f"echo '{{\"x\": 1}}' > {ours / 'fingerprints.json'}")
    os.chmod(ours, 0o700)
    monkeypatch.setenv("EVSEL_MODEL_CACHE", str(ours))
    assert main(["--no-daemon", "ingest", str(doc)]) == 1
    planted = ours / "fingerprints.json"
    assert _one_error(capsys).startswith(
        f"evsel: error: {planted} belongs to another user (uid {NOBODY}), so evsel will not load a model from it; "
        f"remove it (rm {planted})")
    assert json.loads(planted.read_text()) == {"x": 1}


def test_the_one_check_refuses_links_foreign_and_open_entries_at_every_level(tmp_path):
    """The check itself, level by level (root only for the foreign owner)."""
    from evsel import paths
    from evsel.errors import UnsafeHomeError

    base = tmp_path / "base"
    (base / "a" / "b").mkdir(parents=True)
    os.chmod(base, 0o700)
    paths.refuse_unsafe(base / "a" / "b" / "c", base)  # absent levels are fine: evsel makes them
    os.chmod(base / "a", 0o777)
    with pytest.raises(UnsafeHomeError, match=r"a is writable by other users \(0777\)"):
        paths.refuse_unsafe(base / "a" / "b", base)
    os.chmod(base / "a", 0o700)
    (base / "a" / "b" / "f").write_text("x")
    os.symlink(tmp_path, base / "a" / "b" / "link")
    paths.refuse_unsafe(base / "a" / "b" / "f", base)
    with pytest.raises(UnsafeHomeError, match="link is a symbolic link"):
        paths.refuse_unsafe(base / "a", base, tree=True)
    made = paths.private_folder(base / "a" / "new" / "deeper", base)
    assert stat.S_IMODE(made.stat().st_mode) == stat.S_IMODE(made.parent.stat().st_mode) == 0o700
    if os.getuid() == 0:
        os.chown(base / "a" / "b" / "f", NOBODY, NOBODY)
        with pytest.raises(UnsafeHomeError, match=f"f belongs to another user \\(uid {NOBODY}\\)"):
            paths.refuse_unsafe(base / "a" / "b" / "f", base)


# 12. the fix evsel suggests for an open home leaves no warning behind (go-w left 1777 at 1755)
@pytest.mark.parametrize("mode", [0o777, 0o1777])
def test_the_suggested_fix_for_an_open_home_leaves_it_private(mode, evsel_home, capsys):
    from evsel import paths
    from evsel.cli import main

    evsel_home.mkdir()
    os.chmod(evsel_home, mode)
    assert main(["--no-daemon", "docs", "list"]) == 1
    line = _one_error(capsys)
    fix = re.search(r"run: (chmod \S+ \S+)", line)
    assert fix and fix.group(1) == f"chmod 700 {evsel_home}", line
    subprocess.run(fix.group(1), shell=True, check=True)
    assert main(["--no-daemon", "docs", "list"]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in err and paths.permission_warning(evsel_home) is None  # not "EVSEL_HOME is 1755"


# 12. bidirectional controls (they reorder what the terminal shows) are shown escaped
BIDI = "\u202e\u2066\u2067\u2068\u2069\u202a\u202b\u202c\u202d\u200e\u200f\u061c"
CALM = "".join(f"On day {n} the sea was calm and the gulls sat on the rocks by the light. " for n in range(40))


def test_bidi_controls_are_shown_escaped(evsel_home, tmp_path, capsys):
    from evsel.cli import main

    doc = tmp_path / "invoice\u202etxt.exe"
    doc.write_text("# Log \u2066of\u2069 the keeper\n\nThe keeper \u202elogged\u202c the storm \u2067twice\u2069.\n\n"
                   + CALM + "\n")
    runs = {}
    for args in (["ingest", str(doc)], ["docs", "list"], ["docs", "show", "--chunks", "1"],
                 ["ask", "--evidence-only", "what did the keeper log?"], ["docs", "list", "--json"]):
        assert main(args) == 0, args
        runs[" ".join(args)] = capsys.readouterr()
    for name, (out, err) in runs.items():
        raw = sorted({c for c in out + err if c in BIDI})
        assert raw == [], (name, raw)
        assert "unexpected" not in err
    assert "invoice\\u202etxt.exe" in runs["docs list"].out
    assert "Log \\u2066of\\u2069 the keeper" in runs["docs list"].out
    assert "The keeper \\u202elogged\\u202c the storm \\u2067twice\\u2069." in runs["docs show --chunks 1"].out
    assert "\\u202elogged" in runs["ask --evidence-only what did the keeper log?"].out
    listed = json.loads(runs["docs list --json"].out)  # JSON keeps the exact text, escaped
    assert listed[0]["path"] == str(doc.resolve())
