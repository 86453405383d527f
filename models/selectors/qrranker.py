"""QRRanker (seed 003): reranks the candidates it is handed (the pipeline gives it the first
stage's top `--rerank-top`, 50) by the attention of the backbone's QR heads from the question onto
each candidate (models/qrranker/rerank.py). Heads: EVSEL_QRRANKER_HEADS, else the list shipped for the
backbone; a trained adapter (adapter.safetensors) beside that heads.json is applied inside scoring. Block-sparse encoding by default; each candidate's KV is kept in memory between
requests (the engine's resources, so a resident daemon re-encodes only new candidates), and with
EVSEL_QRRANKER_KV in files beside the user's store (models/qrranker/kv.py), which the daemon fills
in the background after an ingest (`encode_store_kv`), so a book's first rerank encodes nothing.
Those files are deleted with the last chunk that holds their text (`on_chunks_deleted`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evsel.errors import EvselError

from . import base, register
from .base import IngestWork, Ranking, Selector, timed_slices

if TYPE_CHECKING:  # annotations only: the registry stays light to import (the CLI's help)
    from evsel.store.store import ChunkRecord, Store

MAX_CANDIDATES = 400  # more than this is a first stage's job: it would take minutes per question
VARIANTS = ("untrained", "memory", "causal")


def parse_variants(text: str | None) -> set[str]:
    """`untrained+memory` -> {"untrained", "memory"} (also comma-separated)."""
    return set(base.parse_variants("qrranker", text, VARIANTS, "qrranker:untrained+memory"))


@register("qrranker")
class QRRankerSelector(Selector):
    name = "qrranker"
    needs_model = True
    argument = "variants"
    variants = VARIANTS
    variant_example = "qrranker:untrained+memory"
    help = "a reranker: the backbone's QR attention heads (--rerank qrranker)"
    forms = (
        ("qrranker:untrained", "... with the untrained heads"),
        ("qrranker:memory", "... reading the block summaries (see --memory)"),
        ("qrranker:causal", "... with one causal prefill of all candidates"),
    )
    settings_fields = ("qrranker_heads", "qrranker_kv", "qrranker_kv_max_mb")

    @classmethod
    def on_chunks_deleted(cls, store: Store, hashes: list[str]) -> None:
        """The block KV files beside a store of content hashes no chunk holds any more, under every
        backbone and config (an in-memory store has none)."""
        from evsel.models.qrranker import kv as qrranker_kv
        from evsel.models.shared.caches import store_dir_of

        folder = store_dir_of(store)
        if folder is not None:
            qrranker_kv.delete_kv_files(folder, hashes)

    def __init__(self, context, heads: str | None = None, encoding: str | None = None, truncate: bool = True,
                 block_labels: str = "same", variants: str | None = None, memory: bool = False, **_):
        """`variants` (the spec's qrranker:VARIANTS): untrained (the heads without their trained
        adapter), memory (the candidates' summaries as a prefix), causal (the seed's encoding).
        The heads and the adapter are resolved by `load` (the backbone's weights are needed)."""
        from evsel.models.qrranker import rerank as qr

        super().__init__(context)
        chosen = parse_variants(variants)
        self.name = "qrranker" + (":" + "+".join(v for v in VARIANTS if v in chosen) if chosen else "")
        self.use_memory = memory or "memory" in chosen
        self.memory_used: list[dict] = []  # the summaries the last scored question read
        self.untrained = "untrained" in chosen
        self.heads_setting = heads or context.settings.qrranker_heads
        encoding = encoding or ("causal" if "causal" in chosen else qr.DEFAULT_ENCODING)
        self.config = qr.ScorerConfig(encoding=encoding, truncate=truncate, block_labels=block_labels)
        self._loaded: dict | None = None  # heads, heads_from, adapter, adapter_from
        self._scorer = None
        self._scope: dict | None = None
        self._blocks = None

    def load(self) -> None:
        """The backbone, the heads and a trained adapter beside them (EVSEL_QRRANKER_HEADS's
        heads.json, or the shipped one), which applies under the encoding it was trained for, with
        the heads it was trained with."""
        from evsel.models.qrranker import rerank as qr

        if self._loaded is not None:
            return
        super().load()
        backbone = self.context.backbone
        encoding, setting = self.config.encoding, self.heads_setting
        heads, heads_from = qr.resolve_heads(backbone, setting, encoding)
        loaded = {"heads": heads, "heads_from": heads_from, "adapter": None, "adapter_from": None}
        folder = None if self.untrained else qr.adapter_folder(backbone, setting)
        if folder is not None:
            adapter = qr.load_adapter(folder, backbone.model)
            if adapter.config.encoding == encoding:
                loaded.update(adapter=adapter, adapter_from=str(folder),
                              heads=[tuple(h) for h in adapter.config.heads] or heads)
        self._loaded = loaded

    def _part(self, key: str):
        self.load()
        return self._loaded[key]

    heads = property(lambda self: self._part("heads"))
    heads_from = property(lambda self: self._part("heads_from"))
    adapter = property(lambda self: self._part("adapter"))
    adapter_from = property(lambda self: self._part("adapter_from"))

    @property
    def scorer(self):
        """Built on first use, so that building the pipeline does not load the model (ask reports
        loading apart)."""
        from evsel.models.qrranker import rerank as qr
        from evsel.models.shared.blocksparse import BlockStateCache

        if self._scorer is None:
            context = self.context
            with context.resources_lock:  # one block-KV cache per engine (the daemon's lives with it)
                kv_cache = context.resources.get("qrranker.kv")
                if kv_cache is None:
                    kv_cache = context.resources["qrranker.kv"] = BlockStateCache()
            self._scorer = qr.QRScorer(context.backbone, self.heads, self.config, kv_cache=kv_cache,
                                      adapter=self.adapter)
            if getattr(context.settings, "qrranker_kv", False) and context.store is not None:
                from evsel.models.shared.caches import store_dir_of

                def warn(message: str) -> None:
                    context.on_event({"type": "warning", "message": message})

                max_bytes = getattr(context.settings, "qrranker_kv_max_mb", None)
                self._scorer.use_kv_files(store_dir_of(context.store),  # eval (no store) stays in memory
                                          max_bytes << 20 if max_bytes else None, warn)
        return self._scorer

    @classmethod
    def ingest_work(cls, chunks: list[ChunkRecord], work: IngestWork) -> dict:
        """With EVSEL_QRRANKER_KV, the block KV files these chunks lack (for the reranker as
        `--rerank qrranker` builds it); with `summaries`, the memory summaries of their blocks."""
        out = {}
        if work.states and work.context.settings.qrranker_kv:
            out["qrranker_kv"] = cls(work.context).encode_missing_kv(chunks, work) if chunks else 0
        if work.summaries:
            out["summaries"] = write_summaries(chunks, work.context) if chunks else 0
        return out

    def missing_states(self, chunks: list[ChunkRecord]) -> int:
        """Chunk texts without a stored block KV file, where the scorer keeps them (none kept, as
        in eval or with EVSEL_QRRANKER_KV=0: it encodes the candidates it scores, as ever)."""
        files = self.scorer.kv_files
        if files is None:
            return 0
        return sum(1 for h in {c.content_hash for c in chunks} if not files.has(h))

    def encode_missing_kv(self, chunks: list[ChunkRecord], work: IngestWork) -> int:
        """The block KV files the chunks lack, written per slice, so a stopped run resumes.
        Returns the chunks encoded (0, silently, where the backbone has no QR heads: the files are on
        by default, and the first `--rerank qrranker` says why it cannot run).
        A full disk stops it (the work is not retried until space is freed: `daemon status` says so)."""
        from evsel.models.qrranker import kv as qrranker_kv

        on_event = self.context.on_event
        try:
            files = self.scorer.kv_files
        except EvselError:  # no QR heads for this backbone: nothing to compute
            return 0
        if files is None:
            return 0
        if qrranker_kv.disk_still_full(files.top):
            return 0
        chunks = list({c.content_hash: c for c in chunks}.values())
        missing = [c for c in chunks if not files.has(c.content_hash)]

        def progress(done: int) -> None:
            on_event({"type": "progress", "task": "encode", "label": "QRRanker block KV",
                      "done": len(chunks) - len(missing) + done, "total": len(chunks)})

        try:
            if work.slice_s is not None:
                timed_slices(missing, self.encode_store_kv, work.slice_s, progress, most=work.batch)
            else:
                for start in range(0, len(missing), work.batch):
                    progress(start)
                    self.encode_store_kv(missing[start:start + work.batch])
                progress(len(missing))
        except OSError as exc:
            if not qrranker_kv.disk_is_full(exc):
                raise
            # one line now (in-process it was nowhere); daemon status keeps saying it until freed
            on_event({"type": "warning", "message": qrranker_kv.note_disk_full(files.top)})
            return sum(1 for c in missing if files.has(c.content_hash))
        return len(missing)

    def encode_store_kv(self, chunks: list[ChunkRecord]) -> int:
        """Write the block KV files these chunks lack (ingest's background work). Returns the
        chunks encoded (0 where the scorer keeps no files). A file written for a chunk that was
        removed meanwhile (`docs rm` during the write) is deleted again."""
        scorer = self.scorer
        if scorer.kv_files is None:
            return 0
        written = scorer.store_kv([c.text for c in chunks], [c.content_hash for c in chunks])
        store = self.context.store
        if written and store is not None:
            hashes = {c.content_hash for c in chunks}
            gone = hashes - store.held_hashes(hashes)
            if gone:
                scorer.kv_files.files.delete(gone)
        return written

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        """Eval hands the whole scope first: the memory's blocks come from it (ask reads the
        candidates' documents from the store)."""
        self._scope = {c.id: c for c in chunks}
        self._blocks = None

    def ranking(self, question: str, chunks: list[ChunkRecord], top_n: int | None = None) -> Ranking:
        """With the memory variant, "memory": the summaries the question's candidates read."""
        ranked = self.rank(question, chunks, top_n)
        return Ranking(ranked, {"memory": self.memory_used} if self.use_memory else {})

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        if len(chunks) > MAX_CANDIDATES:
            raise EvselError(f"qrranker reranks at most {MAX_CANDIDATES} candidates; this scope has {len(chunks)}",
                             "use it as a reranker: --rerank qrranker (over the first stage's --rerank-top)")
        memory = None
        if self.use_memory:
            from evsel.models.qrranker.memory import memory_text

            self.memory_used = self._memory(chunks)
            memory = memory_text(self.memory_used) or None
        return self.scorer.scores(question, [c.text for c in chunks], memory).tolist()

    def _memory(self, candidates: list[ChunkRecord]) -> list[dict]:
        """The summaries covering the candidates (written now where missing), within the budget."""
        from evsel.models.qrranker import memory as mem

        doc_ids = sorted({c.doc_id for c in candidates})
        scope = self._scope
        if scope and all(c.id in scope for c in candidates):
            whole = [c for c in scope.values() if c.doc_id in set(doc_ids)]
        elif self.context.store is not None:
            whole = self.context.store.chunks(doc_ids)
        else:
            whole = list(candidates)
        cache_key = tuple(doc_ids)
        if self._blocks is None or self._blocks[0] != cache_key:
            self._blocks = (cache_key, mem.blocks_of(whole))
        blocks = self._blocks[1]
        writer = mem.SummaryWriter(self.context.backbone, self.context.states.store)
        ids = {c.id for c in candidates}
        covering = [b for b in blocks if any(c.id in ids for c in b.chunks)]
        summaries = writer.ensure(covering, self.context.on_event, "writing summaries for the memory prefix")
        return mem.memory_for(candidates, covering, summaries, [writer.key(b) for b in covering],
                              lambda text: len(self.context.backbone.tokenizer(text, add_special_tokens=False)
                                               ["input_ids"]))


def write_summaries(chunks: list[ChunkRecord], context) -> int:
    """The memory summaries (models/qrranker/memory.py) of these chunks' blocks that are missing; returns
    how many were written."""
    from evsel.models.qrranker import memory

    writer = memory.SummaryWriter(context.backbone, context.store)
    missing = writer.missing(memory.blocks_of(chunks))
    writer.ensure(missing, context.on_event, "writing summaries")
    return len(missing)
