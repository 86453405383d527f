from __future__ import annotations

import click

from evsel.output import ProgressView, print_json, stderr

from .common import json_option


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
        raise click.BadParameter(f"{value!r} is not a layer list like 13-20 or 16,18,20") from None
    return out


@click.group()
def train():
    """Train the adapters of model-internal selectors (the backbone stays frozen)."""


_source_help = "Training source (repeatable): fairytaleqa-train, musique, hotpotqa. LoCoMo and FairytaleQA val are refused."


@train.command("convert")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Folder to write.")
@click.option("--source", "sources", multiple=True, default=["fairytaleqa-train"], show_default=True,
              help=_source_help)
@click.option("--stories", type=int, default=None, help="FairytaleQA train stories to use (default: all).")
@click.option("--dev-stories", type=int, default=10, show_default=True,
              help="FairytaleQA train stories held out for the dev recall log.")
@click.option("--negatives", type=int, default=500, show_default=True, help="Hard negatives per question.")
@click.option("--skip", type=int, default=10, show_default=True,
              help="Top BM25 ranks skipped when mining negatives (near-duplicates of the oracle).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder with the benchmark data (default: ../shared/data or $EVSEL_DATA).")
@click.option("--seed", type=int, default=0, show_default=True)
@json_option
@click.pass_context
def convert_cmd(ctx, out, sources, stories, dev_stories, negatives, skip, data_dir, seed, as_json):
    """Write training data in the common JSONL format (chunks, questions, gold chunk ids, BM25
    context C0 and hard negatives), chunked and gold-mapped exactly as `evsel eval` does."""
    from pathlib import Path

    from evsel.recipes.unreal import DataConfig, convert

    from .common import engine_from

    config = DataConfig(sources=list(sources), stories=stories, dev_stories=dev_stories, negatives=negatives,
                        skip=skip, seed=seed)
    engine = engine_from(ctx)
    with ProgressView(enabled=not as_json) as view:
        meta = convert(Path(out), config, engine.backbone, Path(data_dir) if data_dir else None, view)
    if as_json:
        print_json(meta)
    else:
        stderr.print(f"wrote {out}: {meta['chunks']} chunks, {meta['train']} training and {meta['dev']} dev questions")


@train.command("unreal")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Run folder: checkpoint/ (resumable), best/ (adapter), log.jsonl, config.json.")
@click.option("--data", type=click.Path(file_okay=False), default=None,
              help="Training folder from `evsel train convert` (default: OUT/data, converted first).")
@click.option("--recipe", type=click.Choice(["smoke", "full"]), default="full", show_default=True,
              help="smoke: minutes on a CPU, proves the path; full: the shipped adapter's settings.")
@click.option("--source", "sources", multiple=True, help=_source_help + " Used when OUT/data is converted.")
@click.option("--layer", type=int, default=None, help="l_c: chunk states after this many layers (default 20).")
@click.option("--pool", type=int, default=None, help="L_p: pooled vectors per chunk (default 7).")
@click.option("--retrieval-tokens", type=int, default=None, help="R (default 64).")
@click.option("--groups", type=int, default=None, help="G (default 4).")
@click.option("--c0", type=int, default=None, help="BM25 chunks before the question (default 5).")
@click.option("--readout", default=None, help="Layers mixed by alpha, e.g. 13-20 (default 13-20).")
@click.option("--tau", type=float, default=None, help="InfoNCE temperature (default: half the spread of the untrained scores).")
@click.option("--train-soft-prompt/--no-train-soft-prompt", default=None,
              help="Backpropagate through the whole query pass so the soft prompt trains (~3x slower).")
@click.option("--batch", type=int, default=None, help="Questions per step.")
@click.option("--steps", type=int, default=None, help="Optimizer steps.")
@click.option("--minutes", type=float, default=None,
              help="Wall-clock budget: after 3 measured steps the step count is lowered to fit.")
@click.option("--lr", type=float, default=None, help="Peak learning rate (default 1e-2).")
@click.option("--warmup", type=int, default=None, help="Warmup steps (default 100, at most a tenth of the run).")
@click.option("--max-train", type=int, default=None, help="Use at most this many training questions.")
@click.option("--dev-every", type=int, default=None, help="Steps between dev recall checks.")
@click.option("--dev-queries", type=int, default=None, help="Dev questions per check.")
@click.option("--device", "train_device", type=click.Choice(["auto", "cpu", "cuda"]), default=None,
              help="Where to train (default: evsel --device).")
@click.option("--threads", type=int, default=None, help="CPU threads for torch.")
@click.option("--seed", type=int, default=None)
@click.option("--init", type=click.Path(file_okay=False, exists=True), default=None,
              help="Start from this adapter folder (e.g. a run's checkpoint/ or the shipped adapter) "
                   "instead of a fresh one; its shape and temperature are kept.")
@json_option
@click.pass_context
def train_unreal(ctx, out, data, recipe, sources, train_device, as_json, **options):
    """Train UNREAL's adapter: soft prompt, retrieval tokens and layer weights (seed 000).

    Multi-positive InfoNCE over oracle and hard-negative chunks pooled across the batch; AdamW
    (0.9, 0.95), weight decay 0.1, clipping 1.0, warmup then linear decay. Chunk states come from
    the state cache. Rerunning the same command resumes from OUT/checkpoint. The best adapter by
    dev recall is in OUT/best; use it with EVSEL_UNREAL_ADAPTER=OUT/best.
    """
    from dataclasses import fields
    from pathlib import Path

    from evsel.engine import Engine
    from evsel.recipes import unreal as recipe_mod

    settings = recipe_mod.recipe(recipe)
    data_keys = {"sources", "stories", "dev_stories"}
    data_settings = {k: settings.pop(k) for k in list(settings) if k in data_keys}
    readout = options.pop("readout")
    if readout is not None:
        options["readout"] = _layers(readout)
    if options.get("layer") is not None and readout is None:  # read out the 8 layers up to l_c
        options["readout"] = list(range(max(1, options["layer"] - 7), options["layer"] + 1))
    settings.update({k: v for k, v in options.items() if v is not None})
    obj = ctx.find_root().obj or {}
    device = train_device or obj.get("device", "auto")
    engine = Engine(model=obj.get("model"), device=device)
    out_path = Path(out)
    if data is None:
        data = out_path / "data"
        if not (data / "train.jsonl").is_file():
            data_settings["sources"] = list(sources) or data_settings.get("sources") or ["fairytaleqa-train"]
            config = recipe_mod.DataConfig(**data_settings)
            with ProgressView(enabled=not as_json) as view:
                recipe_mod.convert(data, config, engine.backbone, on_event=view)
    known = {f.name for f in fields(recipe_mod.TrainConfig)}
    config = recipe_mod.TrainConfig(data=str(data), out=str(out_path), device=device,
                                    **{k: v for k, v in settings.items() if k in known})
    with ProgressView(enabled=not as_json) as view:
        summary = recipe_mod.train(config, engine, on_event=view,
                                   log=(lambda line: None) if as_json else (lambda line: stderr.print(line, markup=False)))
    if as_json:
        print_json(summary)
    else:
        stderr.print(f"done: {summary['steps']} steps, best dev recall@{config.k} {summary['best_dev']:.3f}; "
                     f"adapter in {out_path / 'best'}")
