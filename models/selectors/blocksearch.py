"""BlockSearch (seed 001): ranks the whole scope by the backbone's own routing score at a middle
layer (models/blocksearch/routing.py): by default the query span's calibrated attention through the QR
heads of that layer; `blocksearch:seed` is the seed's QK-MaxSim of the query block's last position,
summed over heads. Each chunk's keys at that layer are cached as files beside the store the
chunks come from (the user's store for ask, eval's cache for eval), or in memory when there is none.

`blocksearch:trained`: the routing's top-B chunks (B = 256, or `topN`) go on to the trained code
decoder (models/blocksearch/decoder.py): each carries a four-digit code, the query block reads them all at
every layer and the digit beam search returns codes, best first. Those chunks lead the ranking in
beam order, then the rest by routing score. `blocksearch:decode`: the same with the untouched
backbone decoding the codes (no adapter), the decoder's untrained baseline.

`blocksearch:router`: routing through the trained router (models/blocksearch/trained_router.py: a LoRA on q/k of
the layers up to L, from `evsel train blocksearch --router --out DIR`; EVSEL_BLOCKSEARCH_ROUTER=DIR,
else the one shipped for the backbone); its keys are cached apart from the untrained ones. The
plain `blocksearch` uses that router too when one is there (EVSEL_BLOCKSEARCH_ROUTER or shipped) and
the scoring is the default one in prefix mode, what it was trained for (measured best,
docs/BLOCKSEARCH.md); `blocksearch:untrained` never does. `blocksearch:shipped` is the router
shipped for the backbone even where EVSEL_BLOCKSEARCH_ROUTER names another (to compare the two).

The key files of chunks deleted from a store are deleted with them (`on_chunks_deleted`, a cleanup
the store runs after the deletion commits, registered by `register_cleanups`); this module stays
light to import: numpy and the model code are imported where used."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from . import base, register
from .base import Selector

if TYPE_CHECKING:  # annotations only: the registry stays light to import (the CLI's help)
    from evsel.store.store import ChunkRecord, Store


TOP_B = {"top16": 16, "top32": 32, "top64": 64, "top128": 128, "top256": 256, "top512": 512}
# routing options (BlockSearchConfig fields), each a change from the default (the measured best:
# QRRanker's scoring at the routing layer, its heads there, the query span's attention, calibrated
# by the null query); "seed" is the score as the seed states it and as first shipped (QK-MaxSim of the
# last query position, every head, uncalibrated)
SCORING = {"question": {"query_tokens": "question"}, "span": {"query_tokens": "span"},
           "last": {"query_tokens": "last"}, "calibrated": {"calibrate": True}, "raw": {"calibrate": False},
           "qr": {"heads": "qr"}, "allheads": {"heads": "all"}, "nosink": {"skip_tokens": 1},
           "seed": {"variant": "maxsim", "query_tokens": "last", "calibrate": False, "heads": "all"},
           "heads": {"variant": "mass", "query_tokens": "span", "calibrate": True, "heads": "qr"}}
# SSMax's s: the seed's init, or one that makes s log N = 1 at an 8K-token scope (the scopes the router
# trained on and FairytaleQA's stories are below it), so only the growth past 8K tokens sharpens
SSMAX_S = {"ssmax": 0.43, "ssmax8k": 1 / math.log(8192)}
VARIANTS = ("mass", "maxsim", *SSMAX_S, "faithful", "prefix", "trained", "decode", "router", "shipped", "untrained",
            *SCORING, *TOP_B)


def parse_variants(text: str | None) -> list[str]:
    return base.parse_variants("blocksearch", text, VARIANTS, BlockSearchSelector.variant_example)


@register("blocksearch")
class BlockSearchSelector(Selector):
    name = "blocksearch"
    needs_model = True
    argument = "variants"
    variants = VARIANTS
    variant_example = "blocksearch:mass+ssmax"
    help = ("in-context retrieval by the backbone's QK routing (QR heads over the question, calibrated; "
            "the trained router where one ships)")
    forms = (
        ("blocksearch:untrained", "... the same without the trained router"),
        ("blocksearch:seed", "... the seed's score: QK-MaxSim of the last position, every head"),
        ("blocksearch:seed+mass+ssmax", "... the seed's attention mass with SSMax"),
        ("blocksearch:faithful", "... routing as the full model attends (slower)"),
        ("blocksearch:router", "... through the trained router (EVSEL_BLOCKSEARCH_ROUTER or the shipped one)"),
        ("blocksearch:shipped", "... through the router shipped for the backbone, even where EVSEL_BLOCKSEARCH_ROUTER "
                                "names another"),
        ("blocksearch:trained", "... its top 256 chunks' codes decoded by the trained decoder"),
        ("blocksearch:trained+top64", "... the same on its top 64"),
        ("blocksearch:decode", "... decoded by the untouched backbone"),
    )
    settings_fields = ("blocksearch_decoder", "blocksearch_router")

    @classmethod
    def on_chunks_deleted(cls, store: Store, hashes: list[str]) -> None:
        """The routing keys cached beside a store for content hashes no chunk holds any more, under
        every model and config (an in-memory store has no files)."""
        from evsel.models.blocksearch import routing as bs
        from evsel.models.shared.caches import store_dir_of

        folder = store_dir_of(store)
        if folder is not None:
            bs.delete_cached_keys(folder, hashes)

    def __init__(self, context, ssmax: bool = False, variant: str | None = None, query_mode: str = "prefix",
                 layer: int | None = None, top_b: int = 256, ssmax_layers: str = "readout",
                 variants: str | None = None, trained: bool = False, decode: bool = False,
                 router: bool | None = None, shipped: bool = False, ssmax_s: float = SSMAX_S["ssmax"], **_):
        """`variant`: maxsim (R^sum of per-head QK-MaxSim) or mass (the query's softmax attention
        onto each chunk at the routing layer); `query_mode`: prefix (the fast path: the query block
        reads the prefix only) or faithful (it reads every chunk below the routing layer, as in the
        seed); `ssmax`: SSMax's s log N (N: the scope's tokens) on the query's scores (changes the
        ranking of mass only; `ssmax_s` its s, `:ssmax8k` the s with s log N = 1 at 8K tokens);
        `trained`: the top-B go on to the trained code decoder."""
        from evsel.models.blocksearch import routing as bs

        super().__init__(context)
        scoring: dict = {}
        chosen = parse_variants(variants)  # the spec's blocksearch:seed+mass+faithful; seed first, the
        for option in sorted(chosen, key=lambda o: o != "seed"):  # others change it (seed+mass)
            if option in SCORING:
                scoring.update(SCORING[option])
            elif option in SSMAX_S:
                if ssmax and ssmax_s != SSMAX_S[option]:
                    from evsel.errors import EvselError

                    raise EvselError("blocksearch:ssmax and :ssmax8k are two settings of s", "choose one of them")
                ssmax, ssmax_s = True, SSMAX_S[option]
            elif option == "trained":
                trained = True
            elif option == "decode":
                decode = True
            elif option == "router":
                router = True
            elif option == "shipped":  # the router shipped for the backbone, whatever is set
                router = shipped = True
            elif option == "untrained":
                router = False
            elif option in TOP_B:
                top_b = TOP_B[option]
            elif option in ("mass", "maxsim"):
                scoring["variant"] = option
            else:
                query_mode = option
        if variant is not None:  # a keyword beats the spec
            scoring["variant"] = variant
        self.config = bs.BlockSearchConfig(layer=layer, top_b=top_b, query_mode=query_mode,
                                           ssmax=bool(ssmax), ssmax_s=ssmax_s, ssmax_layers=ssmax_layers,
                                           **scoring)
        if trained and decode:
            from evsel.errors import EvselError

            raise EvselError("blocksearch:trained and :decode are two decoders", "choose one of them")
        self.trained = bool(trained)
        self.decode = bool(decode)
        if {"router", "shipped"} & set(chosen) and "untrained" in chosen:
            from evsel.errors import EvselError

            raise EvselError(f"blocksearch:{'shipped' if 'shipped' in chosen else 'router'} and :untrained "
                             "contradict each other", "choose one of them")
        self.shipped = bool(shipped)
        # None: the router where one is found and the routing is what it was trained for
        self.use_router = router if router is not None else (
            None if self.scoring_options(self.config) == [] and query_mode == "prefix" else False)
        options = [*self.scoring_options(self.config),
                   *(["shipped"] if self.shipped else ["router"] if self.use_router else []),
                   *(["untrained"] if router is False else []),
                   *(v for v, on in ((query_mode, query_mode != "prefix"),
                                     ("ssmax8k" if ssmax_s == SSMAX_S["ssmax8k"] else "ssmax", bool(ssmax)),
                                     ("trained", self.trained), ("decode", self.decode),
                                     (f"top{top_b}", top_b != 256)) if on)]
        self.name = "blocksearch" + (":" + "+".join(options) if options else "")
        self._router = None
        self._decoder = None
        self._scope: tuple[tuple, object] | None = None
        self.last_routing = None  # the last question's Routing (per-head scores, top-B)

    @staticmethod
    def scoring_options(config) -> list[str]:
        """The spec's options that give `config`'s scoring: "seed" when it is the seed's, else each
        setting that differs from the default."""
        from evsel.models.blocksearch import routing as bs

        default = bs.BlockSearchConfig()
        fields = ("variant", "query_tokens", "calibrate", "heads", "skip_tokens")
        seed = SCORING["seed"]
        out = ["seed"] if all(getattr(config, k) == v for k, v in seed.items() if k != "variant") else []
        base_values = seed if out else {k: getattr(default, k) for k in fields}
        for key in fields:
            value = getattr(config, key)
            if value == base_values.get(key, getattr(default, key)):
                continue
            if key == "variant":
                out.append(value)
            elif key == "skip_tokens":
                out.append("nosink")
            else:
                out.append(next(name for name, setting in SCORING.items() if setting == {key: value}))
        return out

    @property
    def router(self):
        """Built on first use (building the pipeline does not load the model)."""
        from evsel.models.blocksearch import routing as bs
        from evsel.models.shared.blocksparse import BlockStateCache
        from evsel.models.shared.caches import store_dir_of

        if self._router is None:
            context = self.context
            store = context.store if context.store is not None else getattr(context.states, "store", None)
            store_dir = store_dir_of(store)
            with context.resources_lock:  # shared by the engine's selectors (the daemon keeps them)
                memory = context.resources.setdefault("blocksearch.keys", {})
                kv_cache = context.resources.get("blocksearch.kv")
                if kv_cache is None:
                    kv_cache = context.resources["blocksearch.kv"] = BlockStateCache(1 << 30)
                self._router = bs.BlockSearch(context.backbone, self.config, store_dir=store_dir,
                                              memory=None if store_dir else memory, kv_cache=kv_cache,
                                              adapter=self._chosen_adapter())
        return self._router

    def _chosen_adapter(self):
        if self.use_router:
            return self.router_adapter()
        if self.use_router is None:  # the default: the router when one is set or ships
            from evsel.models.shared.lora import ADAPTER_FILE

            folder, named = self.router_folder()
            return self.router_adapter() if named or (folder / ADAPTER_FILE).is_file() else None
        return None

    def router_folder(self) -> tuple[Path, bool]:
        """(where the trained router is, whether EVSEL_BLOCKSEARCH_ROUTER named it). `:shipped`
        reads the shipped one even when the variable is set, so both compare in one run."""
        from evsel.models.blocksearch import trained_router as br

        setting = self.context.settings.blocksearch_router
        if setting and not self.shipped:
            return Path(setting), True
        return br.shipped_router_dir(self.context.backbone.fingerprint), False

    def router_adapter(self):
        """The trained router: EVSEL_BLOCKSEARCH_ROUTER's folder, else the one shipped for the backbone."""
        from evsel.errors import ModelError
        from evsel.models.blocksearch import trained_router as br
        from evsel.models.shared.lora import ADAPTER_FILE

        folder, _ = self.router_folder()
        if not (folder / ADAPTER_FILE).is_file():
            raise ModelError(f"no trained BlockSearch router in {folder}",
                             "train one with: evsel train blocksearch --router --out DIR, then set "
                             "EVSEL_BLOCKSEARCH_ROUTER=DIR (or use --select blocksearch:untrained)")
        return br.load_router_adapter(folder, self.context.backbone.model)

    @property
    def decoder(self):
        """The trained code decoder: EVSEL_BLOCKSEARCH_DECODER's adapter, else the one shipped for
        the backbone; its coded blocks' KV is shared through the engine's resources."""
        from evsel.errors import ModelError
        from evsel.models.blocksearch import decoder as bd
        from evsel.models.shared.lora import ADAPTER_FILE

        if self._decoder is None and self.decode:  # the untouched backbone decodes
            self._decoder = bd.Decoder(self.context.backbone, None, kv_cache=self._decoder_kv())
        if self._decoder is None:
            context = self.context
            backbone = context.backbone
            setting = context.settings.blocksearch_decoder
            folder = Path(setting) if setting else bd.shipped_adapter_dir(backbone.fingerprint)
            if not (folder / ADAPTER_FILE).is_file():
                raise ModelError(f"no trained BlockSearch decoder in {folder}",
                                 "train one with: evsel train blocksearch --out DIR, then set "
                                 "EVSEL_BLOCKSEARCH_DECODER=DIR (or use the untrained --select blocksearch)")
            adapter = bd.load_decoder_adapter(folder, backbone.model)
            self._decoder = bd.Decoder(backbone, adapter, kv_cache=self._decoder_kv())
        return self._decoder

    def _decoder_kv(self):
        """The coded blocks' KV cache, shared by the engine's decoders (the frozen backbone's KV:
        the same whichever adapter reads it)."""
        from evsel.models.shared.blocksparse import BlockStateCache

        context = self.context
        with context.resources_lock:
            kv_cache = context.resources.get("blocksearch.decoder.kv")
            if kv_cache is None:
                kv_cache = context.resources["blocksearch.decoder.kv"] = BlockStateCache(1 << 30)
        return kv_cache

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        self.scope(chunks)

    def scope(self, chunks: list[ChunkRecord]):
        """The scope's packed routing keys (encoded now where not cached: index time)."""
        key = tuple(c.content_hash for c in self.chunks_hashed(chunks))
        if self._scope is None or self._scope[0] != key:
            router = self.router

            def build():
                return router.scope([c.text for c in chunks], list(key), self.context.on_event)

            self._scope = (key, self.context.scope_data("blocksearch", chunks, build, router.digest))
        return self._scope[1]

    @staticmethod
    def chunks_hashed(chunks: list[ChunkRecord]) -> list[ChunkRecord]:
        """Chunks with their content hash (records built in memory may lack one)."""
        from evsel.ingest.chunker import content_hash

        if all(c.content_hash for c in chunks):
            return chunks
        from dataclasses import replace

        return [c if c.content_hash else replace(c, content_hash=content_hash(c.text)) for c in chunks]

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        import numpy as np

        routing = self.router.route(question, self.scope(chunks))
        self.last_routing = routing
        if not (self.trained or self.decode) or not len(chunks):
            return routing.scores.tolist()
        chunks = self.chunks_hashed(chunks)
        routed = sorted(int(i) for i in routing.top)  # the decode set, in document order
        found = self.decoder.rank(question, [chunks[i].text for i in routed], [chunks[i].content_hash for i in routed])
        order = [routed[j] for j, _ in found]
        taken = set(order)
        order += [int(i) for i in np.argsort(-routing.scores, kind="stable") if int(i) not in taken]
        scores = [0.0] * len(chunks)
        for rank, i in enumerate(order):  # the decoded codes first, then routing: a rank as a score
            scores[i] = float(len(order) - rank)
        return scores
