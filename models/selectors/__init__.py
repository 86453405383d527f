"""Evidence selectors behind one interface: `rank(question, chunks, top_n)`.

Selectors register by name, so `evsel ask --select NAME` and `evsel eval --methods ...` find
every method the same way.
"""

from __future__ import annotations

from typing import Callable

from evsel.errors import EvselError

from .base import Scored, Selector, SelectorContext

_REGISTRY: dict[str, Callable[..., Selector]] = {}


def register(name: str):
    def wrap(factory):
        _REGISTRY[name] = factory
        return factory

    return wrap


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


# What `--select` / `--methods` accept, for help texts (kept in step with the registry by a test).
HELP = ("bm25 (default; words), unreal (the backbone's own states with the trained adapter), "
        "intrinsic (its untrained attention floor), dense (MiniLM bi-encoder), "
        "rrf:METHOD (BM25 fused with METHOD, e.g. rrf:unreal), random, "
        "qrranker (a reranker: the backbone's QR attention heads, e.g. --rerank qrranker; "
        "qrranker:untrained, qrranker:memory, qrranker:causal for its variants), "
        "blocksearch (in-context retrieval by the backbone's QK routing; blocksearch:mass, "
        "blocksearch:mass+ssmax, blocksearch:faithful for its variants; blocksearch:trained decodes "
        "the top 256 chunks' codes with the trained decoder, blocksearch:trained+top64 the top 64, "
        "blocksearch:decode with the untouched backbone)")


def get_selector(name: str, context: SelectorContext, **kwargs) -> Selector:
    """A selector by spec: a registered name, rrf:OTHER for BM25 fused with OTHER, or
    qrranker:VARIANT[+VARIANT] (untrained, memory, causal) so one eval run can hold several."""
    _load_builtins()
    base, _, arg = name.partition(":")
    if arg:
        if base == "rrf":
            kwargs["other"] = arg
        elif base in ("qrranker", "blocksearch"):
            kwargs["variants"] = arg
        else:
            raise EvselError(f"selector {name!r}: only rrf, qrranker and blocksearch take an argument",
                             "use rrf:OTHER (e.g. rrf:unreal) or qrranker:untrained / qrranker:memory")
    if base not in _REGISTRY:
        raise EvselError(f"unknown selector {name!r}", f"choose one of: {', '.join(sorted(_REGISTRY))}, rrf:OTHER")
    return _REGISTRY[base](context, **kwargs)


def _load_builtins() -> None:
    from . import bm25  # noqa: F401  (registers itself)
    from . import dense, random_order, rrf  # noqa: F401  (baselines for evsel eval)
    from . import intrinsic, unreal  # noqa: F401  (model-internal selection, seed 000)
    from . import qrranker  # noqa: F401  (reranking with QR heads, seed 003)
    from . import blocksearch  # noqa: F401  (in-context retrieval by QK routing, seed 001)


__all__ = ["HELP", "Scored", "Selector", "SelectorContext", "register", "available", "get_selector"]
