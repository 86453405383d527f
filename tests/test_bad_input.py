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
from evsel.store import Store


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
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
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_one_clear_line_and_the_good_file_goes_in(case, tmp_path, good, capsys):
    make, words = BAD[case]
    bad = make(tmp_path)
    code, out, err = run(capsys, "ingest", str(bad), str(good))
    assert code == 1
    assert out == ""
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
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    errors = lines(result.stderr, "error")
    assert len(errors) == len(bad)
    for path in bad:
        assert sum(f"{path}: " in line for line in errors) == 1, path.name
    assert f"ingested {good.resolve()}" in result.stderr

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
