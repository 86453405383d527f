# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

import typer

from evsel.commands.output import escape, print_json, stderr, stdout
from evsel.requests import DocsListRequest, DocsRmRequest, DocsShowRequest

from . import replies
from .base import App
from .common import JsonOption, engine_from
from .options import with_request

app = App(help="List, inspect and remove ingested documents.")


@app.command("list")
@with_request(DocsListRequest)
def docs_list(ctx: typer.Context, request: DocsListRequest, as_json: JsonOption = False):
    """List documents: id, collection, kind, title, chunks."""
    replies.docs_list(engine_from(ctx), request, as_json)


@app.command("show")
@with_request(DocsShowRequest)
def docs_show(ctx: typer.Context, request: DocsShowRequest, as_json: JsonOption = False):
    """Show one document's details (and its chunks with --chunks)."""
    doc = engine_from(ctx).docs_show(request.doc_id, request.with_chunks)
    _mark_table_chunks(doc)
    labels = doc["metadata"].get("page_labels")
    if isinstance(labels, dict):  # the store keeps them in string order ('1', '10', '2')
        doc["metadata"]["page_labels"] = dict(sorted(labels.items(), key=lambda kv: _page_number(kv[0])))
    if as_json:
        print_json(doc)
        return
    shown = dict(doc, path=doc["path"] + (f"#{doc['part']}" if doc["part"] else ""))
    for key in ("id", "collection", "title", "kind", "path", "sha256", "n_chars", "n_chunks", "n_tokens"):
        stdout.print(f"[bold]{key}:[/] {escape(str(shown[key]))}")
    for key, value in sorted(doc["metadata"].items()):
        if key in _INTERNAL_METADATA or value in ("", None, [], {}):
            continue
        if key == "page_labels":
            value = ", ".join(f"{page}={label}" for page, label in value.items())
        elif key == "tables" and isinstance(value, list):
            value = f"{len(value)} on {len({t.get('page') for t in value})} page(s), read as rows with their headers"
        elif key == "dropped_lines" and isinstance(value, dict):
            value = (f"{value.get('count')} running header/footer/page-number line(s) left out: "
                     + "; ".join(map(str, value.get("lines", []))))
        elif key == "pages_read_as_text" and isinstance(value, dict):
            value = (f"page(s) {', '.join(map(str, value.get('pages', [])))} read as plain text: their tables "
                     f"took over {value.get('seconds')} s to read")
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        stdout.print(f"[bold]{key}:[/] {escape(str(value))}")
    for chunk in doc.get("chunks", []):
        where = []
        if chunk.get("table"):
            where.append(f"table on page {chunk['table']['page']}")
        elif chunk["page_start"] is not None:
            where.append(f"pages {chunk['page_start']}-{chunk['page_end']}")
        if chunk["session"]:
            where.append(f"session {chunk['session']}")
        if chunk["turn_ids"]:
            where.append(f"turns {chunk['turn_ids'][0]}-{chunk['turn_ids'][-1]}")
        stdout.print(f"\n[cyan]chunk {chunk['seq']}[/] [dim]{chunk['n_tokens']} tokens, chars "
                     f"{chunk['char_start']}-{chunk['char_end']} {' '.join(where)}[/]")
        stdout.print(escape(" ".join(chunk["text"].split())))


def _mark_table_chunks(doc: dict) -> None:
    """A chunk made of a PDF table's rows gets `table` (page, box, caption): its text is the rows
    rewritten with their headers, its offsets the rows as printed on that page."""
    tables = doc["metadata"].get("tables")
    if not isinstance(tables, list):
        return
    for chunk in doc.get("chunks", []):
        for table in tables:
            if table["char_start"] <= chunk["char_start"] and chunk["char_end"] <= table["char_end"]:
                chunk["table"] = {k: table[k] for k in ("page", "bbox", "caption")}
                break


# what ingest records to tell a changed setting from an unchanged file (kept in --json)
_INTERNAL_METADATA = ("chunker", "kind_arg", "reader")


def _page_number(page: str) -> tuple:
    return (0, int(page), "") if page.isdigit() else (1, 0, page)


@app.command("rm")
@with_request(DocsRmRequest)
def docs_rm(ctx: typer.Context, request: DocsRmRequest, as_json: JsonOption = False):
    """Remove documents and their chunks. Nothing is removed if any ID is unknown."""
    removed = engine_from(ctx).docs_rm(request.doc_ids)
    if as_json:
        print_json(removed)
        return
    for r in removed:
        stderr.print(f"removed {r['id']}: {escape(r['title'])}")
