from __future__ import annotations

import click
from rich.markup import escape

from evsel.chunker import DEFAULT_CHUNK_TOKENS
from evsel.output import ProgressView, print_json, stderr
from evsel.parsers import KINDS
from evsel.store import DEFAULT_COLLECTION

from .common import engine_from, json_option


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--collection", metavar="NAME", default=DEFAULT_COLLECTION, show_default=True,
              help="Collection to add the documents to.")
@click.option("--kind", type=click.Choice(KINDS), default="auto", show_default=True,
              help="How to read the files: auto picks by extension and content.")
@click.option("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS, show_default=True,
              help="Target chunk size in backbone tokens.")
@click.option("--encode/--no-encode", default=None,
              help="Compute the chunks' UNREAL states now, so the first ask needs no encoding "
                   "(default: on; env EVSEL_ENCODE=0 turns it off).")
@json_option
@click.pass_context
def ingest(ctx, paths, collection, kind, chunk_tokens, encode, as_json):
    """Add books, PDFs and dialogues to the store.

    PATHS are files or directories (searched recursively for .txt, .md, .epub, .pdf, .json and
    .jsonl). An unchanged file is skipped; a changed one replaces its old version. A file that
    fails is reported on stderr and the others are still ingested; the exit code is 1 if any failed.
    """
    engine = engine_from(ctx)
    with ProgressView() as view:
        if encode is None:  # decided here, where the user's environment is, not in the daemon
            import os

            encode = os.environ.get("EVSEL_ENCODE", "1").strip().lower() not in ("0", "false", "no", "off")
        results = engine.ingest(list(paths), collection=collection, kind=kind, chunk_tokens=chunk_tokens,
                                on_event=view, encode=encode)
    failed = [r for r in results if r["status"] == "failed"]
    if as_json:
        print_json({"files": results, "failed": len(failed)})
    else:
        for r in results:
            if r["status"] == "ingested":
                stderr.print(f"ingested {escape(r['path'])}: {len(r['doc_ids'])} document(s), {r['chunks']} chunks "
                             f"in {r['seconds']:.1f}s (id {', '.join(map(str, r['doc_ids']))})", emoji=False)
            elif r["status"] == "unchanged":
                stderr.print(f"unchanged {escape(r['path'])} (id {', '.join(map(str, r['doc_ids']))})", emoji=False)
    if failed:
        ctx.exit(1)
