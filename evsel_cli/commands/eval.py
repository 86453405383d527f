from __future__ import annotations

import sys
from pathlib import Path

import click

from evsel.chunker import DEFAULT_CHUNK_TOKENS
from evsel.errors import EvselError
from evsel.output import ProgressView, print_json, stderr, stdout, warning

from .common import engine_from, json_option

DATASETS = "locomo, fairytaleqa, musique, hotpotqa, mmlongbench, financebench, nocha, or a .jsonl file"


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{what} must be comma-separated integers, e.g. 1,3,5,10") from None
    if not values or any(v < 1 for v in values):
        raise click.BadParameter(f"{what} must be positive integers, e.g. 1,3,5,10")
    return values


@click.command("eval")
@click.argument("dataset")
@click.option("--methods", default="bm25,dense,random", show_default=True, metavar="LIST",
              help="Comma-separated methods: any selector (bm25, dense, random, ...), rrf:OTHER (BM25 fused "
                   "with OTHER), FIRST>RERANKER, or full (whole document to the generator; needs --generate).")
@click.option("--k", "ks", default="1,3,5,10", show_default=True, metavar="LIST",
              help="Cut-offs for recall@k.")
@click.option("--generate", is_flag=True, help="Also answer each question with the backbone and score the answers.")
@click.option("--limit", type=int, default=None, metavar="N",
              help="Evaluate N questions, evenly spaced over the dataset.")
@click.option("--split", default=None, metavar="NAME", help="FairytaleQA split: val (default) or train.")
@click.option("--concat", type=int, default=0, show_default=True, metavar="N",
              help="FairytaleQA: join every N stories into one long document (0: each story alone).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None, envvar="EVSEL_DATA",
              help="Folder with the benchmark data (env EVSEL_DATA; default ../shared/data beside the checkout).")
@click.option("--top-n", type=int, default=5, show_default=True, help="Passages given to the generator.")
@click.option("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS, show_default=True,
              help="Target chunk size in backbone tokens.")
@click.option("--max-new-tokens", type=int, default=32, show_default=True, help="Longest answer, in tokens.")
@click.option("--per-question", is_flag=True, help="Include every question's record in the --json output.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE.png", help="Write a recall@k chart comparing the methods.")
@json_option
@click.pass_context
def eval_command(ctx, dataset, methods, ks, generate, limit, split, concat, data_dir, top_n, chunk_tokens,
                 max_new_tokens, per_question, plot_path, as_json):
    """Measure evidence selection (and answers) on a benchmark, every method on the same chunks.

    DATASET is one of: locomo, fairytaleqa, musique, hotpotqa, mmlongbench, financebench, nocha
    (read from --data-dir), or a .jsonl file of your own, one object a line: {"question": ...,
    "answer": ... or [...], "document": PATH or "documents": [PATH, ...] (relative to the file),
    "evidence": [TEXT, ...] and/or "evidence_spans": [{"document": PATH, "start": N, "end": N}]}.
    Documents are chunked in memory exactly as ingest does; the store is not touched. Reports recall@k (share of gold evidence found in the top k),
    all@k (every piece found), MRR and per-stage latency; with --generate, answer EM/F1 (SQuAD
    normalisation), LoCoMo's F1 and NoCha's pair accuracy.
    """
    from evsel.evaluation import EvalConfig, load_dataset, run
    from evsel.evaluation.report import plot, run_info, tables

    method_list = [m.strip() for m in methods.split(",") if m.strip()]
    if not method_list:
        raise EvselError("--methods is empty", "e.g. --methods bm25,dense,random")
    if top_n < 1:
        raise EvselError(f"--top-n {top_n} must be at least 1")
    if chunk_tokens < 16:
        raise EvselError(f"--chunk-tokens {chunk_tokens} is too small", "use 16 or more (default 140)")
    config = EvalConfig(methods=method_list, ks=_int_list(ks, "--k"), generate=generate, limit=limit, top_n=top_n,
                        chunk_tokens=chunk_tokens, max_new_tokens=max_new_tokens, per_question=per_question)
    data = load_dataset(dataset, data_dir, split=split, concat=concat)
    engine = engine_from(ctx)
    with ProgressView(enabled=not as_json) as view:
        result = run(data, config, engine, on_event=view)
    result["run"] = run_info(["evsel", *sys.argv[1:]] if sys.argv and "evsel" in Path(sys.argv[0]).name else None)
    if plot_path is not None:
        if plot(result, plot_path):
            result["plot"] = str(plot_path)
        else:
            warning(f"no plot written to {plot_path}: no method has evidence recall here (no gold evidence)")
    if as_json:
        print_json(result)
        return
    for table in tables(result):
        stdout.print(table)
    for note in result["dataset"]["notes"]:
        stderr.print(f"[dim]note: {note}[/]")
    if "plot" in result:
        stderr.print(f"wrote {plot_path}")
