# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from evsel.defaults import DATASETS as DATASET_NAMES
from evsel.defaults import DEFAULT_METHODS, STYLES
from evsel.errors import EvselError, InputError
from evsel.commands.output import ProgressView, print_json, stderr, stdout, warning
from evsel.requests import EvalRequest

from .base import path
from .common import JsonOption, engine_from
from .options import declared

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
    dataset: Annotated[str, declared(EvalRequest, "dataset")],
    # the request's lists, typed as comma-separated text
    methods: Annotated[str, declared(EvalRequest, "methods")] = DEFAULT_METHODS,
    ks: Annotated[str, declared(EvalRequest, "ks", parser=str)] = "1,3,5,10",
    generate: Annotated[bool, declared(EvalRequest, "generate")] = EvalRequest.generate,
    limit: Annotated[Optional[int], declared(EvalRequest, "limit")] = EvalRequest.limit,
    split: Annotated[Optional[str], declared(EvalRequest, "split")] = EvalRequest.split,
    concat: Annotated[int, declared(EvalRequest, "concat")] = EvalRequest.concat,
    fold: Annotated[Optional[int], declared(EvalRequest, "fold")] = EvalRequest.fold,
    data_dir: Annotated[Optional[Path], declared(
        EvalRequest, "data_dir", envvar="EVSEL_DATA", show_envvar=False,
        parser=path(file_okay=False, path_type=Path))] = None,
    top_n: Annotated[int, declared(EvalRequest, "top_n")] = EvalRequest.top_n,
    rerank_top: Annotated[int, declared(EvalRequest, "rerank_top")] = EvalRequest.rerank_top,
    chunk_tokens: Annotated[int, declared(EvalRequest, "chunk_tokens")] = EvalRequest.chunk_tokens,
    max_new_tokens: Annotated[int, declared(EvalRequest, "max_new_tokens")] = EvalRequest.max_new_tokens,
    answer_style: Annotated[str, declared(EvalRequest, "answer_style")] = EvalRequest.answer_style,
    reader: Annotated[Optional[Path], declared(
        EvalRequest, "reader", parser=path(file_okay=False, exists=True, path_type=Path))] = None,
    memory: Annotated[bool, declared(EvalRequest, "memory")] = EvalRequest.memory,
    per_question: Annotated[bool, declared(EvalRequest, "per_question")] = EvalRequest.per_question,
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
    from evsel.evaluation.report import run_info

    method_list = _method_list(methods)
    if top_n < 1:
        raise EvselError(f"--top-n {top_n} must be at least 1")
    if chunk_tokens < 16:
        raise EvselError(f"--chunk-tokens {chunk_tokens} is too small", "use 16 or more (default 140)")
    k_list = _int_list(ks, "--k")
    styles = _answer_styles(answer_style)
    _check_dataset(dataset)
    _check_plot_path(plot_path)
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
    _show(result, plot_path, as_json)


def _method_list(methods: str) -> list[str]:
    method_list = [m.strip() for m in methods.split(",") if m.strip()]
    if not method_list:
        raise EvselError("--methods is empty", f"e.g. --methods {DEFAULT_METHODS}")
    return method_list


def _answer_styles(answer_style: str) -> list[str]:
    """The styles compared, each a known one; short@DIR (style short with the reader in DIR, readers
    compared in one run) with DIR made absolute, for the engine may run in the daemon."""
    styles = [x.strip() for x in answer_style.split(",") if x.strip()]
    unknown = [x for x in styles if x.split("@", 1)[0] not in STYLES]
    if unknown or not styles:
        raise InputError(f"unknown answer style {', '.join(unknown) or answer_style!r}",
                         f"choose among: {', '.join(STYLES)}")
    for i, style in enumerate(styles):
        if "@" in style:
            name, folder = style.split("@", 1)
            if name != "short" or not Path(folder).is_dir():
                raise InputError(f"--answer-style {style}: give short@DIR with DIR a reader's folder",
                                 "e.g. --answer-style short,short@runs/reader")
            styles[i] = f"short@{Path(folder).absolute()}"
    return styles


def _check_dataset(dataset: str) -> None:
    if not (dataset.endswith(".jsonl") or Path(dataset).is_file() or dataset in DATASET_NAMES):
        raise InputError(f"unknown dataset {dataset!r}",
                         f"choose one of: {', '.join(DATASET_NAMES)}, or give a path to a .jsonl file")


def _check_plot_path(plot_path: Path | None) -> None:
    if plot_path is not None and not plot_path.absolute().parent.is_dir():
        raise InputError(f"--plot {plot_path}: the folder {plot_path.absolute().parent} does not exist",
                         "create it first, or give a path in a folder that exists")


def _show(result: dict, plot_path: Path | None, as_json: bool) -> None:
    """The plot (when asked), then the result as JSON or as tables with the dataset's notes."""
    from evsel.evaluation.report import plot, tables

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
