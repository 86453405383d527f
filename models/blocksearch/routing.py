"""BlockSearch (seed 001): in-context retrieval by the backbone's own QK routing. This is the router;
the code decoder the routed chunks go on to (blocksearch:trained and :decode) is
models/blocksearch/decoder.py.

Routing prompt (the seed's Appx. A, without its random document codes: routing reads none; the
decoder builds its own coded blocks for the top-B):

    <chat header> Here are some documents:            <- prefix, shared (positions 0..P-1)
    \\n\\nchunk text                                     <- every chunk a block: attends to the prefix
    ...                                                   and itself only, positions P..P+L_i-1
    \\n\\nWhich document ... query?\\n\\nQuery: q<footer>   <- the query block, at the fixed position
                                                         P + query_offset, attending to everything

Encoding is models/shared/blocksparse.py's block-sparse encoder (`encode_prefix`, `encode_blocks`: one
encoder for every method), truncated after the routing layer L (depth L + 1). A chunk's keys depend
only on the prefix and its own tokens, so what routing reads of it, its post-RoPE keys at layer L
(kv_heads, L_i, head_dim), is cached per chunk content hash on disk (an `ArrayCache`).

Routing score. The seed's (Sec. 4.1 and 5.1; `blocksearch:seed`): at the query block's LAST
position, the post-RoPE query q_h of every head h at layer L; per head QK-MaxSim(d) = max over d's
text tokens t of q_h . k_t * scaling (query head h reads KV head h // (H / kv_heads)); R^sum(d) = sum
over heads. That last position is a next-token state: its scores hardly depend on the question
(docs/BLOCKSEARCH.md, "Diagnosis"). The default reads the query as QRRanker does: the query
span's rows (instruction, question, chat footer: `query_tokens`), each row's softmax attention
onto each chunk's text tokens averaged over the rows (variant "mass"), minus the same for the null
query "N/A" (`calibrate`; in prefix mode the null query's scores depend on the scope alone and are
kept per scope), summed over the QR heads that QRRanker detected at layer L (`heads`).
The top-B chunks go on to the code decoder (blocksearch:trained, :decode); otherwise the score
itself ranks the scope.
Variant "mass": the query's softmax attention at layer L onto each chunk's text tokens (softmax
over the prefix, every chunk of the scope and the query's own tokens up to the row), summed over
heads: the quantity that dilutes as N grows (the seed's Sec. 4.2), where SSMax changes the ranking.

SSMax: the pre-softmax scores of the query's rows multiplied by s * log N (s = 0.43, the seed's
init; N = the scope's tokens, the keys the query's softmax runs over, as SSMax defines it: every
logit of the row, prefix, chunks and the query's own tokens, is scaled alike, and the null query's
rows get the same factor, so the calibrated mass is the difference of two SSMax softmaxes). For
MaxSim this is one positive factor for every head and chunk: a monotone rescale that leaves the
ranking as it is (reported scores change, order does not). For the attention mass it sharpens the
softmax and does change the ranking. `ssmax_layers="all"`
(faithful mode) also applies it to the query block's attention in every layer below L (the
seed's BlockSearch-SSMax, here on the frozen model; chunk blocks are untouched).

Two query modes:
- "faithful": the query block attends to the prefix and all chunks' KV at every layer up to L,
  as in the seed, so its query vector at L depends on the scope. Cost: every chunk's K and V of
  layers 0..L must be held (blocksparse's in-memory BlockStateCache; SmolLM2 at L=17 in bf16: 18 layers
  x 768 B = 13.8 KB per token, ~190 MB for the 14K-token sample story, ~1.9 GB for a 134K-token novel,
  ~190 GB for 10^5 chunks), re-encoded when evicted, and each question runs a query pass that
  attends over all of it (linear in scope tokens, per layer). A scope over `group_tokens` goes in
  groups of chunks sharing the prefix, each with its own query pass: a chunk is then scored with
  the query vector of its own group (exact for one group, an approximation beyond; the attention
  mass still normalises over the whole scope).
- "prefix" (the fast path, the default): the query block attends to the prefix only. Its query
  vector is independent of the scope (one short pass per question, cached), and routing is a pure
  lookup of cached keys: one (H x T) product per question over the scope's keys, no chunk
  re-encoded. It is not the seed's model (the query never reads the chunks below L).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from evsel.ingest.chunker import content_hash
from evsel.errors import ModelError
from evsel.models.shared.blocksparse import (
    BlockStateCache,
    BlockStates,
    Context,
    Prompt,
    PromptConfig,
    encode_blocks,
    encode_blocks_cached,
    encode_prefix,
    suffix_states,
)
from evsel.models.blocksearch.scoring import PackedKeys, attention_mass, maxsim, pack, ssmax_factor
from evsel.models.shared.caches import ArrayCache, LRUCache, config_digest, delete_chunk_files, method_root
from evsel.models.shared.qr_heads import shipped_heads

METHOD = "blocksearch"
KEYS_FORMAT = 1  # bump when what a cached key file holds changes
VARIANTS = ("maxsim", "mass")
QUERY_MODES = ("prefix", "faithful")
QUERY_TOKENS = ("last", "question", "span")
HEAD_SETS = ("all", "qr")
SSMAX_LAYERS = ("readout", "all")
STORAGE_DTYPES = {"fp16": np.float16, "fp32": np.float32}
ENCODE_TOKENS = 8192  # block tokens encoded between two cache writes (bounds the KV held)


def default_prompt() -> PromptConfig:
    """The pieces of BlockSearch's prompt; the query pieces follow the seed's query block
    (instruction, then the query, then the answer slot: here the assistant header)."""
    return PromptConfig(instruction="Here are some documents:",
                           closing="Which document above answers the following query?",
                           query_label="Query:", separator="\n\n", max_chunk_tokens=384, max_query_tokens=96)


def default_layer(n_layers: int) -> int:
    """The routing layer (0-based): the seed routes at L16 of Qwen3-0.6B's 28 layers, just above
    the layers that build relevance (its retrieval band L11-L20). At the same relative depth
    SmolLM2's 30 layers give 17, inside the band where its untrained QR heads were found (14-23);
    encoding stops right after it."""
    return max(0, min(n_layers - 1, round(n_layers * 16 / 28)))


@dataclass
class BlockSearchConfig:
    layer: int | None = None  # routing layer L, 0-based (None: default_layer of the model)
    top_b: int = 256  # chunks routed on to the layers above L (the seed's B)
    variant: str = "mass"  # maxsim: R^sum of QK-MaxSim | mass: softmax attention mass at L
    query_mode: str = "prefix"  # prefix: the query reads the prefix only (fast) | faithful
    ssmax: bool = False  # multiply the query's pre-softmax scores by ssmax_s * log N (N: scope tokens)
    ssmax_s: float = 0.43  # the seed's (and SSMax's) initial s
    ssmax_layers: str = "readout"  # readout: at the routing layer only | all: every layer <= L (faithful)
    dtype: str = "fp16"  # the cached keys' storage type (fp16 | fp32)
    query_offset: int | None = None  # query block position - prefix length (None: longest block)
    batch_tokens: int = 4096  # block tokens per encoder batch
    group_tokens: int = 16384  # faithful mode: block tokens one query pass reads (~220 MB of KV for SmolLM2)
    query_tokens: str = "span"  # the query rows read: last (the next-token state, the seed's) |
    # question (the question's own tokens) | span (the query span after the separator, as QRHead): averaged
    calibrate: bool = True  # subtract the same score for the null query "N/A" (QRHead's calibration)
    heads: str = "qr"  # the heads summed: all | qr (QRRanker's detected heads at the routing layer)
    skip_tokens: int = 0  # each block's first text tokens left out of the score (after the RoPE restart)
    prompt: PromptConfig = field(default_factory=default_prompt)

    def __post_init__(self) -> None:
        checks = [("variant", self.variant, VARIANTS), ("query_mode", self.query_mode, QUERY_MODES),
                  ("query_tokens", self.query_tokens, QUERY_TOKENS), ("heads", self.heads, HEAD_SETS),
                  ("ssmax_layers", self.ssmax_layers, SSMAX_LAYERS), ("dtype", self.dtype, tuple(STORAGE_DTYPES))]
        for name, value, allowed in checks:
            if value not in allowed:
                raise ModelError(f"unknown BlockSearch {name} {value!r}", f"use one of {', '.join(allowed)}")
        if self.ssmax_layers == "all" and self.query_mode != "faithful":
            raise ModelError("SSMax in the layers below the routing layer needs the faithful query mode",
                             "use query_mode=faithful, or ssmax_layers=readout")
        if self.top_b < 1:
            raise ModelError("top_b must be at least 1")
        if self.skip_tokens < 0:
            raise ModelError("skip_tokens must be 0 or more")

    def resolved(self, n_layers: int) -> BlockSearchConfig:
        layer = default_layer(n_layers) if self.layer is None else int(self.layer)
        if not 0 <= layer < n_layers:
            raise ModelError(f"routing layer {layer} is not in this model (layers 0..{n_layers - 1})")
        return replace(self, layer=layer)

    def to_dict(self) -> dict:
        return asdict(self)


def key_digest(layer: int, dtype: str, model_dtype: str, prefix: list[int], separator: list[int],
               max_chunk_tokens: int, adapter: str | None = None) -> str:
    """What a chunk's cached keys depend on besides its text and the weights: the layer, the
    storage and compute types, the prefix, how a block is cut and the trained router's digest
    (`adapter`; the untrained digest stays as it was). (The query pieces do not enter: changing
    the question template keeps the keys.)"""
    data = {"format": KEYS_FORMAT, "layer": layer, "dtype": dtype, "model_dtype": model_dtype,
            "prefix": list(prefix), "separator": list(separator), "max_chunk_tokens": max_chunk_tokens}
    if adapter is not None:
        data["router_adapter"] = adapter
    return config_digest(data)


# ---------------------------------------------------------------------------------------------
# the per-chunk key cache: .npy files beside the store (models/shared/caches.py's layout)


def cache_root(store_dir: str | Path) -> Path:
    return method_root(store_dir, METHOD)


def cache_folder(store_dir: str | Path, fingerprint: str, digest: str) -> Path:
    """<store dir>/blocksearch/<model fingerprint>/<config digest>/: one <content hash>.npy a chunk."""
    return cache_root(store_dir) / fingerprint / digest


def delete_cached_keys(store_dir: str | Path, hashes) -> int:
    """Delete the key files of these content hashes under every model and config of a store."""
    return delete_chunk_files(store_dir, METHOD, hashes)


def bytes_per_token(model_config, dtype: str = "fp16") -> int:
    """Cached bytes a chunk token costs: its keys at one layer (kv_heads x head_dim); each file
    adds a 128-byte .npy header."""
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    return int(model_config.num_key_value_heads * head_dim * np.dtype(STORAGE_DTYPES[dtype]).itemsize)


@contextmanager
def _scaled_attention(model, layers: list[int], factor: float):
    """The attention scaling of `layers` multiplied by `factor` for the passes inside (SSMax on the
    query block: only its rows are computed in a suffix pass over cached context KV)."""
    modules = [model.model.layers[layer].self_attn for layer in layers]
    before = [m.scaling for m in modules]
    try:
        for m in modules:
            m.scaling = m.scaling * factor
        yield
    finally:
        for m, value in zip(modules, before):
            m.scaling = value


# ---------------------------------------------------------------------------------------------
# the router


@dataclass
class Scope:
    """The chunks routed over: content hashes, block token ids (separator + text) and the packed
    routing keys."""

    hashes: list[str]
    blocks: list[list[int]]
    packed: PackedKeys

    @property
    def n(self) -> int:
        return len(self.hashes)


@dataclass
class Routing:
    scores: np.ndarray  # (N,) float64: R^sum (maxsim) or the attention mass summed over heads (mass)
    per_head: np.ndarray  # (N, H) float64
    top: np.ndarray  # the top-B chunk indices, best first
    factor: float  # the multiplier on the routing layer's logits (SSMax's s log N, else 1)
    groups: int  # query passes (faithful mode: groups of chunks; prefix mode: 1)


class BlockSearch:
    """The untrained BlockSearch router of one backbone: encodes chunks block-sparse up to the
    routing layer (keys cached per chunk), runs the query block, scores the scope."""

    def __init__(self, backbone, config: BlockSearchConfig | None = None, store_dir: str | Path | None = None,
                 memory: dict | None = None, kv_cache: BlockStateCache | None = None, adapter=None):
        """`store_dir`: key files go under <store_dir>/blocksearch/ (None: in memory; `memory`, a
        dict shared between routers, keeps one in-memory ArrayCache per config digest). `kv_cache`:
        the full per-block KV the faithful mode reads (None: a private one). `adapter`: a trained
        router (models/blocksearch/trained_router.py) applied to every pass; its digest keys the key files."""
        self.adapter = adapter
        self.adapter_digest = adapter.digest() if adapter is not None else None
        self.backbone = backbone
        self.model = backbone.model
        cfg = self.model.config
        self.config = (config or BlockSearchConfig()).resolved(cfg.num_hidden_layers)
        self.layer = int(self.config.layer)
        self.depth = self.layer + 1  # truncated forward: nothing above the routing layer runs
        self.n_heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scaling = float(self.model.model.layers[self.layer].self_attn.scaling)
        self.prompt = Prompt(backbone.tokenizer, self.config.prompt)
        self.prefix_ids = self.prompt.prefix()
        self.separator = self.prompt.ids(self.config.prompt.separator)
        offset = self.config.query_offset
        self.query_offset = len(self.separator) + self.config.prompt.max_chunk_tokens if offset is None else offset
        self.model_dtype = str(next(self.model.parameters()).dtype).replace("torch.", "")
        self.storage = STORAGE_DTYPES[self.config.dtype]
        self.digest = key_digest(self.layer, self.config.dtype, self.model_dtype, self.prefix_ids, self.separator,
                                 self.config.prompt.max_chunk_tokens, self.adapter_digest)
        if store_dir is not None:
            folder = cache_folder(store_dir, backbone.fingerprint, self.digest)
            self.keys = ArrayCache(folder, top=cache_root(store_dir))
        elif memory is not None:
            self.keys = memory.setdefault(self.digest, ArrayCache(None))
        else:
            self.keys = ArrayCache(None)
        self.kv_cache = kv_cache if kv_cache is not None else BlockStateCache()
        self.model_key = f"{backbone.fingerprint}:{self.model_dtype}" + (
            f":router-{self.adapter_digest}" if adapter is not None else "")
        self.pad_id = backbone.tokenizer.pad_token_id or 0
        self.encoded = 0  # blocks this router encoded (tests, reports)
        self._prefix_kv = None
        self.prefix_queries = LRUCache(max_items=256)  # prefix mode: question -> (q, own keys)
        self._block_ids = LRUCache(max_items=1 << 16)  # content hash -> block ids (`blocks_of`)
        self._rope_checked = False
        self._null_kept = None  # prefix mode: (packed keys, SSMax factor, the null query's scores)
        self._head_mask = None
        self.head_source = ""

    def _adapted(self):
        """The trained router's deltas inside the passes (none without one)."""
        from evsel.models.blocksearch.trained_router import adapted

        return adapted(self.model, self.adapter)

    # pieces
    @property
    def prefix_len(self) -> int:
        return len(self.prefix_ids)

    @property
    def query_position(self) -> int:
        """Where the query block starts: a fixed offset after the prefix, whatever the scope."""
        return self.prefix_len + self.query_offset

    @property
    def bytes_per_token(self) -> int:
        return bytes_per_token(self.model.config, self.config.dtype)

    def blocks(self, texts: list[str]) -> list[list[int]]:
        """Block ids: separator + the text's tokens (cut at max_chunk_tokens; an empty text is the
        EOS token, so every block has a token to score)."""
        tok = self.backbone.tokenizer
        limit = self.config.prompt.max_chunk_tokens
        bodies = tok([t.strip() for t in texts], add_special_tokens=False)["input_ids"] if texts else []
        return [self.separator + (list(b[:limit]) or [tok.eos_token_id or 0]) for b in bodies]

    def blocks_of(self, texts: list[str], hashes: list[str]) -> list[list[int]]:
        """`blocks`, kept per content hash: a scope routed again (a new question over a large
        scope, or one chunk more) does not tokenize its chunks again."""
        out = [self._block_ids.get(h) for h in hashes]
        todo = [i for i, b in enumerate(out) if b is None]
        if todo:
            for i, block in zip(todo, self.blocks([texts[i] for i in todo])):
                out[i] = block
                self._block_ids.put(hashes[i], block)
        return out

    def suffix(self, question: str) -> list[int]:
        return self.prompt.suffix(question)[0]

    @property
    def prefix_kv(self) -> list[tuple]:
        if self._prefix_kv is None:
            with self._adapted():
                self._prefix_kv = encode_prefix(self.model, self.prefix_ids, self.depth)
        return self._prefix_kv

    # encoding
    def encode_keys(self, blocks: list[list[int]]) -> list:
        """Post-RoPE keys (kv, L_i, d) at the routing layer of blocks encoded block-sparse after the
        prefix, through layer L only (blocksparse's encoder), as torch tensors of the model's type."""
        prefix_kv = self.prefix_kv
        with self._adapted():
            states = encode_blocks(self.model, prefix_kv, blocks, self.config.batch_tokens, self.pad_id)
        self.encoded += len(blocks)
        return [b[self.layer][0] for b in states.blocks]

    def _full_states(self, blocks: list[list[int]]) -> BlockStates:
        """Every layer's KV up to L of `blocks` (faithful mode), through the in-memory KV cache."""
        cache = self.kv_cache
        prefix_cached = cache.get(cache.key("prefix", self.model_key, self.depth, self.prefix_ids)) is not None
        before = cache.misses
        with self._adapted():
            states = encode_blocks_cached(self.model, self.prefix_ids, blocks, self.depth, cache,
                                          self.config.batch_tokens, self.pad_id, self.model_key)
        self.encoded += cache.misses - before - (0 if prefix_cached else 1)
        return states

    def scope(self, texts: list[str], hashes: list[str] | None = None, on_event=None) -> Scope:
        """The routing keys of `texts` (content hashes: computed when not given): read from the
        key cache, the rest encoded now (in slices, each written as it is done)."""
        hashes = list(hashes) if hashes is not None else [content_hash(t) for t in texts]
        blocks = self.blocks_of(texts, hashes)
        shape = {h: (self.kv_heads, len(b), self.head_dim) for h, b in zip(hashes, blocks)}
        found: dict = {}
        for h in dict.fromkeys(hashes):
            array = self.keys.get(h, shape[h], self.storage)
            if array is not None:
                found[h] = array
        block_of = dict(zip(hashes, blocks))
        missing = [h for h in dict.fromkeys(hashes) if h not in found]
        if missing and on_event:
            on_event({"type": "progress", "task": "encode", "label": f"BlockSearch keys (layer {self.layer})",
                      "done": 0, "total": len(missing)})
        done = 0
        budget = self.config.group_tokens if self.config.query_mode == "faithful" else ENCODE_TOKENS
        for part in _slices(missing, [len(block_of[h]) for h in missing], budget):
            part_blocks = [block_of[h] for h in part]
            if self.config.query_mode == "faithful":  # keep the full KV the query pass reads
                keys = [b[self.layer][0] for b in self._full_states(part_blocks).blocks]
            else:
                keys = self.encode_keys(part_blocks)
            fresh = {h: self._storable(k) for h, k in zip(part, keys)}
            self.keys.put_many(fresh)
            found.update(fresh)
            done += len(part)
            if on_event:
                on_event({"type": "progress", "task": "encode", "label": f"BlockSearch keys (layer {self.layer})",
                          "done": done, "total": len(missing)})
        start = len(self.separator)
        return Scope(hashes, blocks, pack([found[h] for h in hashes], start))

    def _storable(self, keys) -> np.ndarray:
        array = keys.float().cpu().numpy().astype(self.storage)
        if not np.isfinite(array).all():
            raise ModelError(f"routing keys at layer {self.layer} overflow {self.config.dtype}",
                             "store them as fp32 (BlockSearchConfig.dtype)")
        return array

    # the query block
    def query_rows(self, question: str) -> tuple[int, int]:
        """The suffix rows [a, b) whose queries route (config.query_tokens): the last one (the
        state that predicts the answer's first token), the question's own tokens, or the whole
        query span after the separator (instruction, label, question, chat footer)."""
        n = len(self.suffix(question))
        mode = self.config.query_tokens
        if mode == "last":
            return n - 1, n
        if mode == "span":
            return len(self.separator), n
        c = self.config.prompt
        start = len(self.separator) + len(self.prompt.ids(f"{c.closing}{c.separator}{c.query_label}"))
        length = len(self.prompt.ids(f" {question.strip()}")[: c.max_query_tokens])
        return start, start + max(1, length)

    def _query_pass(self, question: str, context: Context, factor: float = 1.0):
        """The query block over `context`: (q (H, S, d) float32 at its routing rows (`query_rows`),
        its own keys (kv, n, d) at layer L, both post-RoPE, and the rows' [a, b))."""
        import torch

        suffix = self.suffix(question)
        a, b = self.query_rows(question)
        layers = list(range(self.layer)) if factor != 1.0 else []
        with torch.inference_mode(), _scaled_attention(self.model, layers, factor), self._adapted():
            [state] = suffix_states(self.model, context, [(suffix, a)], [self.layer],
                                    check_rope=not self._rope_checked)
        self._rope_checked = True
        return state.queries[self.layer][:, : b - a].float().clone(), state.keys[self.layer].clone(), (a, b)

    def prefix_query(self, question: str):
        """Prefix mode: the query block reads the prefix only, so its vectors depend on the
        question alone (kept for the last questions)."""
        hit = self.prefix_queries.get(question)
        if hit is None:
            hit = self._query_pass(question, Context(self.prefix_kv, [], self.query_position))
            self.prefix_queries.put(question, hit)
        return hit

    @property
    def head_mask(self) -> np.ndarray:
        """(H,) True for the heads whose scores are summed: config.heads all, or qr: QRRanker's
        detected heads that sit at the routing layer (all heads where none ships for this backbone
        or none is at that layer; `head_source` says which)."""
        if self._head_mask is None:
            mask = np.ones(self.n_heads, dtype=bool)
            self.head_source = "all heads"
            if self.config.heads == "qr":
                heads, where = shipped_heads(self.backbone.fingerprint, "block")
                chosen = sorted(h for layer, h in heads if layer == self.layer)
                if chosen:
                    mask = np.zeros(self.n_heads, dtype=bool)
                    mask[chosen] = True
                    self.head_source = f"QR heads {chosen} of layer {self.layer} ({where})"
                else:
                    self.head_source = f"all heads (no QR head of layer {self.layer} ships for this backbone)"
            self._head_mask = mask
        return self._head_mask

    def groups(self, scope: Scope) -> list[list[int]]:
        """Faithful mode: chunks in document order, in groups of at most `group_tokens` tokens."""
        return _slices(list(range(scope.n)), [len(b) for b in scope.blocks], self.config.group_tokens)

    def faithful_query(self, question: str, scope: Scope, group: list[int], factor: float = 1.0):
        """The query block over the prefix and the chunks of `group` (their full KV, from the KV
        cache or encoded again)."""
        states = self._full_states([scope.blocks[i] for i in group])
        return self._query_pass(question, states.context(next_position=self.query_position), factor)

    def route(self, question: str, scope: Scope) -> Routing:
        """Score every chunk of the scope for the question; top-B best first."""
        cfg = self.config
        n = scope.n
        if n == 0:
            return Routing(np.zeros(0), np.zeros((0, self.n_heads)), np.zeros(0, dtype=np.int64), 1.0, 0)
        ssmax = ssmax_factor(cfg.ssmax_s, scope.packed.tokens) if cfg.ssmax else 1.0
        per_head, groups = self._per_head(question, scope, ssmax)
        if cfg.calibrate:  # the same for the null query: what a chunk scores whatever is asked
            per_head = per_head - self._null_per_head(scope, ssmax)
        per_head = per_head.double().numpy()
        scores = per_head[:, self.head_mask].sum(axis=1)
        top = np.argsort(-scores, kind="stable")[: cfg.top_b]
        return Routing(scores, per_head, top, ssmax, groups)

    def _null_per_head(self, scope: Scope, ssmax: float):
        """The null query's (N, H) scores. In prefix mode they depend on the scope alone, so the
        last scope's are kept: calibration costs one pass per scope, not per question."""
        null = self.config.prompt.null_query
        if self.config.query_mode != "prefix":
            return self._per_head(null, scope, ssmax)[0]
        kept = self._null_kept
        if kept is None or kept[0] is not scope.packed or kept[1] != ssmax:
            kept = self._null_kept = (scope.packed, ssmax, self._per_head(null, scope, ssmax)[0])
        return kept[2]

    def _per_head(self, question: str, scope: Scope, ssmax: float):
        """(N, H) per-head scores of the scope, each averaged over the query rows, and the number
        of query passes."""
        import torch

        cfg = self.config
        n = scope.n
        inner = ssmax if cfg.ssmax and cfg.ssmax_layers == "all" else 1.0
        if cfg.query_mode == "prefix":
            passes = [(list(range(n)), *self.prefix_query(question))]
        else:
            passes = [(g, *self.faithful_query(question, scope, g, inner)) for g in self.groups(scope)]
        prefix_keys = self.prefix_kv[self.layer][0][0]  # (kv, P, d)
        packed_all = scope.packed if cfg.skip_tokens == 0 else scope.packed.skipping(cfg.skip_tokens)
        per_head = torch.zeros(n, self.n_heads)
        mask = self.head_mask
        g = self.n_heads // self.kv_heads
        if mask.all():  # every KV head with its whole GQA group: one call
            parts = [(list(range(self.n_heads)), slice(None))]
        else:  # only the heads summed, one KV head at a time (the QR heads: 4 of 9 for SmolLM2)
            parts = [([h for h in range(k * g, (k + 1) * g) if mask[h]], slice(k, k + 1))
                     for k in range(self.kv_heads) if mask[k * g:(k + 1) * g].any()]
        for group, q, own, (a, b) in passes:
            rows_n = q.shape[1]
            p = prefix_keys.shape[1]
            # query row s (suffix position a + s) sees the prefix and the suffix up to itself
            seen = torch.arange(p + own.shape[1])[None] <= (p + a + torch.arange(rows_n))[:, None]  # (S, E)
            for heads, kv in parts:
                flat = q[heads].reshape(len(heads) * rows_n, self.head_dim)  # row h * S + s: GQA groups stay whole
                keys = packed_all if kv == slice(None) else packed_all.kv_slice(kv)
                if cfg.variant == "maxsim":
                    got = maxsim(flat, keys if len(passes) == 1 else keys.subset(group), self.scaling, ssmax)
                else:
                    extra = torch.cat([prefix_keys[kv].float(), own[kv].float()], dim=1)
                    got = attention_mass(flat, keys, self.scaling, ssmax, extra,
                                         extra_mask=seen.repeat(len(heads), 1))
                    got = got if len(passes) == 1 else got[group]
                at = torch.arange(n) if len(passes) == 1 else torch.tensor(group)
                per_head[at[:, None], torch.tensor(heads)[None]] = got.reshape(-1, len(heads), rows_n).mean(dim=2)
        return per_head, len(passes)

    def scores(self, question: str, texts: list[str], hashes: list[str] | None = None) -> np.ndarray:
        return self.route(question, self.scope(texts, hashes)).scores


def _slices(items: list, lengths: list[int], budget: int) -> list[list]:
    """`items` in order, in runs of at most `budget` total length (a longer item alone)."""
    out, current, used = [], [], 0
    for item, n in zip(items, lengths):
        if current and used + n > budget:
            out.append(current)
            current, used = [], 0
        current.append(item)
        used += n
    if current:
        out.append(current)
    return out
