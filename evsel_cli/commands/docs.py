from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from evsel.output import print_json, stderr, stdout

from .common import collection_option, engine_from, json_option


@click.group()
def docs():
    """List, inspect and remove ingested documents."""


@docs.command("list")
@collection_option
@json_option
@click.pass_context
def docs_list(ctx, collection, as_json):
    """List documents: id, collection, kind, title, chunks."""
    rows = engine_from(ctx).docs_list(collection)
    if as_json:
        print_json(rows)
        return
    if not rows:
        stderr.print("no documents yet; add some with: evsel ingest PATH")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("id", "collection", "kind", "title", "chunks", "tokens", "path"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(str(r["id"]), r["collection"], r["kind"], escape(r["title"]), str(r["n_chunks"]),
                      str(r["n_tokens"]), escape(r["path"] + (f"#{r['part']}" if r["part"] else "")))
    # on a pipe there is no width to fit: keep each document on one line for grep and friends
    console = stdout if stdout.is_terminal else Console(width=100_000, highlight=False)
    console.print(table)


@docs.command("show")
@click.argument("doc_id", type=int, metavar="ID")
@click.option("--chunks", "with_chunks", is_flag=True, help="Include every chunk with its provenance.")
@json_option
@click.pass_context
def docs_show(ctx, doc_id, with_chunks, as_json):
    """Show one document's details (and its chunks with --chunks)."""
    doc = engine_from(ctx).docs_show(doc_id, with_chunks)
    if as_json:
        print_json(doc)
        return
    for key in ("id", "collection", "title", "kind", "path", "part", "sha256", "n_chars", "n_chunks", "n_tokens"):
        stdout.print(f"[bold]{key}:[/] {escape(str(doc[key]))}")
    for key, value in sorted(doc["metadata"].items()):
        stdout.print(f"[bold]{key}:[/] {escape(str(value))}")
    for chunk in doc.get("chunks", []):
        where = []
        if chunk["page_start"] is not None:
            where.append(f"pages {chunk['page_start']}-{chunk['page_end']}")
        if chunk["session"]:
            where.append(f"session {chunk['session']}")
        if chunk["turn_ids"]:
            where.append(f"turns {chunk['turn_ids'][0]}-{chunk['turn_ids'][-1]}")
        stdout.print(f"\n[cyan]chunk {chunk['seq']}[/] [dim]{chunk['n_tokens']} tokens, chars "
                     f"{chunk['char_start']}-{chunk['char_end']} {' '.join(where)}[/]")
        stdout.print(escape(" ".join(chunk["text"].split())))


@docs.command("rm")
@click.argument("doc_ids", type=int, nargs=-1, required=True, metavar="ID...")
@json_option
@click.pass_context
def docs_rm(ctx, doc_ids, as_json):
    """Remove documents and their chunks. Nothing is removed if any ID is unknown."""
    removed = engine_from(ctx).docs_rm(list(doc_ids))
    if as_json:
        print_json(removed)
        return
    for r in removed:
        stderr.print(f"removed {r['id']}: {escape(r['title'])}")
