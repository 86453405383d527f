# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from evsel.defaults import DATASETS as DATASET_NAMES
from evsel.defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_METHODS, RERANK_TOP, STYLES
from evsel.errors import EvselError, InputError
from evsel.output import ProgressView, print_json, stderr, stdout, warning

from .base import INT, choice, path
from .common import JsonOption, engine_from

DATASETS = "locomo, fairytaleqa, musique, hotpotqa, mmlongbench, financebench, nocha, or a .jsonl file"


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated integers, e.g. 1,3,5,10") from None
    if not values or any(v < 1 for v in values):
        raise typer.BadParameter(f"{what} must be positive integers, e.g. 1,3,5,10")
    return values


def eval_command(
    ctx: typer.Context,
    dataset: Annotated[str, typer.Argument()],
    methods: Annotated[str, typer.Option(
        "--methods", metavar="LIST",
        help="Comma-separated methods: any selector (bm25, dense, random, ...), rrf:OTHER (BM25 fused "
             "with OTHER), FIRST>RERANKER (e.g. bm25>qrranker, bm25>qrranker:untrained, bm25>qrranker:memory), full (whole document to the generator; needs --generate), or oracle (the gold evidence itself: "
             "what the answer step makes of perfect selection; needs --generate).")
    ] = DEFAULT_METHODS,
    ks: Annotated[str, typer.Option("--k", metavar="LIST", help="Cut-offs for recall@k.")] = "1,3,5,10",
    generate: Annotated[bool, typer.Option(
        "--generate", help="Also answer each question with the backbone and score the answers.")] = False,
    limit: Annotated[Optional[int], typer.Option(
        "--limit", metavar="N", parser=INT, help="Evaluate N questions, evenly spaced over the dataset.")] = None,
    split: Annotated[Optional[str], typer.Option(
        "--split", metavar="NAME", help="FairytaleQA split: val (default) or train.")] = None,
    concat: Annotated[int, typer.Option(
        "--concat", metavar="N", parser=INT,
        help="FairytaleQA: join every N stories into one long document (0: each story alone).")] = 0,
    fold: Annotated[Optional[int], typer.Option(
        "--fold", metavar="N", parser=INT,
        help="LoCoMo, MuSiQue, HotpotQA: only fold 1 or 2 of the fixed cross-fold split (train on one, "
             "evaluate on the other).")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(
        "--data-dir", envvar="EVSEL_DATA", show_envvar=False, parser=path(file_okay=False, path_type=Path),
        help="Folder with the benchmark data (env EVSEL_DATA; default ../shared/data beside the checkout).")
    ] = None,
    top_n: Annotated[int, typer.Option("--top-n", parser=INT, help="Passages given to the generator.")] = 5,
    rerank_top: Annotated[int, typer.Option(
        "--rerank-top", metavar="N", parser=INT,
        help="How many first-stage candidates a FIRST>RERANKER method re-scores.")] = RERANK_TOP,
    chunk_tokens: Annotated[int, typer.Option("--chunk-tokens", parser=INT,
                                              help="Target chunk size in backbone tokens.")] = DEFAULT_CHUNK_TOKENS,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", parser=INT,
                                                help="Longest answer, in tokens.")] = 32,
    answer_style: Annotated[str, typer.Option(
        "--answer-style",
        help="With --generate: the answer step, as evsel ask --style (short, rules, span, sentence); several, "
             "comma-separated, answer each method's evidence with each (rows 'METHOD [STYLE]').")] = "short",
    reader: Annotated[Optional[Path], typer.Option(
        "--reader", metavar="DIR", parser=path(file_okay=False, exists=True, path_type=Path),
        help="The reader of --answer-style short: a folder written by evsel train reader (default: the "
             "model's shipped one).")] = None,
    memory: Annotated[bool, typer.Option(
        "--memory", help="Every FIRST>qrranker method reads its candidates' summaries (as qrranker:memory); "
                         "missing summaries are written into eval's own cache first.")] = False,
    per_question: Annotated[bool, typer.Option(
        "--per-question", help="Include every question's record in the --json output.")] = False,
    plot_path: Annotated[Optional[Path], typer.Option(
        "--plot", metavar="FILE.png", parser=path(dir_okay=False, path_type=Path),
        help="Write a recall@k chart comparing the methods.")] = None,
    as_json: JsonOption = False,
):
    """Measure evidence selection (and answers) on a benchmark, every method on the same chunks.

    DATASET is one of: locomo, fairytaleqa, musique, hotpotqa, mmlongbench, financebench, nocha
    (read from --data-dir), or a .jsonl file of your own, one object a line: {"question": ...,
    "answer": ... or [...], "document": PATH or "documents": [PATH, ...] (relative to the file),
    "evidence": [TEXT, ...] and/or "evidence_spans": [{"document": PATH, "start": N, "end": N}]}.
    Documents are chunked in memory exactly as ingest does; the store is not touched. Reports recall@k (share of gold evidence found in the top k),
    all@k (every piece found), MRR and per-stage latency; with --generate, answer EM/F1 (SQuAD
    normalisation), LoCoMo's F1 and NoCha's pair accuracy.
    """
    from evsel.evaluation.report import plot, run_info, tables

    method_list = [m.strip() for m in methods.split(",") if m.strip()]
    if not method_list:
        raise EvselError("--methods is empty", f"e.g. --methods {DEFAULT_METHODS}")
    if top_n < 1:
        raise EvselError(f"--top-n {top_n} must be at least 1")
    if chunk_tokens < 16:
        raise EvselError(f"--chunk-tokens {chunk_tokens} is too small", "use 16 or more (default 140)")
    k_list = _int_list(ks, "--k")
    styles = [x.strip() for x in answer_style.split(",") if x.strip()]
    unknown = [x for x in styles if x.split("@", 1)[0] not in STYLES]
    if unknown or not styles:
        raise InputError(f"unknown answer style {', '.join(unknown) or answer_style!r}",
                         f"choose among: {', '.join(STYLES)}")
    for i, style in enumerate(styles):  # short@DIR: style short with the reader in DIR (readers compared in one run)
        if "@" in style:
            name, folder = style.split("@", 1)
            if name != "short" or not Path(folder).is_dir():
                raise InputError(f"--answer-style {style}: give short@DIR with DIR a reader's folder",
                                 "e.g. --answer-style short,short@runs/reader")
            styles[i] = f"short@{Path(folder).absolute()}"
    if not (dataset.endswith(".jsonl") or Path(dataset).is_file() or dataset in DATASET_NAMES):
        raise InputError(f"unknown dataset {dataset!r}",
                         f"choose one of: {', '.join(DATASET_NAMES)}, or give a path to a .jsonl file")
    if plot_path is not None and not plot_path.absolute().parent.is_dir():
        raise InputError(f"--plot {plot_path}: the folder {plot_path.absolute().parent} does not exist",
                         "create it first, or give a path in a folder that exists")
    if fold is not None:
        from evsel.evaluation.folds import check_fold

        check_fold(dataset, fold)
    engine = engine_from(ctx)  # eval runs where the model is resident: in the daemon when one runs
    with ProgressView() as view:  # progress on stderr, --json or not
        result = engine.eval(dataset, method_list, ks=k_list, generate=generate, limit=limit, split=split,
                             concat=concat, fold=fold, data_dir=str(data_dir) if data_dir else None, top_n=top_n,
                             chunk_tokens=chunk_tokens, max_new_tokens=max_new_tokens, per_question=per_question,
                             rerank_top=rerank_top, answer_style=",".join(styles), memory=memory,
                             reader=str(reader.absolute()) if reader else None, on_event=view)
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
