# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

from typing import Annotated, Optional

import typer

from evsel import requests
from evsel.requests import AskRequest, Output

from . import replies
from .common import engine_from
from .options import declared, with_request


def _list_methods(ctx: typer.Context, value: bool) -> None:
    """Every --select/--rerank method with its variants (the selector registry's listing); --help
    names only the methods."""
    if not value or ctx.resilient_parsing:
        return
    methods = requests.methods()
    width = max(len(name) for name, _ in methods)
    for name, what in methods:
        typer.echo(f"{name.ljust(width)}  {what}")
    ctx.exit()


@with_request(AskRequest)
def ask(
    ctx: typer.Context,
    request: AskRequest,
    as_json: Annotated[bool, declared(Output, "as_json")] = False,
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
    replies.ask(engine_from(ctx), request, as_json)
