"""Ingest time of the FinanceBench filings with each PDF reader, in one run.

    python bench/pdf_reader.py --out bench/results/pdf-reader-ingest.json

Whole processes as a user runs them: `evsel --no-daemon ingest --no-encode pdfs/` (parse, chunk,
store; no model states) in a fresh EVSEL_HOME, EVSEL_PDF_READER=plain (the page-text reader),
=tables and =finder (reading order, running lines, tables as rows; tables found from the words, or
from pymupdf's table finder) in turn over `--repeats`, one thread.
Also reports what each reader stored: chunks, tables, running lines dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import data_dir, load_1m, write_result  # noqa: E402

READERS = ("plain", "tables", "finder")


def ingest(folder: Path, reader: str) -> dict:
    home = Path(tempfile.mkdtemp(prefix="evsel-bench-pdf-"))
    os.chmod(home, 0o700)
    env = dict(os.environ, EVSEL_HOME=str(home), EVSEL_PDF_READER=reader, EVSEL_THREADS="1")
    try:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "evsel", "--no-daemon", "ingest", "--no-encode", str(folder)],
                              capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"ingest with EVSEL_PDF_READER={reader} failed: {done.stderr}")
        listed = subprocess.run([sys.executable, "-m", "evsel", "--no-daemon", "docs", "list", "--json"],
                                capture_output=True, text=True, env=env, check=True)
        docs = json.loads(listed.stdout)
        tables = dropped = 0
        for doc in docs:
            shown = subprocess.run([sys.executable, "-m", "evsel", "--no-daemon", "docs", "show", str(doc["id"]),
                                    "--json"], capture_output=True, text=True, env=env, check=True)
            metadata = json.loads(shown.stdout)["metadata"]
            tables += len(metadata.get("tables", []))
            dropped += metadata.get("dropped_lines", {}).get("count", 0)
        return {"seconds": seconds, "chunks": sum(d["n_chunks"] for d in docs), "tables": tables,
                "dropped_lines": dropped, "load_1m": load_1m()}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/pdf-reader-ingest.json"))
    args = parser.parse_args()
    folder = data_dir() / "financebench" / "pdfs"
    runs: dict[str, list[dict]] = {r: [] for r in READERS}
    for _ in range(args.repeats):
        for reader in READERS:
            runs[reader].append(ingest(folder, reader))
            print(reader, runs[reader][-1], flush=True)
    median = {r: statistics.median(x["seconds"] for x in runs[r]) for r in READERS}
    from evsel.evaluation.report import run_info

    result = {"run": run_info(["python", "bench/pdf_reader.py", *sys.argv[1:]]), "files": len(list(folder.glob("*.pdf"))),
              "runs": runs, "median_seconds": median, "tables_over_plain": median["tables"] / median["plain"],
              "finder_over_plain": median["finder"] / median["plain"]}
    write_result(args.out, result)
    print(json.dumps({"median_seconds": median, "tables_over_plain": result["tables_over_plain"],
                      "finder_over_plain": result["finder_over_plain"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
