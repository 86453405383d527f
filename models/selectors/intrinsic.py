"""The untrained floor of model-internal selection (UNREAL paper, A.2.1): per attention layer,
the mean-pooled question queries against each chunk's mean-pooled keys, averaged over heads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import register
from .base import Selector

if TYPE_CHECKING:  # numpy is imported where scores are made: the CLI's request checks load this module
    from evsel.store.store import ChunkRecord
    import numpy as np


@register("intrinsic")
class IntrinsicSelector(Selector):
    """The paper's untrained floor (A.2.1): per attention layer, the mean-pooled question queries
    against each chunk's mean-pooled keys, averaged over heads. The per-layer scores are
    standardized over the scope and averaged over `layers` (chosen on FairytaleQA val)."""

    name = "intrinsic"
    needs_model = True
    help = "the backbone's untrained attention floor"
    LAYERS = (1, 2, 3, 4, 5, 6)

    def __init__(self, context, layers: tuple[int, ...] | None = None, **_):
        super().__init__(context)
        self.layers = sorted(layers or self.LAYERS)
        self._encoder = None
        self._scope: tuple[tuple, np.ndarray] | None = None

    def load(self) -> None:
        from evsel.models.unreal import selection as unreal

        if self._encoder is None:
            super().load()
            self._encoder = unreal.IntrinsicEncoder(self.context.backbone, self.layers)

    @property
    def encoder(self):
        self.load()
        return self._encoder

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        self.keys(chunks)

    def keys(self, chunks: list[ChunkRecord]) -> np.ndarray:
        from evsel.models.unreal import selection as unreal

        key = tuple(c.content_hash for c in chunks)
        if self._scope is None or self._scope[0] != key:
            context = self.context
            self._scope = (key, unreal.intrinsic_states(context.backbone, context.states, chunks, self.layers,
                                                        context.on_event))
        return self._scope[1]

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        import numpy as np

        keys = self.keys(chunks)
        query = self.encoder.queries([question])[0]
        per_layer = self.encoder.layer_scores(query, keys)  # (N, |layers|)
        spread = per_layer.std(axis=0, keepdims=True)
        z = (per_layer - per_layer.mean(axis=0, keepdims=True)) / np.where(spread > 0, spread, 1.0)
        return z.mean(axis=1).tolist()
