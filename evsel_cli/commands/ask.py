from __future__ import annotations

import click
from rich.markup import escape

from evsel.answer import describe
from evsel.models.selectors import HELP as SELECTORS_HELP
from evsel.output import ProgressView, print_json, stdout
from evsel.store import ChunkRecord

from .common import collection_option, engine_from, json_option


@click.command()
@click.argument("question")
@click.option("--doc", "doc_ids", type=int, multiple=True, metavar="ID",
              help="Ask about this document only (repeatable). See: evsel docs list.")
@collection_option
@click.option("--top-n", type=int, default=5, show_default=True, help="How many evidence passages to use.")
@click.option("--select", default="bm25", show_default=True, metavar="METHOD",
              help="Evidence selector: " + SELECTORS_HELP + ".")
@click.option("--evidence-only", is_flag=True, help="Print the evidence without generating an answer.")
@click.option("--max-new-tokens", type=int, default=96, show_default=True, help="Longest answer, in tokens.")
@json_option
@click.pass_context
def ask(ctx, question, doc_ids, collection, top_n, select, evidence_only, max_new_tokens, as_json):
    """Answer QUESTION from the ingested documents, citing the evidence used.

    The selector picks the top-n passages; they go to the LLM in document order and it answers.
    Prints the answer, then each passage with its title, page or speaker/session/time, and score.
    """
    engine = engine_from(ctx)
    with ProgressView(enabled=not as_json) as view:
        result = engine.ask(question, doc_ids=list(doc_ids) or None, collection=collection, top_n=top_n,
                            select=select, evidence_only=evidence_only, max_new_tokens=max_new_tokens,
                            on_event=view)
    if as_json:
        print_json(result)
        return
    if result["answer"] is not None:
        stdout.print(f"[bold]Answer:[/] {escape(result['answer'])}\n")
    stdout.print(f"[bold]Evidence[/] ({result['method']['select']}, {len(result['evidence'])} of "
                 f"{result['method']['candidates']} passages, in document order):")
    for item in result["evidence"]:
        chunk = ChunkRecord(id=item["chunk_id"], doc_id=item["doc_id"], seq=item["seq"], text=item["text"],
                            content_hash="", n_tokens=0, char_start=item["char_start"], char_end=item["char_end"],
                            page_start=item["page_start"], page_end=item["page_end"], session=item["session"],
                            time_start=item["time_start"], title=item["title"])
        where = describe(chunk)
        if item["speakers"]:
            where += f"; speakers: {', '.join(item['speakers'])}"
        if item["turn_ids"]:
            turns = item["turn_ids"]
            where += f"; turns {turns[0]}" + (f"-{turns[-1]}" if len(turns) > 1 else "")
        stdout.print(f"\n[cyan]#{item['rank']}[/] [dim]score {item['score']:.3f} | doc {item['doc_id']} | "
                     f"chars {item['char_start']}-{item['char_end']}[/]\n[bold]{escape(where)}[/]")
        stdout.print(escape(" ".join(item["text"].split())))
