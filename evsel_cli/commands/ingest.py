# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

import typer

from evsel.commands.output import ProgressView, escape, print_json, stdout
from evsel.requests import IngestRequest, fields_of

from .base import path
from .common import JsonOption, engine_from
from .options import with_request


@with_request(IngestRequest, targets={"parser": path()})
def ingest(ctx: typer.Context, request: IngestRequest, as_json: JsonOption = False):
    """Add books, PDFs and dialogues to the store.

    PATHS are files or directories (searched recursively for .txt, .md, .epub, .pdf, .json and
    .jsonl). An unchanged file is skipped; a changed one replaces its old version. A file that
    fails is reported on stderr and the others are still ingested; the exit code is 1 if any failed.
    A PDF is read as a reader sees it: two-column pages in column order, running headers, footers
    and page numbers left out, each table as chunks of rows that name their columns (env
    EVSEL_PDF_READER=plain reads each page's text as extracted instead).
    """
    engine = engine_from(ctx)  # --encode unset (None): the engine applies EVSEL_ENCODE, from the same settings
    with ProgressView() as view:
        results = engine.ingest(**fields_of(request), on_event=view)
    failed = [r for r in results if r["status"] == "failed"]
    if as_json:
        print_json({"files": results, "failed": len(failed)})
    else:
        for r in results:
            if r["status"] == "ingested":
                later = [w for w, key in (("chunk states", "states"), ("summaries", "summaries"))
                         if r.get(key) == "background"]
                later = f"; {' and '.join(later)} are computed in the background: until they are, asks rank " \
                        "with what is ready (evsel daemon status shows the time left)" if later else ""
                # the summary is the command's result: stdout, as the README says results go
                stdout.print(f"ingested {escape(r['path'])}: {len(r['doc_ids'])} document(s), {r['chunks']} chunks "
                             f"in {r['seconds']:.1f}s (id {', '.join(map(str, r['doc_ids']))}){later}", emoji=False)
            elif r["status"] == "unchanged":
                stdout.print(f"unchanged {escape(r['path'])} (id {', '.join(map(str, r['doc_ids']))})", emoji=False)
    if failed:
        ctx.exit(1)
