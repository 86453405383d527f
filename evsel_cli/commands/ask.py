from __future__ import annotations

from typing import Annotated, List, Optional

import typer
from rich.markup import escape

from evsel.engine import RERANK_TOP, SELECTORS_HELP, evidence_label
from evsel.output import ProgressView, print_json, stdout

from .base import INT
from .common import CollectionOption, JsonOption, engine_from


def ask(
    ctx: typer.Context,
    question: Annotated[str, typer.Argument()],
    doc_ids: Annotated[Optional[List[int]], typer.Option(
        "--doc", metavar="ID", parser=INT,
        help="Ask about this document only (repeatable). See: evsel docs list.")] = None,
    collection: CollectionOption = None,
    top_n: Annotated[int, typer.Option("--top-n", parser=INT, help="How many evidence passages to use.")] = 5,
    select: Annotated[str, typer.Option("--select", metavar="METHOD",
                                        help="Evidence selector: " + SELECTORS_HELP + ".")] = "bm25",
    rerank: Annotated[Optional[str], typer.Option(
        "--rerank", metavar="METHOD",
        help="Rerank the first stage's top candidates with this selector (any --select method).")] = None,
    rerank_top: Annotated[int, typer.Option("--rerank-top", metavar="N", parser=INT,
                                            help="How many first-stage candidates the reranker re-scores.")] = RERANK_TOP,
    evidence_only: Annotated[bool, typer.Option(
        "--evidence-only", help="Print the evidence without generating an answer.")] = False,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", parser=INT,
                                                help="Longest answer, in tokens.")] = 96,
    as_json: JsonOption = False,
):
    """Answer QUESTION from the ingested documents, citing the evidence used.

    The selector picks the top-n passages; they go to the LLM in document order and it answers.
    Prints the answer, then each passage with its title, page or speaker/session/time, and score.
    """
    engine = engine_from(ctx)
    with ProgressView(enabled=not as_json) as view:
        result = engine.ask(question, doc_ids=list(doc_ids or ()) or None, collection=collection, top_n=top_n,
                            select=select, rerank=rerank, rerank_top=rerank_top, evidence_only=evidence_only,
                            max_new_tokens=max_new_tokens, on_event=view)
    if as_json:
        print_json(result)
        return
    if result["answer"] is not None:
        stdout.print(f"[bold]Answer:[/] {escape(result['answer'])}\n")
    method = result["method"]["select"] + (f" > {result['method']['rerank']}" if result["method"].get("rerank") else "")
    stdout.print(f"[bold]Evidence[/] ({method}, {len(result['evidence'])} of "
                 f"{result['method']['candidates']} passages, in document order):")
    for item in result["evidence"]:
        where = evidence_label(item)
        stdout.print(f"\n[cyan]#{item['rank']}[/] [dim]score {item['score']:.3f} | doc {item['doc_id']} | "
                     f"chars {item['char_start']}-{item['char_end']}[/]\n[bold]{escape(where)}[/]")
        stdout.print(escape(" ".join(item["text"].split())))
