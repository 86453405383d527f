# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Callable, List, Literal, Optional

import typer

from evsel.errors import InputError
from evsel.commands.output import ProgressView, print_json, stderr

from evsel.requests import (TRAINING_SOURCE_HELP, TrainBlocksearchRequest, TrainConvertRequest, TrainHybridRequest,
                            TrainQrrankerRequest, TrainReaderRequest, TrainUnrealRequest)

from .base import FLOAT, INT, App, choice, path
from .common import JsonOption, engine_from
from .options import declared


def _layers(value: str | None) -> list[int] | None:
    """'13-20' or '16,18,20' -> a list of layers."""
    if value is None:
        return None
    out: list[int] = []
    try:
        for part in value.split(","):
            lo, _, hi = part.strip().partition("-")
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a layer list like 13-20 or 16,18,20") from None
    return out


def _warm_ask_ratio(value: str) -> tuple[str, float]:
    """'2.1' (the hybrid with every signal) or 'METHOD=2.1' -> (method, ratio)."""
    method, _, number = value.rpartition("=")
    try:
        ratio = float(number)
    except ValueError:
        ratio = float("nan")
    if not ratio > 0 or (method and not method.startswith("hybrid")):
        raise typer.BadParameter(f"{value!r} is not a ratio like 1.8 or hybrid:bm25+dense+unreal+dialogue=1.8")
    return (method or "hybrid", ratio)


HELD_OUT_FIELDS = ("kind", "set", "questions", "recall@3", "target", "met", "missed_by")


def _held_out_entries(file: str) -> list[dict]:
    """A held-out file (format: docs/FUSION.md, "Held-out runs"): a JSON list, each entry a run
    no fit looked at, judged against its target."""
    import json

    try:
        entries = json.loads(Path(file).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise InputError(f"--held-out {file} is not a JSON list of held-out runs ({error})",
                         "see its format in docs/FUSION.md (Held-out runs)") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and all(f in e for f in HELD_OUT_FIELDS)
                                                for e in entries):
        raise InputError(f"--held-out {file} holds no list of held-out runs with {', '.join(HELD_OUT_FIELDS)}",
                         "see its format in docs/FUSION.md (Held-out runs)")
    return entries


app = App(help="Train the adapters of model-internal selectors (the backbone stays frozen).")

_source_help = TRAINING_SOURCE_HELP
FoldOption = Annotated[Optional[int], typer.Option(
    "--fold", parser=INT,
    help="With --source locomo, musique or hotpotqa: train (and pick the adapter) on this fixed fold only "
         "(1 or 2); evaluate it on the other with evsel eval DATASET --fold N.")]
TrainDeviceOption = Annotated[Optional[Literal["auto", "cpu", "cuda"]], typer.Option(
    "--device", parser=choice(["auto", "cpu", "cuda"]), help="Where to train (default: evsel --device).")]


def _command_line() -> str:
    """The command as typed, recorded beside what it writes."""
    return " ".join(shlex.quote(a) for a in ["evsel", *sys.argv[1:]])


def _with_progress(as_json: bool, train: Callable[[Callable[[dict], None]], dict]) -> dict:
    """`train(on_event)` with its progress on stderr, --json or not; its log lines go to stderr,
    never into --json's output."""
    with ProgressView() as view:
        def on_event(event: dict) -> None:
            if not (as_json and event.get("type") == "log"):
                view(event)

        return train(on_event)


@app.command("convert")
def convert_cmd(
    ctx: typer.Context,
    out: Annotated[str, declared(TrainConvertRequest, "out", parser=path(file_okay=False))],
    sources: Annotated[List[str], typer.Option("--source", help=_source_help)] = ["fairytaleqa-train"],
    stories: Annotated[Optional[int], typer.Option(
        "--stories", parser=INT, help="FairytaleQA train stories to use (default: all).")] = None,
    dev_stories: Annotated[int, typer.Option(
        "--dev-stories", parser=INT, help="FairytaleQA train stories held out for the dev recall log.")] = 10,
    negatives: Annotated[int, typer.Option("--negatives", parser=INT, help="Hard negatives per question.")] = 500,
    skip: Annotated[int, typer.Option(
        "--skip", parser=INT, help="Top BM25 ranks skipped when mining negatives (near-duplicates of the oracle).")
    ] = 10,
    data_dir: Annotated[Optional[str], declared(TrainConvertRequest, "data_dir", parser=path(file_okay=False))
                        ] = TrainConvertRequest.data_dir,
    seed: Annotated[int, typer.Option("--seed", parser=INT)] = 0,
    fold: FoldOption = None,
    as_json: JsonOption = False,
):
    """Write training data in the common JSONL format (chunks, questions, gold chunk ids, BM25
    context C0 and hard negatives), chunked and gold-mapped exactly as `evsel eval` does."""
    options = {"sources": list(sources), "stories": stories, "dev_stories": dev_stories, "negatives": negatives,
               "skip": skip, "seed": seed, "fold": fold}
    engine = engine_from(ctx)  # runs where the model is resident: in the daemon when one runs
    with ProgressView() as view:  # progress on stderr, --json or not
        meta = engine.train_convert(str(Path(out).absolute()), options,
                                    str(Path(data_dir).absolute()) if data_dir else None, on_event=view)
    if as_json:
        print_json(meta)
    else:
        stderr.print(f"wrote {out}: {meta['chunks']} chunks, {meta['train']} training and {meta['dev']} dev questions")


@app.command("unreal")
def train_unreal(
    ctx: typer.Context,
    out: Annotated[str, declared(TrainUnrealRequest, "out", parser=path(file_okay=False))],
    data: Annotated[Optional[str], declared(TrainUnrealRequest, "data", parser=path(file_okay=False))
                    ] = TrainUnrealRequest.data,
    recipe: Annotated[Literal["smoke", "full"], declared(TrainUnrealRequest, "recipe_name")
                      ] = TrainUnrealRequest.recipe_name,
    sources: Annotated[Optional[List[str]], declared(TrainUnrealRequest, "sources")] = TrainUnrealRequest.sources,
    layer: Annotated[Optional[int], typer.Option(
        "--layer", parser=INT, help="l_c: chunk states after this many layers (default 20).")] = None,
    pool: Annotated[Optional[int], typer.Option(
        "--pool", parser=INT, help="L_p: pooled vectors per chunk (default 7).")] = None,
    retrieval_tokens: Annotated[Optional[int], typer.Option(
        "--retrieval-tokens", parser=INT, help="R (default 64).")] = None,
    groups: Annotated[Optional[int], typer.Option("--groups", parser=INT, help="G (default 4).")] = None,
    c0: Annotated[Optional[int], typer.Option(
        "--c0", parser=INT, help="BM25 chunks before the question (default 5).")] = None,
    readout: Annotated[Optional[str], typer.Option(
        "--readout", help="Layers mixed by alpha, e.g. 13-20 (default 13-20).")] = None,
    tau: Annotated[Optional[float], typer.Option(
        "--tau", parser=FLOAT,
        help="InfoNCE temperature (default: half the spread of the untrained scores).")] = None,
    train_soft_prompt: Annotated[Optional[bool], typer.Option(
        "--train-soft-prompt/--no-train-soft-prompt",
        help="Backpropagate through the whole query pass so the soft prompt trains (~3x slower).")] = None,
    batch: Annotated[Optional[int], typer.Option("--batch", parser=INT, help="Questions per step.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", parser=INT, help="Optimizer steps.")] = None,
    minutes: Annotated[Optional[float], typer.Option(
        "--minutes", parser=FLOAT,
        help="Wall-clock budget: after 3 measured steps the step count is lowered to fit.")] = None,
    lr: Annotated[Optional[float], typer.Option(
        "--lr", parser=FLOAT, help="Peak learning rate (default 1e-2).")] = None,
    warmup: Annotated[Optional[int], typer.Option(
        "--warmup", parser=INT, help="Warmup steps (default 100, at most a tenth of the run).")] = None,
    max_train: Annotated[Optional[int], typer.Option(
        "--max-train", parser=INT, help="Use at most this many training questions.")] = None,
    dev_every: Annotated[Optional[int], typer.Option(
        "--dev-every", parser=INT, help="Steps between dev recall checks.")] = None,
    dev_queries: Annotated[Optional[int], typer.Option(
        "--dev-queries", parser=INT, help="Dev questions per check.")] = None,
    train_device: TrainDeviceOption = None,
    threads: Annotated[Optional[int], typer.Option("--threads", parser=INT, help="CPU threads for torch.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", parser=INT)] = None,
    init: Annotated[Optional[str], typer.Option(
        "--init", parser=path(exists=True, file_okay=False),
        help="Start from this adapter folder (e.g. a run's checkpoint/ or the shipped adapter) "
             "instead of a fresh one; its shape and temperature are kept.")] = None,
    fold: FoldOption = None,
    as_json: JsonOption = False,
):
    """Train UNREAL's adapter: soft prompt, retrieval tokens and layer weights (seed 000).

    Multi-positive InfoNCE over oracle and hard-negative chunks pooled across the batch; AdamW
    (0.9, 0.95), weight decay 0.1, clipping 1.0, warmup then linear decay. Chunk states come from
    the state cache. Rerunning the same command resumes from OUT/checkpoint. The best adapter by
    dev recall is in OUT/best; use it with EVSEL_UNREAL_ADAPTER=OUT/best.
    """
    options = {"layer": layer, "pool": pool, "retrieval_tokens": retrieval_tokens, "groups": groups, "c0": c0,
               "readout": _layers(readout), "tau": tau, "train_soft_prompt": train_soft_prompt, "batch": batch,
               "steps": steps, "minutes": minutes, "lr": lr, "warmup": warmup, "max_train": max_train,
               "dev_every": dev_every, "dev_queries": dev_queries, "threads": threads, "seed": seed,
               "init": str(Path(init).absolute()) if init else None, "fold": fold}
    # --device here is where to train: the engine (the daemon's, when one runs) for that device
    engine = engine_from(ctx, **({"device": train_device} if train_device else {}))
    command = _command_line()
    summary = _with_progress(as_json, lambda on_event: engine.train_unreal(
        str(Path(out).absolute()), recipe, str(Path(data).absolute()) if data else None, list(sources or ()),
        options, command, on_event=on_event))
    if as_json:
        print_json(summary)
    else:
        stderr.print(f"done: {summary['steps']} steps, best dev recall@{summary['k']} {summary['best_dev']:.3f}; "
                     f"adapter in {Path(out) / 'best'}")


@app.command("qrranker")
def train_qrranker(
    ctx: typer.Context,
    out: Annotated[str, declared(TrainQrrankerRequest, "out", parser=path(file_okay=False))],
    detect_heads: Annotated[bool, declared(TrainQrrankerRequest, "detect_heads")] = TrainQrrankerRequest.detect_heads,
    recipe: Annotated[Literal["smoke", "full"], declared(TrainQrrankerRequest, "recipe_name")
                      ] = TrainQrrankerRequest.recipe_name,
    sources: Annotated[Optional[List[str]], typer.Option(
        "--source", help="Seed-set / training source (repeatable): fairytaleqa-train (default); locomo, musique "
                         "or hotpotqa with --fold. FairytaleQA val is refused.")] = None,
    fold: FoldOption = None,
    documents: Annotated[Optional[int], typer.Option(
        "--documents", parser=INT,
        help="Detection: documents sampled per source (default 32 FairytaleQA train stories).")] = None,
    questions_per_document: Annotated[Optional[int], typer.Option(
        "--questions-per-document", parser=INT,
        help="Questions per document (detection default 3, training 6).")] = None,
    max_questions: Annotated[Optional[int], typer.Option(
        "--max-questions", parser=INT, help="Detection: at most this many seed questions in all.")] = None,
    candidates: Annotated[Optional[int], typer.Option(
        "--candidates", parser=INT, help="BM25 top-k of the question's document scored (default 50).")] = None,
    keep: Annotated[Optional[int], typer.Option("--keep", parser=INT, help="Detection: heads kept (default 16).")
    ] = None,
    encoding: Annotated[Literal["both", "block", "causal"], typer.Option(
        "--encoding", parser=choice(["both", "block", "causal"]),
        help="Detection: candidate encoding(s) to detect under, a head list for each (training: block).")] = "both",
    stories: Annotated[Optional[int], typer.Option(
        "--stories", parser=INT, help="Training: FairytaleQA train stories trained on (full: 24).")] = None,
    dev_stories: Annotated[Optional[int], typer.Option(
        "--dev-stories", parser=INT,
        help="Training: held-out FairytaleQA train stories for the dev recall log (full: 8).")] = None,
    heads: Annotated[Optional[str], typer.Option(
        "--heads", help="Training: the heads to train, a list (14-3,17-0) or a heads.json "
                        "(default: EVSEL_QRRANKER_HEADS, else the shipped list).")] = None,
    rank: Annotated[Optional[int], typer.Option("--rank", parser=INT, help="Training: LoRA rank (default 8).")
    ] = None,
    batch: Annotated[Optional[int], typer.Option("--batch", parser=INT, help="Training: questions per step.")
    ] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", parser=INT, help="Training: optimizer steps.")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", parser=FLOAT, help="Training: peak learning rate.")] = None,
    dev_every: Annotated[Optional[int], typer.Option(
        "--dev-every", parser=INT, help="Training: steps between dev recall checks.")] = None,
    train_device: TrainDeviceOption = None,
    minutes: Annotated[Optional[float], typer.Option(
        "--minutes", parser=FLOAT,
        help="Stop after this many minutes (detection: stop taking seed questions; training: "
             "checkpoint and stop, a rerun continues).")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", parser=INT, help="CPU threads for torch.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", parser=INT)] = None,
    as_json: JsonOption = False,
):
    """QRRanker's retrieval heads (seed 003). With --detect-heads: the QR score of every attention
    head (mean calibrated attention mass on the gold chunks among a question's BM25 candidates,
    QRHead's score) over a seed set from training splits only; the top heads and every head's
    score go to OUT/heads.json. Use them with EVSEL_QRRANKER_HEADS=OUT.

    Without --detect-heads: train those heads for reranking with the seed's listwise loss (a
    question's BM25 top-k from FairytaleQA train, gold chunks positive; scores max-min normalised
    to [0, 8]). What trains is a LoRA adapter on q_proj and k_proj of the layers holding the heads,
    applied inside QR scoring only (answering uses the untouched backbone). The best adapter by
    dev recall@3 goes to OUT beside OUT/heads.json; use it with EVSEL_QRRANKER_HEADS=OUT.
    Rerunning the same command resumes from OUT/checkpoint.
    """
    options = _qrranker_options(
        detect_heads, encoding, sources=list(sources) if sources else None, fold=fold, documents=documents,
        questions_per_document=questions_per_document, max_questions=max_questions, candidates=candidates, keep=keep,
        stories=stories, dev_stories=dev_stories, heads=heads, rank=rank, batch=batch, steps=steps, lr=lr,
        dev_every=dev_every, minutes=minutes, threads=threads, seed=seed)
    # training's --device is where to train: the engine (the daemon's, when one runs) for that device
    engine = engine_from(ctx, **({"device": train_device} if train_device and not detect_heads else {}))
    summary = _with_progress(as_json, lambda on_event: engine.train_qrranker(
        str(Path(out).absolute()), detect_heads, options, _command_line(), on_event=on_event, recipe_name=recipe))
    if as_json:
        print_json(summary)
    else:
        _print_qrranker_done(summary, detect_heads, out)


def _qrranker_options(detect_heads: bool, encoding: str, **given) -> dict:
    """The recipe's options for head detection or for training, from the command's flags (each
    mode reads its own; training reads block-encoded candidates only)."""
    shared = ("sources", "candidates", "minutes", "threads", "seed", "fold")
    if detect_heads:
        picked = ("documents", "questions_per_document", "max_questions", "keep", *shared)
        return {**{k: given[k] for k in picked},
                "encodings": ["block", "causal"] if encoding == "both" else [encoding]}
    if encoding == "causal":
        raise typer.BadParameter("training reads block-encoded candidates", param_hint="--encoding")
    picked = ("stories", "dev_stories", "heads", "rank", "batch", "steps", "lr", "dev_every", *shared)
    return {**{k: given[k] for k in picked}, "questions_per_story": given["questions_per_document"]}


def _print_qrranker_done(summary: dict, detect_heads: bool, out: str) -> None:
    if detect_heads:
        for name, listed in summary["heads"].items():
            stderr.print(f"{name}: {', '.join(listed)}")
        stderr.print(f"wrote {summary['out']} from {summary['questions']} seed questions in {summary['seconds']:.0f} s")
        return
    best = summary["best_dev"] or {}
    k = summary["k"]
    stderr.print(f"done: {summary['steps']} of {summary['total_steps']} steps; best dev recall@{k} "
                 f"{best.get(f'recall@{k}', float('nan')):.3f} (BM25 {summary['dev_bm25'].get(f'recall@{k}', float('nan')):.3f}); "
                 f"adapter in {out}")


@app.command("blocksearch")
def train_blocksearch(
    ctx: typer.Context,
    out: Annotated[str, declared(TrainBlocksearchRequest, "out", parser=path(file_okay=False))],
    recipe: Annotated[Literal["smoke", "full"], declared(TrainBlocksearchRequest, "recipe_name")
                      ] = TrainBlocksearchRequest.recipe_name,
    sources: Annotated[Optional[List[str]], typer.Option(
        "--source", help=_source_help)] = None,
    fold: FoldOption = None,
    stories: Annotated[Optional[int], typer.Option(
        "--stories", parser=INT, help="FairytaleQA train stories trained on (full: 64).")] = None,
    dev_stories: Annotated[Optional[int], typer.Option(
        "--dev-stories", parser=INT, help="Held-out FairytaleQA train stories for the dev recall log (full: 8).")
    ] = None,
    questions_per_story: Annotated[Optional[int], typer.Option(
        "--questions-per-story", parser=INT, help="Questions per training story (full: 6).")] = None,
    stories_per_context: Annotated[Optional[int], typer.Option(
        "--stories-per-context", parser=INT, help="Stories whose chunks share one coded context (default 2).")
    ] = None,
    rank: Annotated[Optional[int], typer.Option("--rank", parser=INT, help="LoRA rank (default 8).")] = None,
    batch: Annotated[Optional[int], typer.Option("--batch", parser=INT, help="Questions per step.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", parser=INT, help="Optimizer steps.")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", parser=FLOAT, help="Peak learning rate.")] = None,
    aux_weight: Annotated[Optional[float], typer.Option(
        "--aux-weight", parser=FLOAT, help="λ of the on-policy auxiliary loss (default 1; 0: teacher forcing only).")
    ] = None,
    dev_every: Annotated[Optional[int], typer.Option(
        "--dev-every", parser=INT, help="Steps between dev recall checks.")] = None,
    train_device: TrainDeviceOption = None,
    minutes: Annotated[Optional[float], typer.Option(
        "--minutes", parser=FLOAT, help="Checkpoint and stop after this many minutes; a rerun continues.")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", parser=INT, help="CPU threads for torch.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", parser=INT)] = None,
    router: Annotated[bool, typer.Option(
        "--router", help="Train the router instead: a LoRA on q/k of the layers up to the routing layer, "
                         "listwise loss on the routing score (use with EVSEL_BLOCKSEARCH_ROUTER=OUT and "
                         "--select blocksearch:router).")] = False,
    as_json: JsonOption = False,
):
    """BlockSearch's code decoder (seed 001): every chunk of a context carries a random four-digit
    code and the query block learns to decode the gold chunk's code.

    Loss: teacher-forced cross-entropy on the gold code plus the on-policy auxiliary loss (the
    model rolls a code out, each digit slot gets a teacher from the candidates matching the
    rollout's prefix, the rollout is replayed with gradients). Training splits only (FairytaleQA
    train by default; LoCoMo, MuSiQue, HotpotQA on one --fold); FairytaleQA val is refused. What trains is a LoRA adapter on
    q_proj and v_proj applied to the query block alone: the chunks' states and the answering
    backbone stay the frozen model's. The best adapter by dev recall@1 goes to OUT; use it with
    EVSEL_BLOCKSEARCH_DECODER=OUT and --select blocksearch:trained. Rerunning resumes from
    OUT/checkpoint.
    """
    command = _command_line()
    options = {"sources": list(sources) if sources else None, "stories": stories, "dev_stories": dev_stories,
               "questions_per_story": questions_per_story, "stories_per_context": stories_per_context,
               "rank": rank, "batch": batch, "steps": steps, "lr": lr, "aux_weight": aux_weight,
               "dev_every": dev_every, "minutes": minutes, "threads": threads, "seed": seed, "router": router, "fold": fold}
    engine = engine_from(ctx, **({"device": train_device} if train_device else {}))
    summary = _with_progress(as_json, lambda on_event: engine.train_blocksearch(
        str(Path(out).absolute()), options, command, on_event=on_event, recipe_name=recipe))
    if as_json:
        print_json(summary)
    else:
        best = summary["best_dev"] or {}
        k = "5" if router else "1"
        stderr.print(f"done: {summary['steps']} of {summary['total_steps']} steps; best dev recall@{k} "
                     f"{best.get(f'recall@{k}', float('nan')):.3f} (BM25 {best.get('bm25', {}).get(f'recall@{k}', float('nan')):.3f}); "
                     f"adapter in {out}")


@app.command("hybrid")
def train_hybrid(
    ctx: typer.Context,
    out: Annotated[str, declared(TrainHybridRequest, "out", parser=path(file_okay=False))],
    recipe: Annotated[Literal["smoke", "full"], declared(TrainHybridRequest, "recipe_name")
                      ] = TrainHybridRequest.recipe_name,
    sources: Annotated[List[str], typer.Option(
        "--source", help="fairytaleqa-train (default; dev: held-out train stories), or locomo, musique, "
                         "hotpotqa with --fold N (dev: the other fold). Repeatable: one model over every "
                         "source, and one per kind of document where that does better on its dev.")
    ] = ["fairytaleqa-train"],
    fold: Annotated[Optional[int], typer.Option(
        "--fold", parser=INT, help="The fold of locomo, musique or hotpotqa trained on (1 or 2).")] = None,
    groups: Annotated[Optional[str], typer.Option(
        "--groups", help="Signals to use, joined by + (default all the backbone has): "
                         "bm25, dense, unreal, qr, dialogue.")] = None,
    questions: Annotated[Optional[int], typer.Option(
        "--questions", parser=INT, help="Training questions (full: 240).")] = None,
    dev_questions: Annotated[Optional[int], typer.Option(
        "--dev-questions", parser=INT, help="Dev questions (full: 120).")] = None,
    warm_ask_ratios: Annotated[Optional[List[str]], typer.Option(
        "--warm-ask-ratio", metavar="[METHOD=]RATIO",
        help="A method's warm ask time over a BM25 one (bench/daemon.py --versus METHOD): RATIO alone is "
             "hybrid's (every signal), METHOD=RATIO another weight set's, e.g. "
             "hybrid:bm25+dense+unreal+dialogue=1.6. Repeatable. A method becomes the default for the "
             "source's kind of document only when this is at most 2 (unmeasured: it does not).")] = None,
    as_json: JsonOption = False,
):
    """The learned fusion's weights (--select hybrid): BM25, dense, UNREAL and QR-head scores and
    dialogue features of each question's candidate pool, extracted once into OUT/features, then a
    listwise softmax model fitted in seconds; one weight set per group of signals, so a backbone
    without some trained part still has one. Use them with EVSEL_HYBRID_WEIGHTS=OUT. The fit
    proposes each kind's default candidate; evsel train defaults judges it on held-out runs and
    writes the defaults record.
    """
    command = _command_line()
    options = {"sources": list(sources), "fold": fold, "groups": groups, "questions": questions,
               "dev_questions": dev_questions,
               "warm_ask_ratio": dict(_warm_ask_ratio(v) for v in warm_ask_ratios) if warm_ask_ratios else None}
    engine = engine_from(ctx)
    with ProgressView() as view:  # progress on stderr, --json or not
        summary = engine.train_hybrid(str(Path(out).absolute()), options, command, on_event=view, recipe_name=recipe)
    if as_json:
        print_json(summary)
        return
    for ws in summary["weight_sets"]:
        dev = ws["dev"]
        stderr.print(f"{ws['name']} ({'+'.join(ws['groups'])}): dev recall@3 {dev['recall@3']:.3f} mrr {dev['mrr']:.3f}")
    for kind, compared in summary["per_kind"].items():
        stderr.print(f"{kind}: dev recall@3 {compared['own']['recall@3']:.3f} fitted on {kind} alone, "
                     f"{compared['pooled']['recall@3']:.3f} pooled: kept {compared['kept']}")
    for kind, chosen in summary["defaults"].items():
        stderr.print(f"default for {kind}: {chosen['method']} ({chosen['why']})")
    stderr.print(f"weights in {out}")


@app.command("defaults")
def train_defaults(
    ctx: typer.Context,
    out: Annotated[str, typer.Option(
        "--out", parser=path(file_okay=False),
        help="Folder to write defaults.json to (the shipped record: models/adapters/<fingerprint>).")],
    held_out: Annotated[List[str], typer.Option(
        "--held-out", metavar="FILE", parser=path(dir_okay=False, exists=True),
        help="Runs no fit looked at, each against its target (a JSON list; format in docs/FUSION.md, "
             "Held-out runs). Repeatable.")],
    weights: Annotated[Optional[str], typer.Option(
        "--weights", parser=path(exists=True),
        help="The fusion's weights whose fit proposes each kind's candidate (default: EVSEL_HYBRID_WEIGHTS, "
             "else the shipped ones).")] = None,
    warm_ask_ratios: Annotated[Optional[List[str]], typer.Option(
        "--warm-ask-ratio", metavar="KIND:METHOD=RATIO",
        help="A candidate's warm ask over a BM25 one measured on that kind's documents (bench/first_hour.py "
             "--warm), e.g. dialogue:hybrid=2.4: over the speed limit (2x) it drops out. Repeatable.")] = None,
    candidates: Annotated[Optional[List[str]], typer.Option(
        "--candidate", metavar="KIND:METHOD=FILE",
        help="A method the fit did not propose, judged by the same rule on FILE, an `evsel eval --methods "
             "bm25,METHOD --json --per-question` result on that kind's held-out questions, e.g. "
             "dialogue:hybrid:bm25+dense+dialogue=locomo-fold2.json (its speed: --warm-ask-ratio). Repeatable.")
    ] = None,
    as_json: JsonOption = False,
):
    """Each kind's default method (what ask runs with no --select), kept apart from the fusion's
    weights: the candidate the fusion's fit chose on its dev questions, judged by every run no fit
    looked at (the fit's own and --held-out's); a kind whose candidate missed one stays on BM25.
    Writes OUT/defaults.json (format in docs/FUSION.md); evsel models info shows each kind's and why."""
    import os

    command = _command_line()
    ratios: dict[str, dict[str, float]] = {}
    for given in warm_ask_ratios or ():
        kind, _, rest = given.partition(":")
        method, ratio = _warm_ask_ratio(rest)
        if kind not in ("dialogue", "book", "pdf"):
            raise typer.BadParameter(f"{given!r}: the kind is dialogue, book or pdf, e.g. dialogue:hybrid=2.4")
        ratios.setdefault(kind, {})[method] = ratio
    extra: dict[str, list[tuple[str, dict]]] = {}
    for given in candidates or ():
        kind, _, rest = given.partition(":")
        method, _, file = rest.rpartition("=")
        if kind not in ("dialogue", "book", "pdf") or not method or not file:
            raise typer.BadParameter(f"{given!r} is not KIND:METHOD=FILE, e.g. dialogue:hybrid:bm25+dense+dialogue=run.json")
        try:
            extra.setdefault(kind, []).append((method, json.loads(Path(file).read_text())))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise InputError(f"--candidate {given}: {file} is not an evsel eval --json result ({error})",
                             "write it with: evsel eval DATASET --methods bm25,METHOD --json --per-question") from None
    engine = engine_from(ctx, no_daemon=True)  # files only: nothing the daemon keeps loaded
    record = engine.train_defaults(str(Path(out).absolute()), [e for file in held_out for e in _held_out_entries(file)],
                                   str(Path(weights).absolute()) if weights else None, command, ratios, extra)
    if as_json:
        print_json(record)
        return
    for kind, chosen in record["defaults"].items():
        stderr.print(f"{kind}: {chosen['method']} ({chosen['why']})", emoji=False)
    stderr.print(f"wrote {os.path.join(out, 'defaults.json')}", emoji=False)


@app.command("reader")
def train_reader(
    ctx: typer.Context,
    out: Annotated[str, declared(TrainReaderRequest, "out", parser=path(file_okay=False))],
    recipe: Annotated[Literal["smoke", "full"], declared(TrainReaderRequest, "recipe_name")
                      ] = TrainReaderRequest.recipe_name,
    sources: Annotated[Optional[List[str]], typer.Option("--source", help=_source_help)] = None,
    fold: FoldOption = None,
    stories: Annotated[Optional[int], typer.Option(
        "--stories", parser=INT, help="FairytaleQA train stories trained on (full: 150).")] = None,
    questions_per_story: Annotated[Optional[int], typer.Option(
        "--questions-per-story", parser=INT, help="Questions per training story (full: 8).")] = None,
    folded_questions: Annotated[Optional[int], typer.Option(
        "--folded-questions", parser=INT, help="Training questions per LoCoMo / MuSiQue / HotpotQA source (full: 400).")
    ] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", parser=INT, help="Optimizer steps (full: 1500).")] = None,
    batch: Annotated[Optional[int], typer.Option("--batch", parser=INT, help="Questions per step (full: 8).")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", parser=FLOAT, help="Peak learning rate.")] = None,
    minutes: Annotated[Optional[float], typer.Option(
        "--minutes", parser=FLOAT, help="Checkpoint and stop after this many minutes; a rerun continues.")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", parser=INT, help="CPU threads for torch.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", parser=INT)] = None,
    rescore_questions: Annotated[Optional[int], typer.Option(
        "--rescore-questions", parser=INT,
        help="Held-out questions per source on which the answer step's weights are chosen (full: 120).")] = None,
    rescore_only: Annotated[bool, typer.Option(
        "--rescore-only", help="Keep the reader in OUT; choose only the answer step's weights (reader.json: rescore).")
    ] = False,
    lora: Annotated[bool, typer.Option(
        "--lora", help="Train the LoRA reader (models/reader/lora.py): deltas on the upper layers, the question "
                       "and all passages in one sequence, a no-answer span.")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the LoRA reader run in OUT (its examples, cached states, checkpoint).")] = False,
    precache_only: Annotated[bool, typer.Option(
        "--precache-only", help="--lora: build the examples and the frozen layers' states, then stop.")] = False,
    cut: Annotated[Optional[int], typer.Option(
        "--cut", parser=INT, help="--lora: layers 1..CUT stay as they are (cached); full: 14.")] = None,
    deepest: Annotated[Optional[int], typer.Option(
        "--deepest", parser=INT, help="--lora: the deepest adapted layer, read by the head; full: 22.")] = None,
    rank: Annotated[Optional[int], typer.Option("--rank", parser=INT, help="--lora: the deltas' rank (full: 8).")
                    ] = None,
    dev_every: Annotated[Optional[int], typer.Option(
        "--dev-every", parser=INT, help="--lora: steps between dev checks (full: 100).")] = None,
    init_from: Annotated[Optional[str], typer.Option(
        "--init-from", parser=path(file_okay=False, exists=True), metavar="DIR",
        help="--lora: start from the LoRA reader in DIR (its deltas, head and shape), e.g. to train it on "
             "more examples.")] = None,
    as_json: JsonOption = False,
):
    """The reader (the answer step of --style short): a span head on the frozen backbone's states
    that finds the answer's words across all shown passages (models/reader/span_head.py).

    Each example is a training question with BM25's top 5 passages of its document, the answer
    located in them. Training splits only: FairytaleQA train (dev: held-out train stories), and
    LoCoMo, MuSiQue, HotpotQA on one --fold (evaluate with --fold of the other). With LoCoMo, its
    held-out conversation's adversarial questions set the abstention threshold. The backbone's
    states are cached in OUT/states; rerunning resumes from OUT/checkpoint. Use the head with
    evsel eval --reader OUT, or copy it into the model's adapters to make it the default.
    """
    command = _command_line()
    options = {"sources": list(sources) if sources else None, "fold": fold, "stories": stories,
               "questions_per_story": questions_per_story, "folded_questions": folded_questions, "steps": steps,
               "batch": batch, "lr": lr, "minutes": minutes, "threads": threads, "seed": seed,
               "rescore_questions": rescore_questions, "rescore_only": rescore_only or None,
               "lora": lora or None, "resume": resume or None, "precache_only": precache_only or None,
               "cut": cut, "deepest": deepest, "rank": rank, "dev_every": dev_every,
               "init_from": str(Path(init_from).absolute()) if init_from else None}
    engine = engine_from(ctx)
    summary = _with_progress(as_json, lambda on_event: engine.train_reader(
        str(Path(out).absolute()), options, command, on_event=on_event, recipe_name=recipe))
    if as_json:
        print_json(summary)
    else:
        _print_reader_done(summary, lora or resume, rescore_only, out)


def _print_reader_done(summary: dict, lora: bool, rescore_only: bool, out: str) -> None:
    if lora:
        best = summary.get("best_dev") or {}
        stderr.print(f"done: {summary['steps']} of {summary['total_steps']} steps; best dev F1 "
                     f"{best.get('f1', float('nan')):.3f}; reader in {out}"
                     + ("" if summary["steps"] >= summary["total_steps"]
                        else f"; continue with: evsel train reader --lora --resume --out {out}"))
        return
    for group, row in summary["rescore"]["dev"].items():
        stderr.print(f"answer step weights ({group}, {row['questions']} held-out questions): F1 {row['f1']:.3f}, "
                     f"the reader alone {row['f1_reader_alone']:.3f}")
    if rescore_only:
        return
    best = summary["best_dev"] or {}
    abstain = summary["abstention"]
    stderr.print(f"done: {summary['steps']} of {summary['total_steps']} steps; best dev F1 "
                 f"{best.get('f1', float('nan')):.3f}; abstains below p={abstain['abstain_below']:.3f}; reader in {out}")
