"""What `evsel ask` and `evsel docs list` do once their options are read: send the request to the
engine (the daemon's client or an in-process one) and print the reply. No Typer and no rich here:
the Typer commands (ask.py, docs.py) and evsel.commands.forward, which sends them to a running daemon
without the Typer app, run the same code, so both print the same bytes.
"""

from __future__ import annotations

import os
import time

from evsel.commands.output import ProgressView, flat, print_json, show, show_table, stderr
from evsel.provenance import evidence_label
from evsel.requests import AskRequest, DocsListRequest

DOCS_COLUMNS = ("id", "collection", "kind", "title", "chunks", "tokens", "path")


def docs_list(engine, request: DocsListRequest, as_json: bool) -> None:
    rows = engine.docs_list(request.collection)
    if as_json:
        print_json(rows)
        return
    if not rows:
        show([("no documents yet; add some with: evsel ingest PATH", None)], stderr)
        return
    show_table(DOCS_COLUMNS, [[str(r["id"]), r["collection"], r["kind"], r["title"], str(r["n_chunks"]),
                               str(r["n_tokens"]), r["path"] + (f"#{r['part']}" if r["part"] else "")] for r in rows])


def ask(engine, request: AskRequest, as_json: bool) -> None:
    """Send the ask to the engine, print the answer and evidence."""
    with ProgressView() as view:  # progress goes to stderr whatever stdout carries (--json too)
        result = engine.ask(request, on_event=view)
    for number, item in enumerate(result["evidence"], 1):
        item["passage"] = number  # the number the human display shows and grounding.span.passage cites
    result["timings"] = wall_timings(engine, result.get("timings") or {})
    if as_json:
        print_json(result)
        return
    grounding = result.get("grounding") or {}
    span = grounding.get("span")
    if result["answer"] is not None:
        kind = f"{grounding['answer_type']}, " if grounding.get("answer_type") else ""
        cited = [(" ", None), (f"({kind}passage #{span['passage']})", "dim")] if span else []
        # a PDF's answer keeps its page's line breaks: shown on one line, like the passages
        show([("Answer:", "bold"), (f" {flat(result['answer'])}", None), *cited, ("\n", None)])
    elif grounding.get("kind") == "abstained":
        show([("Answer:", "bold"), (f" none: {grounding['reason']}", None), ("\n", None)])
    method = result["method"]["select"] + (f" > {result['method']['rerank']}" if result["method"].get("rerank") else "")
    selected = sum(not item.get("beside") for item in result["evidence"])
    read_beside = " and the passage beside them that holds the answer" if selected < len(result["evidence"]) else ""
    show([("Evidence", "bold"), (f" ({method}, {selected} of {result['method']['candidates']} "
                                 f"passages{read_beside}, in document order):", None)])
    waiting = (result["method"].get("signals") or {}).get("waiting")
    if waiting:
        show([(f"Ranked by {'+'.join(result['method']['signals']['ran'])} while the background encode runs "
               f"({'; '.join(f'{group}: {done}' for group, done in waiting.items())}); the rest join when it "
               "finishes (evsel daemon status).", "dim")])
    if result.get("memory"):
        read = "; ".join(m["label"] + (" of " + m["title"] if m.get("title") else "") for m in result["memory"])
        show([("Memory", "bold"), (f" (summaries the reranker read): {read}", None)])
    for number, item in enumerate(result["evidence"], 1):
        show([("\n", None), (f"#{number}", "cyan"), (" ", None),
              ("read beside the selected passages" if item.get("beside") else
               f"rank {item['rank']} | score {item['score']:.3f}", "dim"),
              (f" | doc {item['doc_id']} | chars "
               f"{item['char_start']}-{item['char_end']}", "dim"), ("\n", None), (evidence_label(item), "bold")])
        show(_highlighted(item["text"], span if span and span["passage"] == number else None))


def _highlighted(text: str, span: dict | None) -> list[tuple[str, str | None]]:
    """The passage on one line, the answer's span underlined and bold."""
    if span is None:
        return [(flat(text), None)]
    before, inside, after = text[: span["start"]], text[span["start"]: span["end"]], text[span["end"]:]
    parts = [flat(part) for part in (before, inside, after)]
    pad = [" " if before[-1:].isspace() else "", " " if after[:1].isspace() else ""]
    return [(parts[0], None), (pad[0], None), (parts[1], "bold underline"), (pad[1], None), (parts[2], None)]


_COMMAND_STARTED = time.perf_counter()  # when this module was imported: the fallback for process_seconds


def process_seconds() -> float:
    """Wall time since this process started (interpreter start-up, imports, connecting to or
    starting the daemon, its queue, the work and the reply): the time a user waited."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in ticks after boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.perf_counter() - _COMMAND_STARTED


def wall_timings(engine, timings: dict) -> dict:
    """A result's engine timings with the wall time the client saw: `queued_s` (the daemon's queue;
    0 in-process), `run_s` (the daemon ran the request), `engine_s` (the engine's own total) and
    `total_s`, this process's whole wall time."""
    meta = getattr(engine, "last_meta", None) or {}
    out = dict(timings)
    if "total_s" in out:
        out["engine_s"] = out.pop("total_s")
    out["queued_s"] = round(float(meta.get("queue_s", 0.0)), 4)
    if "run_s" in meta:
        out["run_s"] = round(float(meta["run_s"]), 4)
    out["total_s"] = round(process_seconds(), 4)
    return out
