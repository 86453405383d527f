"""Every bad input through the real CLI: one error line on stderr naming the file and what to do,
a non-zero exit, nothing stored for that file, the other files of the same command still ingested,
and never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pymupdf
import pytest

from evsel.cli import main
from evsel.store.store import Store


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    assert "unexpected" not in err  # every bad input is one the errors say how to fix, never a bug report
    return code, out, err


def lines(err: str, kind: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(f"evsel: {kind}:")]


def stored_paths() -> list[str]:
    return [d["path"] for d in Store().documents()]


@pytest.fixture
def good(tmp_path) -> Path:
    path = tmp_path / "good" / "harbour.txt"
    path.parent.mkdir()
    path.write_text("The harbour master kept a log. It recorded every ship that came in.\n")
    return path


# the bad files: name -> (make it in a folder, words the error must contain)


def pdf_with_text(path: Path, text: str = "Some text on the page.", **save) -> Path:
    pdf = pymupdf.open()
    pdf.new_page().insert_text((72, 72), text)
    pdf.save(path, **save)
    pdf.close()
    return path


def missing(d: Path) -> Path:
    return d / "no_such_book.txt"


def no_supported_files(d: Path) -> Path:
    folder = d / "folder_of_other_things"
    folder.mkdir()
    (folder / "notes.docx").write_bytes(b"PK\x03\x04")
    (folder / "picture.png").write_bytes(b"\x89PNG")
    return folder


def empty_file(d: Path) -> Path:
    path = d / "empty.txt"
    path.write_bytes(b"")
    return path


def blank_file(d: Path) -> Path:
    path = d / "blank.md"
    path.write_text("\n   \n\t\n")
    return path


def binary_file(d: Path) -> Path:
    path = d / "program.txt"
    path.write_bytes(bytes(range(256)) * 40)
    return path


def corrupt_pdf(d: Path) -> Path:
    path = d / "corrupt.pdf"
    path.write_bytes(b"%PDF-1.7\n1 0 obj << /Type /Catalog >> garbage \x00\x01\x02 not really a PDF")
    return path


def truncated_pdf(d: Path) -> Path:
    whole = pdf_with_text(d / "whole.tmp", "A page that will be cut off. " * 40).read_bytes()
    path = d / "truncated.pdf"
    path.write_bytes(whole[: len(whole) // 3])
    return path


def empty_pdf(d: Path) -> Path:
    path = d / "zero.pdf"
    path.write_bytes(b"")
    return path


def encrypted_pdf(d: Path) -> Path:
    return pdf_with_text(
        d / "locked.pdf", "Secret minutes.", encryption=pymupdf.PDF_ENCRYPT_AES_256, owner_pw="owner", user_pw="user"
    )


def scanned_pdf(d: Path) -> Path:
    """Pages with only an image and a drawing: nothing to extract without OCR."""
    pdf = pymupdf.open()
    for _ in range(2):
        page = pdf.new_page()
        pixmap = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 64, 64), False)
        pixmap.clear_with(180)
        page.insert_image(pymupdf.Rect(72, 72, 300, 300), pixmap=pixmap)
        page.draw_rect(pymupdf.Rect(50, 400, 200, 500), color=(0, 0, 0), fill=(0.5, 0.5, 0.5))
    path = d / "scanned.pdf"
    pdf.save(path)
    pdf.close()
    return path


def malformed_json(d: Path) -> Path:
    path = d / "chat.json"
    path.write_text('{"conversation": {"session_1": [{"speaker": "Ann", "text": "Hi"},')
    return path


def json_without_turn_text(d: Path) -> Path:
    path = d / "locomo_broken.json"
    path.write_text(json.dumps([{"sample_id": "x", "conversation": {"session_1": [{"speaker": "Ann"}]}}]))
    return path


def json_of_the_wrong_shape(d: Path) -> Path:
    path = d / "numbers.json"
    path.write_text("[1, 2, 3]")
    return path


def malformed_jsonl(d: Path) -> Path:
    path = d / "chat.jsonl"
    path.write_text('{"role": "user", "content": "Hi"}\n{"role": "assistant", "content": \n')
    return path


def transcript_that_is_prose(d: Path) -> Path:
    path = d / "story.txt"
    path.write_text("Once upon a time there was a lighthouse.\nIt stood alone.\n")
    return path


def html_named_pdf(d: Path) -> Path:
    path = d / "saved_page.pdf"
    path.write_text("<html><body><h1>Tide tables</h1><p>High water at 6:12.</p></body></html>\n")
    return path


def _one_page_pdf(count: bytes) -> bytes:
    pdf = pymupdf.open()
    pdf.new_page().insert_text((72, 72), "Only one page is really here.")
    data = pdf.tobytes()
    pdf.close()
    assert b"/Count 1" in data
    return data.replace(b"/Count 1", b"/Count " + count)


def pdf_claiming_more_pages(d: Path) -> Path:
    """The page tree says 5 pages; there is one (pymupdf: "page not in document")."""
    path = d / "claims_five.pdf"
    path.write_bytes(_one_page_pdf(b"5"))
    return path


def pdf_with_an_impossible_page_count(d: Path) -> Path:
    """The page tree says a million pages (mupdf: RuntimeError "code=7: Invalid number of pages")."""
    path = d / "claims_a_million.pdf"
    path.write_bytes(_one_page_pdf(b"1000000"))
    return path


def deeply_nested_epub(d: Path) -> Path:
    """XHTML nested 50,000 elements deep (mupdf failed on it with RuntimeError "code=8: too deep xml
    element nesting"; the EPUB reader does not recurse, so it is read)."""
    import zipfile

    depth = 50_000
    body = "<div>" * depth + "deep text" + "</div>" * depth
    path = d / "nested.epub"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml",
                   '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:'
                   'container"><rootfiles><rootfile full-path="content.opf" media-type="application/oebps-package'
                   '+xml"/></rootfiles></container>')
        z.writestr("content.opf",
                   '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="2.0" '
                   'unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Deep'
                   '</dc:title><dc:identifier id="id">x</dc:identifier></metadata><manifest><item id="c" '
                   'href="c.xhtml" media-type="application/xhtml+xml"/></manifest><spine><itemref idref="c"/>'
                   '</spine></package>')
        z.writestr("c.xhtml", '<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml">'
                              f"<head><title>t</title></head><body>{body}</body></html>")
    return path


def test_an_epub_nested_50000_deep_is_read_in_one_pass(tmp_path, capsys):
    epub = deeply_nested_epub(tmp_path)
    code, _, err = run(capsys, "ingest", str(epub))
    assert code == 0, err
    [doc] = Store().documents()
    assert Store().document(doc["id"])["title"] == "Deep"
    assert "deep text" in " ".join(c.text for c in Store().chunks([doc["id"]]))


def json_chat_with_a_lone_surrogate(d: Path) -> Path:
    path = d / "surrogate_chat.json"
    path.write_text('[{"speaker": "Ann", "text": "Did the ferry run?"},\n'
                    ' {"speaker": "Ben", "text": "Not in this fog \\ud800 at all."}]\n')
    return path


def deeply_nested_json(d: Path) -> Path:
    path = d / "nested.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    return path


def deeply_nested_jsonl(d: Path) -> Path:
    path = d / "nested.jsonl"
    path.write_text('{"role": "user", "content": "Hi"}\n{"content": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    return path


BAD = {
    "missing path": (missing, ["no such file"]),
    "directory with no supported files": (no_supported_files, ["no supported files", ".pdf"]),
    "empty file": (empty_file, ["empty"]),
    "blank file": (blank_file, ["empty"]),
    "binary file": (binary_file, ["binary"]),
    "corrupt PDF": (corrupt_pdf, ["damaged", "re-download"]),
    "truncated PDF": (truncated_pdf, ["damaged"]),
    "empty PDF": (empty_pdf, ["empty"]),
    "encrypted PDF": (encrypted_pdf, ["encrypted", "decrypt"]),
    "scanned PDF": (scanned_pdf, ["no extractable text", "OCR is not supported"]),
    "malformed dialogue JSON": (malformed_json, ["malformed dialogue JSON", "line 1"]),
    "dialogue JSON without turn text": (json_without_turn_text, ["malformed dialogue JSON", "lacks speaker or text"]),
    "JSON that is not a dialogue": (json_of_the_wrong_shape, ["malformed dialogue JSON"]),
    "malformed JSONL": (malformed_jsonl, ["malformed dialogue JSON", "line 2"]),
    "HTML named .pdf": (html_named_pdf, ["not a PDF file", "HTML", "real extension"]),
    "PDF claiming more pages than it has": (pdf_claiming_more_pages, ["page 2 of 5", "damaged", "re-download"]),
    "PDF with an impossible page count": (pdf_with_an_impossible_page_count,
                                          ["Invalid number of pages", "damaged", "re-download"]),
    "JSON chat with a lone surrogate": (json_chat_with_a_lone_surrogate, ["lone UTF-16 surrogate", "\\ud800",
                                                                           "line 2", "fix that escape"]),
    "deeply nested JSON": (deeply_nested_json, ["malformed dialogue JSON", "nested too deeply"]),
    "deeply nested JSONL": (deeply_nested_jsonl, ["malformed dialogue JSON", "line 2 is nested too deeply"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_one_clear_line_and_the_good_file_goes_in(case, tmp_path, good, capsys):
    make, words = BAD[case]
    bad = make(tmp_path)
    code, out, err = run(capsys, "ingest", str(bad), str(good))
    assert code == 1
    assert out.startswith(f"ingested {good.resolve()}") and len(out.splitlines()) == 1  # the good file's summary
    [line] = lines(err, "error")
    assert bad.name in line
    for word in words:
        assert word in line, line
    assert "; " in line  # then what to do
    assert stored_paths() == [str(good.resolve())]


def test_kind_dialogue_on_prose_is_refused(tmp_path, capsys):
    bad = transcript_that_is_prose(tmp_path)
    chat = tmp_path / "chat.txt"
    chat.write_text("Ann: Did the ferry run?\nBen: Not in this fog.\n")
    code, _, err = run(capsys, "ingest", "--kind", "dialogue", str(bad), str(chat))
    assert code == 1
    [line] = lines(err, "error")
    assert bad.name in line and "--kind book" in line
    assert stored_paths() == [str(chat.resolve())]


def test_non_utf8_text_is_ingested_with_a_warning(tmp_path, capsys):
    path = tmp_path / "cafe.txt"
    path.write_bytes("The caf\u00e9 on the quay served cr\u00eapes. It closed at nine.\n".encode("latin-1"))
    code, _, err = run(capsys, "ingest", str(path))
    assert code == 0
    assert lines(err, "error") == []
    [warning] = lines(err, "warning")
    assert "cafe.txt" in warning and "not valid UTF-8" in warning and "convert the file to UTF-8" in warning
    [chunk] = Store().chunks()
    assert "caf\u00e9" in chunk.text and "cr\u00eapes" in chunk.text


def test_brackets_in_a_path_are_printed_as_they_are(tmp_path, capsys):
    bad = tmp_path / "draft [bold]v2[red].txt"
    bad.write_bytes(b"")
    code, _, err = run(capsys, "ingest", str(bad))
    assert code == 1
    [line] = lines(err, "error")
    assert "draft [bold]v2[red].txt" in line


def test_too_small_chunks_are_refused(good, capsys):
    code, _, err = run(capsys, "ingest", "--chunk-tokens", "4", str(good))
    assert code == 1
    [line] = lines(err, "error")
    assert "--chunk-tokens 4" in line and "16 or more" in line
    assert Store().documents() == []


# asking and documents


def test_asking_with_nothing_ingested(capsys):
    for extra in ([], ["--json"], ["--evidence-only"]):
        code, out, err = run(capsys, "ask", *extra, "Who killed Ambrose Tenterden?")
        assert code == 1 and out == ""
        [line] = lines(err, "error")
        assert "nothing is ingested yet" in line and "evsel ingest PATH" in line


@pytest.mark.parametrize(
    "args",
    [
        ["ask", "--doc", "99", "Who kept the log?"],
        ["ask", "--evidence-only", "--doc", "1", "--doc", "99", "Who kept the log?"],
        ["docs", "show", "99"],
        ["docs", "show", "--json", "99"],
        ["docs", "rm", "99"],
        ["docs", "rm", "1", "99"],
    ],
)
def test_unknown_doc_id(args, good, capsys):
    assert run(capsys, "ingest", str(good))[0] == 0
    code, out, err = run(capsys, *args)
    assert code == 1 and out == ""
    [line] = lines(err, "error")
    assert "no document with id 99" in line and "evsel docs list" in line
    assert stored_paths() == [str(good.resolve())]  # "rm 1 99" removed nothing


def test_unknown_collection(good, capsys):
    assert run(capsys, "ingest", str(good))[0] == 0
    for args in (["ask", "--collection", "nope", "Who?"], ["docs", "list", "--collection", "nope"]):
        code, _, err = run(capsys, *args)
        assert code == 1
        [line] = lines(err, "error")
        assert "no collection named 'nope'" in line


def test_every_bad_input_at_once_in_a_real_process(tmp_path, good):
    """The installed entry point in its own process: exit status, stderr, no traceback."""
    folder = tmp_path / "bad"
    folder.mkdir()
    bad = [make(folder) for make, _ in BAD.values()]
    env = {**os.environ, "COLUMNS": "60"}  # a narrow terminal must not wrap error lines
    result = subprocess.run(
        [sys.executable, "-m", "evsel", "ingest", *map(str, bad), str(good)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 1
    assert result.stdout.splitlines() == [line for line in result.stdout.splitlines() if line.startswith("ingested ")]
    assert "Traceback" not in result.stderr and "unexpected" not in result.stderr
    errors = lines(result.stderr, "error")
    assert len(errors) == len(bad)
    for path in bad:
        assert sum(f"{path}: " in line for line in errors) == 1, path.name
    assert f"ingested {good.resolve()}" in result.stdout

    listed = subprocess.run(
        [sys.executable, "-m", "evsel", "docs", "list", "--json"], capture_output=True, text=True, env=env, timeout=600
    )
    assert listed.returncode == 0
    assert [d["path"] for d in json.loads(listed.stdout)] == [str(good.resolve())]


_READ_SPARSE = r"""
import resource, sys
from pathlib import Path
from evsel.engine import Engine
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
[result] = Engine().ingest([sys.argv[1]], encode=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(result["status"], result["error"]["message"], (after - before) * 1024, sep="|")
"""


def test_a_sparse_1gb_txt_is_refused_as_binary_before_it_is_read_whole(tmp_path):
    """It was read whole (957 MB RSS) before the binary check looked at its first bytes."""
    path = tmp_path / "hole.txt"
    with open(path, "wb") as handle:
        handle.truncate(1 << 30)  # a hole: no disk used, a gigabyte of NUL bytes when read
    result = subprocess.run([sys.executable, "-c", _READ_SPARSE, str(path)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    status, message, grown = result.stdout.strip().split("|")
    assert status == "failed" and "binary" in message and "unexpected" not in message
    assert int(grown) < 64 << 20, f"peak RSS grew {int(grown) >> 20} MB"


# a PDF cut short that mupdf can still partly read: ingested, with a warning that text may be missing


def test_a_truncated_pdf_that_mupdf_repairs_is_ingested_with_a_warning(tmp_path, capsys):
    pdf = pymupdf.open()
    for number in range(6):
        pdf.new_page().insert_text((72, 72), f"Page {number + 1} of the keeper's log. " * 12)
    whole = pdf.tobytes(garbage=0, deflate=False)
    pdf.close()
    path = tmp_path / "cut_short.pdf"
    path.write_bytes(whole[: len(whole) * 4 // 5])  # the last pages and the xref table are gone
    code, out, err = run(capsys, "ingest", "--json", str(path))
    assert code == 0
    [result] = json.loads(out)["files"]
    assert result["status"] == "ingested"
    [warning] = result["warnings"]
    assert "damaged and mupdf repaired it" in warning and "some text may be missing" in warning
    assert "re-download" in warning
    [line] = lines(err, "warning")
    assert "cut_short.pdf" in line and "repaired" in line


# the store itself: a full disk, a lock held too long, a socket path that is a directory


def _mount_tmpfs(folder: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` at `folder`; None when done, else why it could not be."""
    folder.mkdir()
    if os.getuid() != 0:
        return "mounting a tmpfs needs root"
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)],
                            capture_output=True, text=True)
    return None if result.returncode == 0 else f"mount -t tmpfs failed: {result.stderr.strip()}"


@pytest.mark.parametrize("disk", ["tmpfs", "max_page_count"])
def test_a_full_disk_is_one_line_and_nothing_is_stored_half_way(disk, tmp_path, good, monkeypatch, capsys):
    """tmpfs: a real 2 MB file system that fills up (needs root). max_page_count: SQLite's own cap on
    the store's size, which raises the same SQLITE_FULL ("database or disk is full") anywhere."""
    from evsel.store import store

    small = tmp_path / "small"
    if disk == "tmpfs":
        why = _mount_tmpfs(small, "2m")
        if why:
            pytest.skip(why)
        monkeypatch.setenv("EVSEL_HOME", str(small / "home"))
    try:
        assert run(capsys, "ingest", str(good))[0] == 0
        book = tmp_path / "long_book.txt"
        book.write_text("".join(f"Chapter {n}. The keeper wrote of ships, gulls, fog and the lamp. " * 10 + "\n"
                                for n in range(600)))  # ~400 KB of text, more than the disk has left
        if disk == "tmpfs":  # leave 128 KB free
            free = os.statvfs(small).f_bavail * os.statvfs(small).f_frsize
            (small / "filler").write_bytes(b"\0" * max(free - (128 << 10), 0))
        if disk == "max_page_count":
            connect = store.connect

            def capped(path=None):
                db = connect(path)
                pages = db.execute("pragma page_count").fetchone()[0]
                db.execute(f"pragma max_page_count = {pages + 8}")
                return db

            monkeypatch.setattr(store, "connect", capped)
        code, out, err = run(capsys, "ingest", str(book))
        assert code == 1 and out == ""
        [line] = lines(err, "error")
        assert "long_book.txt: the disk is full" in line and "nothing was stored half-way" in line
        assert "free some space" in line
        monkeypatch.setattr(store, "connect", store.connect)
        assert stored_paths() == [str(good.resolve())]
        db = store.connect()
        assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
        assert db.execute("select count(*) from chunks").fetchone()[0] == 1  # good's one chunk, no more
        db.conn.close()
    finally:
        if disk == "tmpfs":
            subprocess.run(["umount", "-l", str(small)], check=False)


def test_a_store_locked_too_long_is_one_line_and_nothing_is_stored(tmp_path, good, monkeypatch, capsys):
    """Another connection holds the write lock; the wait is shortened from a minute (BUSY_TIMEOUT_S)."""
    import sqlite3

    from evsel.store import store

    assert run(capsys, "ingest", str(good))[0] == 0
    other = tmp_path / "other.txt"
    other.write_text("The lamp was lit at dusk and put out at dawn.\n")
    holder = sqlite3.connect(store.paths.db_path(), isolation_level=None)
    holder.execute("begin exclusive")
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.2)
    try:
        code, out, err = run(capsys, "ingest", str(other))
    finally:
        holder.execute("rollback")
        holder.close()
    assert code == 1 and out == ""
    [line] = lines(err, "error")
    assert "other.txt: the store is locked" in line and "run the command again" in line
    assert stored_paths() == [str(good.resolve())]


def test_a_socket_path_that_is_a_directory_is_one_line(evsel_home, monkeypatch, capsys):
    monkeypatch.delenv("EVSEL_NO_DAEMON")
    evsel_home.mkdir(mode=0o700)
    (evsel_home / "daemon.sock").mkdir()
    code, out, err = run(capsys, "docs", "list")
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        f"evsel: error: {evsel_home / 'daemon.sock'} is a directory, not the evsel daemon's socket; move it away "
        f"(or rmdir {evsel_home / 'daemon.sock'}), then run the command again"]
    assert (evsel_home / "daemon.sock").is_dir()  # left for the user to look at


# names and questions that are not UTF-8, on a stdout that takes only UTF-8


def test_json_and_human_output_of_names_that_are_not_utf8_on_a_strict_stdout(tmp_path):
    folder = os.fsencode(tmp_path / "docs")
    os.mkdir(folder)
    odd = os.path.join(folder, b"caf\xe9.txt")
    with open(odd, "w") as f:
        f.write("The caf\u00e9 on the quay served tea to the keeper.\n")
    with open(os.path.join(folder, b"plain.txt"), "w") as f:
        f.write("The keeper drank strong tea at noon by the lamp.\n")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}

    def evsel(*args) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "evsel", *args], capture_output=True, env=env, timeout=600)

    result = evsel("ingest", "--json", os.fsdecode(folder))
    assert b"unexpected" not in result.stderr and b"Traceback" not in result.stderr
    data = json.loads(result.stdout.decode("utf-8"))  # strict: valid UTF-8
    by_name = {os.fsencode(f["path"]): f for f in data["files"]}  # \udce9 reads back as the byte 0xE9
    assert by_name[odd]["status"] == "failed" and "rename the file" in by_name[odd]["error"]["hint"]
    assert by_name[os.path.join(folder, b"plain.txt")]["status"] == "ingested"
    assert result.returncode == 1 and data["failed"] == 1

    human = evsel("ingest", os.fsdecode(folder))  # a human reads the byte as \xe9
    err = human.stderr.decode("utf-8")
    assert human.returncode == 1 and "unexpected" not in err
    [line] = [line for line in err.splitlines() if line.startswith("evsel: error:")]
    assert "caf\\xe9.txt: the file name is not valid UTF-8" in line

    question = os.fsdecode(b"who drank tea at the caf\xe9?")
    asked = evsel("ask", "--evidence-only", "--json", question)
    assert asked.returncode == 0, asked.stderr
    answer = json.loads(asked.stdout.decode("utf-8"))
    assert answer["question"] == question and answer["evidence"]


def test_the_error_table_names_each_known_failure_and_leaves_bugs_alone():
    import errno
    import sqlite3

    from evsel.errors import EvselError, StoreError, known_error, user_message

    full = known_error(sqlite3.OperationalError("database or disk is full"))
    assert isinstance(full, StoreError) and "disk is full" in full.line() and "free some space" in full.line()
    locked = known_error(sqlite3.OperationalError("database is locked"))
    assert isinstance(locked, StoreError) and "locked" in locked.line()
    assert "disk is full" in known_error(OSError(errno.ENOSPC, "No space left on device", "/x/daemon.log")).line()
    # the dense model copy written by safetensors, which wraps the OS error in its own
    wrapped = Exception("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: \"No space "
                        "left on device\" })")
    assert "disk is full" in known_error(wrapped).line()
    folder = known_error(IsADirectoryError(errno.EISDIR, "Is a directory", "/x/daemon.sock"))
    assert folder.line() == ("/x/daemon.sock is a directory where evsel expects a file; "
                             "move the directory away, then run the command again")
    assert "nested too deeply" in known_error(RecursionError("maximum recursion depth exceeded")).line()
    assert "permission denied: /x" in known_error(PermissionError(errno.EACCES, "denied", "/x")).line()
    mine = EvselError("no such thing", "look elsewhere")
    assert known_error(mine) is mine
    dropped = known_error(sqlite3.OperationalError("no such table: bm25_postings"))
    assert isinstance(dropped, StoreError) and "table bm25_postings is missing" in dropped.line()
    for bug in (ValueError("x"), TypeError("y"), AssertionError(), sqlite3.OperationalError("no such column: c"),
                OSError(errno.EIO, "I/O error")):
        assert known_error(bug) is None
        assert user_message(bug).startswith(f"unexpected {type(bug).__name__}")
    assert user_message(KeyboardInterrupt()) == "interrupted"
