"""Evidence selectors behind one interface: `rank(question, chunks, top_n)`.

Selectors register by name, so `evsel ask --select NAME` and `evsel eval --methods ...` find
every method the same way. A method (`FIRST` or `FIRST>RERANKER`, each `NAME[:ARGUMENT]`) is
parsed once into a `MethodSpec` here; the pipeline builds its stages from it, so the engine, the
pipeline and eval never name a selector.

The registry also carries what the rest of evsel knows about a selector, from the selector
class's metadata (see `Selector`): the CLI's method list and help (`listing`, `select_help`),
whether a method needs a model (`needs_model`, the daemon's light requests), which ones a
corpus can stand in for (`corpus_first_stages`), the cleanups of files kept beside a store
(`register_cleanups`). A new selector is its module plus a line in `BUILTINS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

# ask --select's and eval --methods' defaults: DEFAULT is the first stage when none is named, and
# eval runs words, a dense baseline and the floor (defined there for the CLI's options)
from evsel.defaults import DEFAULT_METHODS
from evsel.defaults import DEFAULT_SELECT as DEFAULT
from evsel.errors import EvselError

from .base import IngestWork, Ranking, Scored, Selector, SelectorContext, parse_variants

_REGISTRY: dict[str, Callable[..., Selector]] = {}

MEMORY = "memory"  # the variant --memory adds to a reranker that takes it


def register(name: str):
    def wrap(factory):
        _REGISTRY[name] = factory
        return factory

    return wrap


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def selectors() -> list[type[Selector]]:
    """The registered selector classes: the built-ins in `BUILTINS`' order, then any other in the
    order it registered."""
    _load_builtins()
    place = {f"{__name__}.{module}": i for i, module in enumerate(BUILTINS)}
    classes = [factory for factory in _REGISTRY.values() if isinstance(factory, type)]
    return sorted(classes, key=lambda cls: place.get(cls.__module__, len(place)))


def listing() -> list[tuple[str, str]]:
    """Every method a user can name, with what it does: each selector as named (`usage`, else its
    name) and its argument forms worth listing (`ask --list-methods`)."""
    return [pair for cls in selectors() for pair in ((cls.usage or cls.name, cls.help), *cls.forms)]


def select_help() -> str:
    """`--select`'s help: the selectors by name, then those a method names with an argument."""
    plain = [cls.name for cls in selectors() if not cls.usage]
    with_argument = [cls.usage for cls in selectors() if cls.usage]
    return "Selector (variants: --list-methods): " + ", ".join(plain + with_argument) + "."


def corpus_first_stages() -> list[str]:
    """The selectors a corpus's indexes can stand in for as the first stage (ask --corpus)."""
    return [cls.name for cls in selectors() if cls.corpus_first_stage]


def needs_model(method: str) -> bool:
    """Does running `method` (`FIRST` or `FIRST>RERANKER`, each `NAME[:ARGUMENT]`) load a model, the
    backbone or an encoder? False only where every stage's selector is light (ranks with no model:
    the daemon answers an evidence-only ask with it beside model work). `default` counts as
    needing one: resolve it first (selectors.default.resolve). A method no selector takes
    counts as needing one too; building it reports why."""
    _load_builtins()
    try:
        spec = MethodSpec.parse(method)
    except EvselError:
        return True
    for stage in (spec.first, spec.rerank):
        if stage is None:
            continue
        factory = _REGISTRY.get(stage.selector)
        if not getattr(factory, "light", False):
            return True
    return False


def register_cleanups() -> None:
    """Register with the store each selector's cleanup of what it keeps beside a store (the files
    of chunks no longer held, `Selector.on_chunks_deleted`). Every process that deletes chunks
    calls it (the engine does, when built); registering twice is a no-op."""
    from evsel.store.store import Store

    for cls in selectors():
        if cls.on_chunks_deleted.__func__ is not Selector.on_chunks_deleted.__func__:
            Store.on_chunks_deleted(cls.on_chunks_deleted)


@dataclass(frozen=True)
class StageSpec:
    """One stage of a method: `selector[:argument]` (rrf's fused selector, or the variants of
    qrranker and blocksearch), and the text it was given as (how results name it)."""

    selector: str
    argument: str | None = None
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> "StageSpec":
        selector, _, argument = text.partition(":")
        return cls(selector, argument or None, text)

    @property
    def variants(self) -> list[str]:
        """The argument as variants (`untrained+memory`, also comma-separated), in order, each once."""
        return list(dict.fromkeys(v.strip() for v in (self.argument or "").replace(",", "+").split("+")
                                  if v.strip()))


@dataclass(frozen=True)
class MethodSpec:
    """A method: its first stage, an optional reranker of the first stage's top candidates, and
    the text results name it by (as given; `with_memory` rewrites the reranker's part)."""

    first: StageSpec
    rerank: StageSpec | None = None
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> "MethodSpec":
        """`FIRST` or `FIRST>RERANKER` (eval's method names)."""
        first, _, rerank = text.partition(">")
        if not first.strip() or (">" in text and not rerank.strip()):
            raise EvselError(f"method {text!r} is not FIRST or FIRST>RERANKER", "e.g. bm25 or bm25>qrranker")
        return cls(StageSpec.parse(first.strip()), StageSpec.parse(rerank.strip()) if rerank.strip() else None, text)

    @classmethod
    def of(cls, select: str = DEFAULT, rerank: str | None = None) -> "MethodSpec":
        """ask's --select and --rerank, as given."""
        return cls(StageSpec.parse(select), StageSpec.parse(rerank) if rerank else None,
                   select if rerank is None else f"{select}>{rerank}")

    @property
    def name(self) -> str:
        return self.text

    @property
    def memory(self) -> bool:
        return self.rerank is not None and MEMORY in self.rerank.variants

    def takes_memory(self) -> bool:
        """Does the reranker have the memory variant (the candidates' summaries as a prefix)?"""
        _load_builtins()
        factory = _REGISTRY.get(self.rerank.selector.strip()) if self.rerank is not None else None
        return MEMORY in getattr(factory, "variants", ())

    def with_memory(self) -> "MethodSpec":
        """`--memory`: the reranker with its memory variant added (after the ones given); only a
        reranker that has that variant takes it."""
        if not self.takes_memory():
            raise _no_memory_reranker(f"add --rerank {_memory_rerankers()[0]} (or drop --memory)")
        selector = self.rerank.selector.strip()
        factory = _REGISTRY[selector]
        chosen = parse_variants(selector, self.rerank.argument, factory.variants, factory.variant_example)
        argument = "+".join(dict.fromkeys([*chosen, MEMORY]))
        rerank = StageSpec(selector, argument, f"{selector}:{argument}")
        first = self.text.partition(">")[0]
        return MethodSpec(self.first, rerank, f"{first}>{rerank.text}")


def methods_with_memory(methods: list[MethodSpec]) -> list[MethodSpec]:
    """eval's `--memory`: each method whose reranker has the memory variant gets it; others stay."""
    out = [m.with_memory() if m.takes_memory() else m for m in methods]
    if out == methods:
        raise _no_memory_reranker(f"add a method like bm25>{_memory_rerankers()[0]}")
    return out


def _memory_rerankers() -> list[str]:
    _load_builtins()
    return [name for name, factory in _REGISTRY.items() if MEMORY in getattr(factory, "variants", ())]


def _no_memory_reranker(hint: str) -> EvselError:
    return EvselError(f"--memory applies to the {' or '.join(_memory_rerankers())} reranker", hint)


def check_stage(stage: StageSpec) -> str | None:
    """Raise for a stage no selector takes (an unknown name, an argument to one that takes none);
    returns the keyword its argument goes to. `build` and the request checks (daemon/checks.py,
    run by the client before anything is queued) share it."""
    _load_builtins()
    base, arg, name = stage.selector, stage.argument, stage.text
    takes = None
    if arg:
        takes = getattr(_REGISTRY.get(base), "argument", None)
        if takes is None:
            taking = [cls.name for cls in selectors() if cls.argument]
            raise EvselError(f"selector {name!r}: only {', '.join(taking[:-1])} and {taking[-1]} take an argument",
                             "use rrf:OTHER (e.g. rrf:unreal) or qrranker:untrained / qrranker:memory")
    if base not in _REGISTRY:
        raise EvselError(f"unknown selector {name!r}", f"choose one of: {', '.join(sorted(_REGISTRY))}, rrf:OTHER")
    return takes


def build(stage: StageSpec, context: SelectorContext, **kwargs) -> Selector:
    """The selector of a stage, built on `context` (cheap: it loads the model on first use)."""
    takes = check_stage(stage)
    if takes is not None:
        kwargs[takes] = stage.argument
    return _REGISTRY[stage.selector](context, **kwargs)


def get_selector(name: str, context: SelectorContext, **kwargs) -> Selector:
    """A selector by spec: a registered name, rrf:OTHER for BM25 fused with OTHER, or
    qrranker:VARIANT[+VARIANT] (untrained, memory, causal) so one eval run can hold several."""
    return build(StageSpec.parse(name), context, **kwargs)


def ingest_hooks() -> list[type[Selector]]:
    """The selectors with ingest-time work (`Selector.ingest_work`), by `ingest_order`, then the
    registry's order."""
    hooks = [factory for factory in selectors() if factory.ingest_work.__func__ is not Selector.ingest_work.__func__]
    return sorted(hooks, key=lambda factory: factory.ingest_order)


# The built-in selectors, one module each (it registers its class with @register), in the order
# `ask --list-methods` lists them and their ingest work runs (UNREAL's states before QRRanker's KV).
# The modules are light to import: numpy and the model code load where a selector is used.
BUILTINS = (
    "default",  # what ask uses with no --select: the method measured best for the model
    "bm25",
    "hybrid",  # the learned fusion
    "unreal",  # model-internal selection, seed 000
    "intrinsic",
    "dense",  # baselines for evsel eval
    "rrf",
    "random_order",
    "qrranker",  # reranking with QR heads, seed 003
    "blocksearch",  # in-context retrieval by QK routing, seed 001
)


def _load_builtins() -> None:
    for module in BUILTINS:
        importlib.import_module(f"{__name__}.{module}")


__all__ = ["BUILTINS", "DEFAULT", "DEFAULT_METHODS", "IngestWork", "MethodSpec", "check_stage", "Ranking", "Scored",
           "Selector", "SelectorContext", "StageSpec", "available", "build", "corpus_first_stages", "get_selector",
           "ingest_hooks", "listing", "methods_with_memory", "needs_model", "register", "register_cleanups",
           "select_help", "selectors"]
