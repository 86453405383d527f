"""Random order: the floor every selector must beat. Seeded by the question, so a run is
reproducible and every method sees the same question get the same draw."""

from __future__ import annotations

import hashlib
import random
from typing import TYPE_CHECKING

from . import register
from .base import Selector

if TYPE_CHECKING:  # annotations only: the registry stays light to import (the CLI's help)
    from evsel.store.store import ChunkRecord

DEFAULT_SEED = 0


@register("random")
class RandomSelector(Selector):
    name = "random"
    needs_model = False
    help = "random passages (a baseline)"
    light = True

    def __init__(self, context, seed: int = DEFAULT_SEED, **_):
        super().__init__(context)
        self.seed = seed

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        # sha256, not hash(): Python salts str hashes per process
        digest = hashlib.sha256(f"{self.seed}\n{question}".encode("utf-8")).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        return [rng.random() for _ in chunks]
