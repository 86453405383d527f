"""Evidence selectors behind one interface: `rank(question, chunks, top_n)`.

Selectors register by name, so `evsel ask --select NAME` and `evsel eval --methods ...` find
every method the same way.
"""

from __future__ import annotations

from typing import Callable

from evsel.errors import EvselError

from .base import Scored, Selector

_REGISTRY: dict[str, Callable[..., Selector]] = {}


def register(name: str):
    def wrap(factory):
        _REGISTRY[name] = factory
        return factory

    return wrap


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_selector(name: str, **kwargs) -> Selector:
    _load_builtins()
    if name not in _REGISTRY:
        raise EvselError(f"unknown selector {name!r}", f"choose one of: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**kwargs)


def _load_builtins() -> None:
    from . import bm25  # noqa: F401  (registers itself)
    from . import dense, random_order, rrf  # noqa: F401  (baselines for evsel eval)
    from . import intrinsic, unreal  # noqa: F401  (model-internal selection, seed 000)


__all__ = ["Scored", "Selector", "register", "available", "get_selector"]
