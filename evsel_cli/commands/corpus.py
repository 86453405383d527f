# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

from typing import Annotated, Optional

import typer

from evsel.commands.output import print_json, stderr, stdout
from evsel.requests import CorpusAddRequest, CorpusRmRequest, IngestRequest

from .base import FLOAT, INT, App, path
from .common import JsonOption, engine_from, settings
from .options import declared, with_request

app = App(help="A corpus index past one machine (pip install 'evsel[scale]'): built on a Ray cluster into Lance.")

SCALE_HINT = "install the extra: pip install 'evsel[scale]'"


def require_scale() -> None:
    """Exit with one line when the `scale` extra is not installed."""
    import importlib

    missing = []
    for name in ("pyarrow", "lance", "lance_ray", "ray"):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        from evsel.errors import EvselError

        raise EvselError(f"evsel corpus needs {', '.join(missing)}", SCALE_HINT)


@app.command("build")
def corpus_build(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(parser=path(), metavar="SOURCE")],
    out: Annotated[str, typer.Option("--out", metavar="DIR", help="The corpus directory (new, or one to resume).")],
    address: Annotated[Optional[str], typer.Option(
        "--address", metavar="RAY_ADDRESS",
        help="A running Ray cluster (HOST:PORT of its head); default: a local Ray instance of its own.")] = None,
    # a corpus's chunks are those of a local ingest
    chunk_tokens: Annotated[int, declared(IngestRequest, "chunk_tokens")] = IngestRequest.chunk_tokens,
    states: Annotated[str, typer.Option(
        "--states", metavar="LIST",
        help="Per-chunk states to compute: dense, unreal (comma-separated; 'none' for BM25 only). UNREAL's "
             "need the adapter of the backbone.")] = "dense,unreal",
    workers: Annotated[Optional[int], typer.Option(
        "--workers", parser=INT, metavar="N", help="Model-holding workers (default: one per Ray node).")] = None,
    batch_docs: Annotated[int, typer.Option("--batch-docs", parser=INT, metavar="N",
                                            help="Documents a worker parses and encodes per call.")] = 4,
    commit_every: Annotated[float, typer.Option(
        "--commit-every", metavar="SECONDS", parser=FLOAT,
        help="How often finished documents are committed: the most work an interrupt loses.")] = 5.0,
    as_json: JsonOption = False,
):
    """Build a corpus from SOURCE on a Ray cluster: chunks, BM25 terms and statistics, dense and
    UNREAL states in DIR/chunks.lance, with a full-text and a vector index.

    SOURCE is a folder of files (what evsel ingest reads) or a JSONL file of documents, one
    {"id": ..., "text": ..., "title": ...} a line. Chunks and their content hashes are those of a
    local evsel ingest. Interrupted (Ctrl-C, a crash), the same command resumes without
    duplicates; a worker that dies is restarted and its documents redone. Progress goes to stderr.
    A file that fails is reported on stderr and the others are built; the exit code is then 1.
    """
    import os

    # read once, when ray.data is first imported (lance_ray imports it): Ray's notices are not this command's output
    os.environ.setdefault("RAY_DATA_LOG_LEVEL", "ERROR")
    from evsel.corpus.build import build, prepare_local_ray

    if not address:
        prepare_local_ray()  # before ray is imported: the local instance listens on loopback only
    require_scale()

    chosen = [s.strip() for s in states.split(",") if s.strip() and s.strip() != "none"]
    manifest = build(source, out, address=address, chunk_tokens=chunk_tokens, states=chosen, workers=workers,
                     batch_docs=batch_docs, commit_every_s=commit_every, settings=settings(ctx))
    if as_json:
        print_json(manifest)
    else:
        stderr.print(f"built {out}: {manifest['n_docs']} documents, {manifest['n_chunks']} chunks; "
                     f"states: {', '.join(m for m in manifest['methods'] if m != 'bm25') or 'none'}",
                     emoji=False, highlight=False, markup=False)
    if manifest.get("failed"):
        ctx.exit(1)


@app.command("add")
@with_request(CorpusAddRequest)
def corpus_add(ctx: typer.Context, request: CorpusAddRequest, as_json: JsonOption = False):
    """Append documents to a corpus without rebuilding it: parsed, chunked and encoded as the
    build does (the same backbone, states and chunk size), folded into its indexes and BM25
    statistics. A file whose bytes are in the corpus already is left as it is; a file stored
    under the same path with other bytes is replaced."""
    from evsel.corpus.query import require_extra

    require_extra()
    from evsel.commands.output import ProgressView

    engine = engine_from(ctx)
    with ProgressView() as view:  # progress on stderr, --json or not
        result = engine.corpus_add(request.corpus, request.targets, on_event=view)
    if as_json:
        print_json(result)
    else:
        for item in result["files"]:
            if item["status"] == "failed":
                stderr.print(f"evsel: {item['path']}: {item['error']['message']}", emoji=False, highlight=False,
                             markup=False)
            else:
                stdout.print(f"{item['status']}: {item['path']}" + (f" ({item['chunks']} chunks, "
                             f"{item['sha256'][:12]})" if item["status"] == "added" else ""),
                             emoji=False, highlight=False, markup=False)
        stdout.print(f"{result['corpus']}: {result['n_docs']} documents, {result['n_chunks']} chunks",
                     emoji=False, highlight=False, markup=False)
    if any(item["status"] == "failed" for item in result["files"]):
        ctx.exit(1)


@app.command("rm")
@with_request(CorpusRmRequest)
def corpus_rm(ctx: typer.Context, request: CorpusRmRequest, as_json: JsonOption = False):
    """Delete documents from a corpus without rebuilding it; its BM25 statistics follow. Nothing
    is deleted when one of the names matches no document."""
    from evsel.corpus.query import require_extra

    require_extra()
    result = engine_from(ctx).corpus_rm(request.corpus, request.docs)
    if as_json:
        print_json(result)
        return
    for item in result["removed"]:
        stdout.print(f"removed: {item['path']} ({item['chunks']} chunks, {item['sha256'][:12]})",
                     emoji=False, highlight=False, markup=False)
    stdout.print(f"{result['corpus']}: {result['n_docs']} documents, {result['n_chunks']} chunks",
                 emoji=False, highlight=False, markup=False)
