"""BlockSearch (seed 001), untrained: ranks the whole scope by the backbone's own routing score at
a middle layer (QK-MaxSim of the query block's last position against each chunk's keys, summed
over heads; models/blocksearch.py). Each chunk's keys at that layer are cached as files beside
the store the chunks come from (the user's store for ask, eval's cache for eval), or in memory
when there is none."""

from __future__ import annotations

from evsel.store import ChunkRecord

from . import base, register
from .base import Selector


VARIANTS = ("mass", "maxsim", "ssmax", "faithful", "prefix")


def parse_variants(text: str | None) -> list[str]:
    return base.parse_variants("blocksearch", text, VARIANTS, "blocksearch:mass+ssmax")


@register("blocksearch")
class BlockSearchSelector(Selector):
    name = "blocksearch"
    needs_model = True

    def __init__(self, context, ssmax: bool = False, variant: str = "maxsim", query_mode: str = "prefix",
                 layer: int | None = None, top_b: int = 256, ssmax_layers: str = "readout",
                 variants: str | None = None, **_):
        """`variant`: maxsim (R^sum of per-head QK-MaxSim) or mass (the query's softmax attention
        onto each chunk at the routing layer); `query_mode`: prefix (the fast path: the query block
        reads the prefix only) or faithful (it reads every chunk below the routing layer, as in the
        seed); `ssmax`: SSMax's s log N on the query's scores (changes the ranking of mass only)."""
        from evsel.models import blocksearch as bs

        super().__init__(context)
        for option in parse_variants(variants):  # the spec's blocksearch:mass+ssmax+faithful
            if option == "ssmax":
                ssmax = True
            elif option in ("mass", "maxsim"):
                variant = option
            else:
                query_mode = option
        self.config = bs.BlockSearchConfig(layer=layer, top_b=top_b, variant=variant, query_mode=query_mode,
                                           ssmax=bool(ssmax), ssmax_layers=ssmax_layers)
        options = [v for v, on in ((variant, variant != "maxsim"), (query_mode, query_mode != "prefix"),
                                   ("ssmax", bool(ssmax))) if on]
        self.name = "blocksearch" + (":" + "+".join(options) if options else "")
        self._router = None
        self._scope: tuple[tuple, object] | None = None
        self.last_routing = None  # the last question's Routing (per-head scores, top-B)

    @property
    def router(self):
        """Built on first use (building the pipeline does not load the model)."""
        from evsel.models import blocksearch as bs
        from evsel.models import qrranker as qr

        if self._router is None:
            context = self.context
            store = context.store if context.store is not None else getattr(context.states, "store", None)
            store_dir = bs.store_dir_of(store)
            with context.resources_lock:  # shared by the engine's selectors (the daemon keeps them)
                memory = context.resources.setdefault("blocksearch.keys", {})
                kv_cache = context.resources.get("blocksearch.kv")
                if kv_cache is None:
                    kv_cache = context.resources["blocksearch.kv"] = qr.BlockKVCache(1 << 30)
                self._router = bs.BlockSearch(context.backbone, self.config, store_dir=store_dir,
                                              memory=None if store_dir else memory, kv_cache=kv_cache)
        return self._router

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        self.scope(chunks)

    def scope(self, chunks: list[ChunkRecord]):
        """The scope's packed routing keys (encoded now where not cached: index time)."""
        key = tuple(c.content_hash for c in self.chunks_hashed(chunks))
        if self._scope is None or self._scope[0] != key:
            router = self.router

            def build():
                return router.scope([c.text for c in chunks], list(key), self.context.on_event)

            self._scope = (key, self.context.memo("blocksearch", chunks, build, router.digest))
        return self._scope[1]

    @staticmethod
    def chunks_hashed(chunks: list[ChunkRecord]) -> list[ChunkRecord]:
        """Chunks with their content hash (records built in memory may lack one)."""
        from evsel.models.blocksearch import content_hash

        if all(c.content_hash for c in chunks):
            return chunks
        from dataclasses import replace

        return [c if c.content_hash else replace(c, content_hash=content_hash(c.text)) for c in chunks]

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        routing = self.router.route(question, self.scope(chunks))
        self.last_routing = routing
        return routing.scores.tolist()
