"""Parsing and chunking limits on hostile-but-valid input (hardening issue, items 4 and 5).

    python bench/parse_limits.py [--epub-mb 1 2] [--text-mb 2 5.6]

- EPUB: seconds to parse an EPUB whose single chapter is N MB of paragraphs (parse_file);
- text without sentence punctuation: peak RSS growth while chunking N MB of it with the real
  tokenizer (each size in a fresh process, resource.getrusage ru_maxrss).

Prints one line per size; writes bench/results/parse_limits.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from common import write_result  # noqa: E402

PARAGRAPH = "<p>The keeper of Gull Point was Silas Quint, and he kept the light burning every night.</p>\n"

CHUNK_UNPUNCTUATED = r"""
import json, random, resource, sys, time
from evsel.ingest.chunker import chunk_document
from evsel.models.runtime.backbone import Backbone
from evsel.ingest.parsers.base import ParsedDocument, TextBuilder

def doc(text):
    builder = TextBuilder()
    builder.add(text)
    return ParsedDocument(text=text, kind="book", title="t", segments=builder.segments)

rng = random.Random(0)
words = "keeper light harbour gull point silas quint boat night brass key tide".split()
text = " ".join(rng.choice(words) for _ in range(int(float(sys.argv[1]) * 1e6) // 6)) + "\n"
backbone = Backbone()
chunk_document(doc("Warm up the tokenizer. " * 400), backbone)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
chunks = chunk_document(doc(text), backbone)
seconds = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert "".join(c.text for c in chunks) == text
print(json.dumps({"chars": len(text), "peak_before_mb": before / 1024, "peak_after_mb": after / 1024,
                  "grown_mb": (after - before) / 1024, "seconds": seconds, "chunks": len(chunks)}))
"""


def make_epub(path: Path, megabytes: float) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")
        z.writestr("META-INF/container.xml", '<container xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
                   '<rootfiles><rootfile full-path="content.opf"/></rootfiles></container>')
        z.writestr("content.opf", '<package xmlns="http://www.idpf.org/2007/opf"><metadata/><manifest>'
                   '<item id="c" href="c.xhtml" media-type="application/xhtml+xml"/></manifest>'
                   '<spine><itemref idref="c"/></spine></package>')
        body = PARAGRAPH * int(megabytes * 1e6 / len(PARAGRAPH))
        z.writestr("c.xhtml", f'<html xmlns="http://www.w3.org/1999/xhtml"><body>{body}</body></html>')
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epub-mb", type=float, nargs="*", default=[1.0, 2.0])
    parser.add_argument("--text-mb", type=float, nargs="*", default=[2.0, 5.6])
    args = parser.parse_args()
    from evsel.evaluation.report import run_info
    from evsel.ingest.parsers import parse_file

    record: dict = {"run": run_info(["python", "bench/parse_limits.py", *sys.argv[1:]]), "epub": [], "text": []}
    with tempfile.TemporaryDirectory() as tmp:
        for mb in args.epub_mb:
            path = make_epub(Path(tmp) / f"chapter{mb}.epub", mb)
            started = time.perf_counter()
            [doc] = parse_file(path)
            seconds = time.perf_counter() - started
            record["epub"].append({"chapter_mb": mb, "epub_kb": path.stat().st_size / 1e3, "seconds": seconds,
                                   "chars": len(doc.text)})
            print(f"EPUB, one {mb:g} MB chapter ({path.stat().st_size / 1e3:.0f} KB file): parsed in {seconds:.2f} s")
    for mb in args.text_mb:
        out = subprocess.run([sys.executable, "-c", CHUNK_UNPUNCTUATED, str(mb)], capture_output=True, text=True,
                             check=True, env={"OMP_NUM_THREADS": "1", **__import__("os").environ})
        result = json.loads(out.stdout)
        record["text"].append({"text_mb": mb, **result})
        print(f"unpunctuated text, {result['chars'] / 1e6:.1f} MB: peak RSS {result['peak_before_mb']:.0f} -> "
              f"{result['peak_after_mb']:.0f} MB (+{result['grown_mb']:.0f} MB) chunking it, "
              f"{result['seconds']:.1f} s, {result['chunks']} chunks")
    write_result(ROOT / "bench" / "results" / "parse_limits.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
