# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

from typing import Annotated, List, Optional

import typer

from evsel import api
from evsel.defaults import DEFAULT_SELECT, RERANK_TOP, STYLES

from . import replies
from .base import INT, choice
from .common import CollectionOption, JsonOption, engine_from


def _list_methods(ctx: typer.Context, value: bool) -> None:
    """Every --select/--rerank method with its variants (the selector registry's listing); --help
    names only the methods."""
    if not value or ctx.resilient_parsing:
        return
    methods = api.methods()
    width = max(len(name) for name, _ in methods)
    for name, what in methods:
        typer.echo(f"{name.ljust(width)}  {what}")
    ctx.exit()


SELECT_HELP = api.select_help()


def ask(
    ctx: typer.Context,
    question: Annotated[str, typer.Argument()],
    doc_ids: Annotated[Optional[List[int]], typer.Option(
        "--doc", metavar="ID", parser=INT,
        help="Ask about this document only (repeatable). See: evsel docs list.")] = None,
    collection: CollectionOption = None,
    top_n: Annotated[int, typer.Option("--top-n", parser=INT, help="How many evidence passages to use.")] = 5,
    select: Annotated[str, typer.Option("--select", metavar="METHOD",
                                        help=SELECT_HELP)] = DEFAULT_SELECT,
    rerank: Annotated[Optional[str], typer.Option(
        "--rerank", metavar="METHOD",
        help="Rerank the first stage's top candidates with this selector (any --select method).")] = None,
    rerank_top: Annotated[int, typer.Option("--rerank-top", metavar="N", parser=INT,
                                            help="How many first-stage candidates the reranker re-scores.")] = RERANK_TOP,
    memory: Annotated[bool, typer.Option(
        "--memory", help="With --rerank qrranker: give the reranker the summaries of the blocks (or dialogue "
                         "sessions) holding its candidates, up to 512 tokens; missing ones are written first "
                         "(see ingest --summaries).")] = False,
    evidence_only: Annotated[bool, typer.Option(
        "--evidence-only", help="Print the evidence without generating an answer.")] = False,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", parser=INT,
                                                help="Longest answer, in tokens.")] = 96,
    style: Annotated[str, typer.Option(
        "--style", parser=choice(list(STYLES)),
        help="short: a short answer grounded in one evidence sentence, or none when the evidence does not "
             "support one; span: always the exact evidence text; sentence: free-form from all passages.")] = "short",
    corpus: Annotated[Optional[str], typer.Option(
        "--corpus", metavar="DIR",
        help="Ask a corpus built by evsel corpus build instead of the local store: its full-text and "
             "vector indexes give the first stage (--select bm25, dense or unreal); reranking and the "
             "answer run here.")] = None,
    as_json: JsonOption = False,
    list_methods: Annotated[Optional[bool], typer.Option(
        "--list-methods", callback=_list_methods, is_eager=True, expose_value=False,
        help="List every --select/--rerank method with its variants, and exit.")] = None,
):
    """Answer QUESTION from the ingested documents, citing the evidence used.

    The selector picks the top-n passages. By default the reader, a small trained head on the
    LLM's own states, finds the answer's exact words across them (a book's or PDF's passages read
    with the text beside them in their section) and the answer is tied to that span
    (highlighted in its passage; offsets in --json); it says so instead of answering when the
    evidence does not support an answer. Then each passage, numbered in the order shown (the
    number --json gives as grounding.span.passage and evidence[].passage), with its title, page or
    speaker/session/time, rank and score; a passage read beside them that holds the answer is
    shown too, marked so (--json: "beside": true).

    With no --select the method is `default`, chosen per kind of document by a paired test on
    held-out questions and checked where no fit looked: for chats and for books the learned fusion
    of BM25, dense, UNREAL and QRRanker's QR heads (hybrid, weights fitted per kind: recall@3 +5.5
    points over BM25 on LoCoMo, +4.6 on FairytaleQA val, above dense on MuSiQue and HotpotQA; a warm
    ask 1.5x a BM25 one); for PDFs BM25 (the fusion is not yet tested on enough of them). `evsel
    models info` names each and why; docs/FUSION.md has the measurements. A model without a trained
    fusion uses BM25.
    """
    replies.ask(engine_from(ctx), question, as_json, doc_ids=list(doc_ids or ()) or None, collection=collection,
                top_n=top_n, select=select, rerank=rerank, rerank_top=rerank_top, evidence_only=evidence_only,
                max_new_tokens=max_new_tokens, style=style, memory=memory, corpus=corpus)
