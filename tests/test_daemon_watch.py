"""Watch folders: real inotify events through watchdog, a real daemon, the real tokenizer."""

from __future__ import annotations

import json
import threading

from daemon_helpers import daemon_home, docs_by_name, evsel, evsel_json, run_cli, status, wait_for  # noqa: F401  (fixture)


def test_a_burst_of_writes_is_one_sync(tmp_path):
    from evsel.daemon.watcher import Watcher

    calls = []
    changed = threading.Event()

    def submit(root, collection, paths):
        calls.append((root, collection, paths))
        changed.set()

    folder = tmp_path / "notes"
    folder.mkdir()
    watcher = Watcher(submit, debounce=0.5)
    watcher.start()
    try:
        watcher.watch(str(folder), "notes")
        assert calls == [(str(folder), "notes", None)]  # a new watch starts with a full sync
        note = folder / "a.md"
        for i in range(10):  # an editor saving repeatedly
            note.write_text(f"# Draft {i}\n\nText.\n")
        (folder / ".a.md.swp").write_text("editor state")  # hidden: never ingested
        (folder / "image.png").write_bytes(b"\x89PNG")  # unsupported
        wait_for(lambda: len(calls) >= 2, 30, "the debounced sync")
        # a folder moved in sends no events for its files: it triggers a rescan
        sub = tmp_path / "incoming"
        sub.mkdir()
        (sub / "b.txt").write_text("Text.")
        sub.rename(folder / "incoming")
        wait_for(lambda: len(calls) >= 3, 30, "the rescan")
        # a wrong second sync for the burst, due before the rescan, would sit between them
        assert calls[1:] == [(str(folder), "notes", [str(note)]), (str(folder), "notes", None)]
        assert watcher.unwatch(str(folder)) and not watcher.unwatch(str(folder))
    finally:
        watcher.stop()


def _docs(collection="notes"):
    return docs_by_name(collection)


def _docs_or_empty():
    return docs_by_name()


def test_watch_create_modify_delete_failures_and_restart(daemon_home, tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("The keeper of Gull Point was Silas Quint.\n")
    evsel("daemon", "start", "--no-preload")
    started = evsel("watch", str(folder), "--collection", "notes")
    assert f"watching {folder}" in started.stderr
    wait_for(lambda: "a.txt" in _docs_or_empty(), 120, "the first sync")

    (folder / "b.md").write_text("# Ledger\n\nMabel Frost sailed to Lisbon.\n")  # create
    wait_for(lambda: "b.md" in _docs_or_empty(), 60, "b.md to be ingested")

    first = _docs()["a.txt"]
    for i in range(8):  # modify, as a burst of saves
        (folder / "a.txt").write_text(f"The keeper of Gull Point was Silas Quint. Revision {i}.\n")
    final = (folder / "a.txt").read_text()
    wait_for(lambda: _docs()["a.txt"]["n_chars"] == len(final), 60, "a.txt to be re-ingested")
    assert _docs()["a.txt"]["id"] == first["id"]  # same document, new version

    def a_ingests():  # logged once the sync's outcome is recorded, just after its store write
        return (daemon_home / "daemon.log").read_text().count(f"ingested {folder / 'a.txt'}")

    wait_for(lambda: a_ingests() >= 2, 60, "the re-ingest to be logged")
    assert a_ingests() == 2  # the first sync, then one for the whole burst

    (folder / "b.md").unlink()  # delete
    wait_for(lambda: "b.md" not in _docs(), 60, "b.md to be removed")

    (folder / "broken.pdf").write_bytes(b"%PDF-1.7 this is not really a PDF")  # a failing file
    (folder / "c.txt").write_text("Agnes Moor lit the lamp.\n")
    wait_for(lambda: "c.txt" in _docs(), 60, "c.txt to be ingested despite the broken PDF")

    def failure():
        watches = status(daemon_home)["watches"]
        return watches and watches[0]["failures"]

    failures = wait_for(failure, 60, "the broken PDF to be reported")
    assert failures[0]["path"] == str(folder / "broken.pdf")
    assert "cannot read this PDF" in failures[0]["error"]
    assert "broken.pdf: cannot read this PDF" in evsel("daemon", "status").stdout
    listed = evsel_json("watch", "--list")
    assert listed[0]["path"] == str(folder) and listed[0]["collection"] == "notes" and listed[0]["failed"] == 1
    assert "cannot read this PDF" in (daemon_home / "daemon.log").read_text()

    # the watch list survives a restart, and the start catches up with changes made meanwhile
    evsel("daemon", "stop")
    (folder / "c.txt").unlink()
    (folder / "d.txt").write_text("Written while the daemon was down.\n")
    evsel("daemon", "start", "--no-preload")
    wait_for(lambda: set(_docs()) == {"a.txt", "d.txt"}, 120, "the re-sync after the restart")
    assert evsel_json("watch", "--list")[0]["path"] == str(folder)

    removed = evsel("watch", "--remove", str(folder))
    assert "stopped watching" in removed.stderr
    assert evsel_json("watch", "--list") == []
    # a file in the unwatched folder, then one in a watched folder: once the second is in, a
    # (wrong) sync of the first, debounced the same way and due earlier, would have run
    other = tmp_path / "other"
    other.mkdir()
    evsel("watch", str(other), "--collection", "other")
    (folder / "e.txt").write_text("Not watched any more.\n")
    (other / "f.txt").write_text("Watched.\n")
    wait_for(lambda: "f.txt" in _docs("other"), 60, "f.txt to be ingested")
    assert "e.txt" not in _docs()


def test_watch_bad_input_and_no_daemon_mode(daemon_home, tmp_path, capsys):
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / "a.txt").write_text("Edith Crane rang the fog bell.\n")
    (tmp_path / "file.txt").write_text("x")
    evsel("daemon", "start", "--no-preload")
    for args, message in (
        ((str(tmp_path / "missing"),), "missing: no such directory"),
        ((str(tmp_path / "file.txt"),), "file.txt: not a directory"),
        ((), "give one of: a FOLDER to watch, --list, or --remove DIR"),
        (("--remove", str(tmp_path / "missing")), "is not watched"),
    ):
        result = run_cli(capsys, "watch", *args)
        assert result[0] == 1 and message in result[2], (args, result)
    result = evsel("--no-daemon", "watch", str(tmp_path / "file.txt"), check=False)
    assert result.returncode == 1 and result.stderr.startswith("evsel: error: ") and "not a directory" in result.stderr
    # --no-daemon saves the folder; the daemon watches it when it starts
    saved = evsel("--no-daemon", "watch", str(folder), "--collection", "inbox")
    assert "the daemon watches it when it runs" in saved.stderr
    assert json.loads(evsel("--no-daemon", "watch", "--list", "--json").stdout)[0]["path"] == str(folder)
    # the running daemon follows the store's watch list
    wait_for(lambda: "a.txt" in _docs_or_empty(), 120, "the saved folder to be synced")
    assert evsel_json("docs", "list")[0]["collection"] == "inbox"


def test_a_watched_folder_deleted_and_created_again_is_observed_and_synced_again(tmp_path):
    """Its inotify watch died with it: new files were never ingested, `observing` stayed true and
    "the watched folder is gone" stayed until a restart."""
    import shutil

    from evsel.daemon.watcher import Watcher

    calls = []
    folder = tmp_path / "notes"
    folder.mkdir()
    watcher = Watcher(lambda root, collection, paths: calls.append(paths), debounce=0.2)
    watcher.start()
    try:
        watcher.watch(str(folder), "notes")
        watcher.record_error(str(folder), "the watched folder is gone")  # what a sync in between records
        shutil.rmtree(folder)
        wait_for(lambda: not watcher.describe()[str(folder)]["observing"], 30, "the folder to be seen gone")
        assert "gone" in watcher.describe()[str(folder)]["error"]
        synced = len(calls)
        folder.mkdir()
        wait_for(lambda: watcher.describe()[str(folder)]["observing"], 30, "the folder to be observed again")
        wait_for(lambda: None in calls[synced:], 30, "a full sync of the folder that is back")
        described = watcher.describe()[str(folder)]
        assert described["error"] is None and described["failed"] == 0
        (folder / "new.md").write_text("# New\n\nA note written after the folder came back.\n")
        wait_for(lambda: [str(folder / "new.md")] in calls, 30, "the new file's sync")
        # deleted and made again between two checks: the dead watch is still replaced
        dead = watcher.roots[str(folder)]["watch"]
        shutil.rmtree(folder)
        folder.mkdir()

        def replaced():
            watch = watcher.roots[str(folder)]["watch"]
            return watch is not None and watch is not dead  # watches compare equal by path: tell them apart by id

        wait_for(replaced, 30, "a new watch on the folder")
        (folder / "later.md").write_text("# Later\n\nStill seen.\n")
        wait_for(lambda: [str(folder / "later.md")] in calls, 30, "a file in the folder made again")
    finally:
        watcher.stop()
