"""Evidence selectors behind one interface: `rank(question, chunks, top_n)`.

Selectors register by name, so `evsel ask --select NAME` and `evsel eval --methods ...` find
every method the same way. A method (`FIRST` or `FIRST>RERANKER`, each `NAME[:ARGUMENT]`) is
parsed once into a `MethodSpec` here; the pipeline builds its stages from it, so the engine, the
pipeline and eval never name a selector.
"""

from __future__ import annotations

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


# What `--select` / `--methods` accept, for help texts (kept in step with the registry by a test).
HELP = ("default (the method measured best for the model: evsel models info says which and why), "
        "bm25 (words), hybrid (BM25 fused with dense, UNREAL and QR-head scores by learned weights; "
        "hybrid:bm25+dense etc. for fewer signals), unreal (the backbone's own states with the trained adapter), "
        "intrinsic (its untrained attention floor), dense (MiniLM bi-encoder), "
        "rrf:METHOD (BM25 fused with METHOD, e.g. rrf:unreal), random, "
        "qrranker (a reranker: the backbone's QR attention heads, e.g. --rerank qrranker; "
        "qrranker:untrained, qrranker:memory, qrranker:causal for its variants), "
        "blocksearch (in-context retrieval by the backbone's QK routing, scored by QRRanker's heads "
        "over the question, calibrated; blocksearch:seed the seed's QK-MaxSim of the last position, "
        "blocksearch:seed+mass+ssmax, blocksearch:faithful for other variants; blocksearch:trained decodes "
        "the top 256 chunks' codes with the trained decoder, blocksearch:trained+top64 the top 64, "
        "blocksearch:decode with the untouched backbone)")


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
            raise EvselError(f"selector {name!r}: only rrf, qrranker and blocksearch take an argument",
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
    """The selectors with ingest-time work (`Selector.ingest_work`), in the registry's order."""
    _load_builtins()
    return [factory for name in _ORDER if isinstance(factory := _REGISTRY.get(name), type)
            and factory.ingest_work.__func__ is not Selector.ingest_work.__func__]


# the built-in selectors' order: the order their ingest work runs in
_ORDER = ("bm25", "dense", "random", "rrf", "intrinsic", "unreal", "qrranker", "blocksearch", "hybrid", "default")


def _load_builtins() -> None:
    from . import bm25  # noqa: F401  (registers itself)
    from . import dense, random_order, rrf  # noqa: F401  (baselines for evsel eval)
    from . import intrinsic, unreal  # noqa: F401  (model-internal selection, seed 000)
    from . import qrranker  # noqa: F401  (reranking with QR heads, seed 003)
    from . import blocksearch  # noqa: F401  (in-context retrieval by QK routing, seed 001)
    from . import hybrid, default  # noqa: F401  (the learned fusion, and what ask uses by default)


# selectors that keep files beside a store register their cleanup when imported; these are light
# to import, so every process that can delete chunks (the engine imports this package) has them
from . import blocksearch, qrranker  # noqa: E402,F401

__all__ = ["DEFAULT", "DEFAULT_METHODS", "HELP", "IngestWork", "MethodSpec", "check_stage", "Ranking", "Scored", "Selector", "SelectorContext",
           "StageSpec", "available", "build", "get_selector", "ingest_hooks", "methods_with_memory", "register"]
