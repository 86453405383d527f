"""QRRanker (seed 003): listwise reranking with the backbone's query-focused retrieval (QR) heads.

Prompt (the seed's template, Appx. J.3, in the backbone's chat format):

    <chat header> Here are some retrieved chunks:      <- prefix (shared; the KV everything reuses)
    \\n\\n[1] chunk text                                  <- candidate 1: its span is "[1] chunk text"
    ...
    \\n\\n[K] chunk text
    \\n\\nPlease find ... in the chunks above.\\n\\nQuery: {question}<chat footer>   <- suffix

The query span is the suffix after its separator: the closing instruction, "Query: q" and the
assistant header, as QRHead defines it. Pieces are tokenized one by one and concatenated, so a
candidate's tokens are the same whichever encoding or slot holds it.

Score of candidate c for head (l, h): the attention of each query-span token onto c's tokens
(softmax over everything the token sees, as the model computes it: post-RoPE q.k times the
layer's scaling, KV head h // group for query head h), averaged over the query-span tokens;
calibrated per token by subtracting the same quantity for the null query "N/A" run over the same
context KV (only the suffix is recomputed); summed over the selected heads per token; tokens
below mean - 2 std of the candidate's calibrated values dropped; the rest summed. No T x T map
is ever built: the suffix runs over the context's KV cache, its queries are taken from the
q_proj outputs of the layers needed (RoPE applied here, checked against the cache's keys), and
only the suffix rows of the softmax are computed. The forward pass stops after the deepest
selected layer (truncation).

Two candidate encodings:
- causal: one prefill of prefix + all candidates (the seed);
- block: every candidate attends to the prefix and itself only, RoPE positions restarting
  right after the prefix for each one (`encode_blocks`, one batch over the cached prefix); the
  suffix attends to everything (prefix, all candidates, itself) and starts at the position after
  the longest candidate (`BlockStates.context`). A block's KV depends only on the prefix and its
  own tokens. This part (`encode_prefix`, `encode_blocks`, `BlockStates`, `query_attention`) is
  written to be shared with BlockSearch.

Beyond the context window (causal: prefix + candidates + suffix > the model's positions; block:
the keys one query reads), candidates go in groups of equal size sharing the prefix, each group
scored by its own query and null-query passes. Scores stay comparable because each is a
calibrated share of one softmax whose denominator is dominated by the shared prefix (the sink
alone takes most of the mass) and by candidates of a group of the same size and length budget;
with block encoding a candidate's own states are identical in every group, so only that
denominator differs.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from evsel.errors import ModelError
from evsel.models.backbone import run_layers

METHOD = "qrranker"
HEADS_FILE = "heads.json"
ENCODINGS = ("block", "causal")
DEFAULT_ENCODING = "block"
HEADS_FORMAT = "evsel-qrranker-heads/1"
ADAPTER_FILE = "adapter.safetensors"
ADAPTER_CONFIG = "adapter.json"
ADAPTER_FORMAT = "evsel-qrranker-adapter/1"


# ---------------------------------------------------------------------------------------------
# heads


def parse_heads(text: str) -> list[tuple[int, int]]:
    """'14-3,17-0' -> [(14, 3), (17, 0)]: (layer, head), layer 0-based as in model.layers and
    the seed's 'l-h' notation."""
    out = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)-(\d+)\s*", part)
        if not match:
            raise ModelError(f"{text!r} is not a head list like 14-3,17-0", "give LAYER-HEAD pairs, 0-based")
        out.append((int(match.group(1)), int(match.group(2))))
    return out


def format_heads(heads: list[tuple[int, int]]) -> str:
    return ",".join(f"{layer}-{head}" for layer, head in heads)


def shipped_heads_dir(fingerprint: str) -> Path:
    """Where the package keeps the detected heads for a backbone (by fingerprint prefix)."""
    return Path(__file__).parent / "adapters" / fingerprint[:16] / METHOD


def load_head_file(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / HEADS_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read a QR head list from {path}: {exc}",
                         "give a heads.json written by: evsel train qrranker --detect-heads") from exc
    if data.get("format") != HEADS_FORMAT or not data.get("heads"):
        raise ModelError(f"{path} is not a QR head list ({HEADS_FORMAT})",
                         "give a heads.json written by: evsel train qrranker --detect-heads")
    return data


def heads_of(data: dict, encoding: str | None = None) -> list[tuple[int, int]]:
    """The head list of a heads.json for an encoding (its own list when detected under it)."""
    chosen = (data.get("by_encoding") or {}).get(encoding) if encoding else None
    return [(int(h["layer"]), int(h["head"])) for h in (chosen or data["heads"])]


def resolve_heads(backbone, setting: str | None, encoding: str | None = None) -> tuple[list[tuple[int, int]], str]:
    """The heads to use and where they came from: `setting` (EVSEL_QRRANKER_HEADS: a head list
    like 14-3,17-0, or a heads.json / its folder), else the list shipped for this backbone."""
    if setting:
        if re.fullmatch(r"\s*\d+-\d+\s*(,\s*\d+-\d+\s*)*", setting):
            return parse_heads(setting), "EVSEL_QRRANKER_HEADS"
        return heads_of(load_head_file(setting), encoding), str(setting)
    shipped = shipped_heads_dir(backbone.fingerprint) / HEADS_FILE
    if not shipped.is_file():
        raise ModelError(
            f"no QR head list ships for this backbone (fingerprint {backbone.fingerprint[:16]})",
            "detect one with: evsel train qrranker --detect-heads --out DIR, then set EVSEL_QRRANKER_HEADS=DIR",
        )
    return heads_of(load_head_file(shipped), encoding), str(shipped)


def check_heads(model, heads: list[tuple[int, int]]) -> None:
    cfg = model.config
    for layer, head in heads:
        if not (0 <= layer < cfg.num_hidden_layers and 0 <= head < cfg.num_attention_heads):
            raise ModelError(f"head {layer}-{head} is not in this model ({cfg.num_hidden_layers} layers, "
                             f"{cfg.num_attention_heads} heads; layers are 0-based)",
                             "detect heads for this backbone: evsel train qrranker --detect-heads")


# ---------------------------------------------------------------------------------------------
# the prompt, as token pieces


@dataclass
class PromptConfig:
    instruction: str = "Here are some retrieved chunks:"
    closing: str = "Please find information that is relevant to the following query in the chunks above."
    query_label: str = "Query:"
    separator: str = "\n\n"
    null_query: str = "N/A"
    max_chunk_tokens: int = 384  # a longer candidate is cut (evsel's chunks are ~140 tokens)
    max_query_tokens: int = 96  # a longer question is cut
    memory_label: str = "Here are some summaries that may help answer the query:"


class Prompt:
    """Token ids of the prompt's pieces for one backbone."""

    def __init__(self, tokenizer, config: PromptConfig | None = None):
        self.tok = tokenizer
        self.config = config or PromptConfig()
        self.header, self.footer = self._chat_frame()
        self._sep = self.ids(self.config.separator)

    def _chat_frame(self) -> tuple[list[int], list[int]]:
        """The chat template's text before and after one user message (the assistant header
        included), or a plain frame when the tokenizer has no template."""
        marker = "\u2063QRRANKER\u2063"
        try:
            text = self.tok.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=True,
                                                tokenize=False)
        except Exception:  # noqa: BLE001  (no chat template, or one that fails: a plain frame)
            text = None
        if not text or marker not in text:
            text = f"User: {marker}\nAssistant:"
        before, after = text.split(marker, 1)
        return self.ids(before), self.ids(after)

    def ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"]) if text else []

    def prefix(self, memory: str | None = None) -> list[int]:
        """Chat header, optional memory prefix, instruction: shared by every candidate and query."""
        ids = list(self.header)
        if memory:
            ids += self.ids(f"{self.config.memory_label}\n{memory}") + self._sep
        return ids + self.ids(self.config.instruction)

    def memory_block(self, memory: str) -> list[int]:
        """The memory prefix as a block of its own (block encoding): separator, label, summaries."""
        return self._sep + self.ids(f"{self.config.memory_label}\n{memory}")

    def candidate(self, label: int, text: str) -> tuple[list[int], int]:
        """(separator + '[label] text', where the span '[label] text' starts)."""
        body = self.ids(f"[{label}] {text.strip()}")[: self.config.max_chunk_tokens]
        return self._sep + body, len(self._sep)

    def suffix(self, question: str) -> tuple[list[int], int]:
        """(separator + closing instruction + 'Query: q' + chat footer, where the query span starts)."""
        c = self.config
        question = self.ids(f" {question.strip()}")[: c.max_query_tokens]
        body = self.ids(f"{c.closing}{c.separator}{c.query_label}") + question + self.footer
        return self._sep + body, len(self._sep)

    def suffix_budget(self) -> int:
        """The most tokens a suffix takes (the longest question allowed)."""
        return len(self.suffix("")[0]) + self.config.max_query_tokens


# ---------------------------------------------------------------------------------------------
# encoders (KV of the context a query reads); lists are per layer, 0-based, up to `depth` layers


@dataclass
class Context:
    """What a query pass runs over: per-layer (K, V), each (1, kv_heads, T, head_dim), the token
    ranges of the candidates' spans in it, and the position id of the first suffix token. With an
    adapter, also the k_proj inputs (T, hidden) of the adapted layers and every token's position
    (the adapter's key deltas are rotated by them)."""

    kv: list[tuple]
    spans: list[tuple[int, int]]
    next_position: int
    inputs: dict | None = None  # {layer: (T, hidden)}
    positions: object = None  # (T,) long; None: 0..T-1

    @property
    def length(self) -> int:
        return int(self.kv[0][0].shape[-2])


def _cache(kv: list[tuple]):
    """A transformers DynamicCache holding `kv` as they are (no copy: the pass's own update makes
    the one copy it needs, and the tensors given are never changed)."""
    from transformers import DynamicCache

    cache = DynamicCache(ddp_cache_data=[(k[..., :0, :], v[..., :0, :]) for k, v in kv])
    for layer, (k, v) in zip(cache.layers, kv):
        layer.keys, layer.values = k, v
    return cache


def _cache_kv(cache, depth: int) -> list[tuple]:
    return [(cache.layers[i].keys, cache.layers[i].values) for i in range(depth)]


def _device(model):
    return next(model.parameters()).device


@contextmanager
def _inputs_of(model, layers):
    """{layer: the input of its k_proj (= q_proj's: the normed residual stream)} of the next pass."""
    got: dict = {}
    hooks = [model.model.layers[layer].self_attn.k_proj.register_forward_pre_hook(
        lambda _module, args, layer=layer: got.__setitem__(layer, args[0])) for layer in layers]
    try:
        yield got
    finally:
        for hook in hooks:
            hook.remove()


def _encode(model, ids: list[int], depth: int, capture=()) -> tuple[list[tuple], dict]:
    """Causal KV of `ids` at positions 0..T-1 for `depth` layers, and the k_proj inputs (T, hidden)
    of the `capture` layers."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    x = torch.tensor([ids], dtype=torch.long, device=_device(model))
    with torch.inference_mode(), _inputs_of(model, capture) as got:
        run_layers(model, [depth], input_ids=x, cache=cache)
    return _cache_kv(cache, depth), {layer: got[layer][0] for layer in capture}


def encode_prefix(model, ids: list[int], depth: int) -> list[tuple]:
    """KV of a causal prefix at positions 0..P-1 for the first `depth` layers."""
    return _encode(model, ids, depth)[0]


def encode_causal(model, prefix: list[int], blocks: list[list[int]], spans: list[int], depth: int,
                  capture=()) -> Context:
    """One causal prefill of prefix + blocks (the seed's encoding)."""
    ids = list(prefix)
    ranges = []
    for block, start in zip(blocks, spans):
        ranges.append((len(ids) + start, len(ids) + len(block)))
        ids += block
    kv, inputs = _encode(model, ids, depth, capture)
    return Context(kv, ranges, len(ids), inputs if capture else None)


@dataclass
class BlockStates:
    """Prefix KV plus each block's own KV (kv_heads, L_i, head_dim per layer), block-sparse: a
    block saw only the prefix and itself, its positions P..P+L_i-1. With an adapter, also the
    k_proj inputs of the adapted layers: prefix {layer: (P, hidden)}, per block {layer: (L_i, hidden)}."""

    prefix: list[tuple]  # per layer (1, kv, P, d)
    blocks: list[list[tuple]]  # per block, per layer (kv, L_i, d)
    prefix_inputs: dict | None = None
    block_inputs: list[dict] | None = None

    @property
    def prefix_len(self) -> int:
        return int(self.prefix[0][0].shape[-2])

    def lengths(self) -> list[int]:
        return [int(b[0][0].shape[-2]) for b in self.blocks]

    def context(self, which: list[int] | None = None, spans: list[int] | None = None,
                next_position: int | None = None) -> Context:
        """The context a query reads: prefix then the chosen blocks (all, in order, by default),
        concatenated; the query's positions start after the longest block (or `next_position`)."""
        import torch

        which = list(range(len(self.blocks))) if which is None else list(which)
        starts = spans or [0] * len(self.blocks)
        lengths = self.lengths()
        kv, ranges, at = [], [], self.prefix_len
        for i in which:
            ranges.append((at + starts[i], at + lengths[i]))
            at += lengths[i]
        for layer, (pk, pv) in enumerate(self.prefix):
            keys = torch.cat([pk] + [self.blocks[i][layer][0][None] for i in which], dim=2)
            values = torch.cat([pv] + [self.blocks[i][layer][1][None] for i in which], dim=2)
            kv.append((keys, values))
        if next_position is None:
            next_position = self.prefix_len + max((lengths[i] for i in which), default=0)
        device = self.prefix[0][0].device
        positions = torch.cat([torch.arange(self.prefix_len, device=device)] +
                              [torch.arange(lengths[i], device=device) + self.prefix_len for i in which])
        inputs = None
        if self.prefix_inputs is not None and self.block_inputs is not None:
            inputs = {layer: torch.cat([x] + [self.block_inputs[i][layer] for i in which])
                      for layer, x in self.prefix_inputs.items()}
        return Context(kv, ranges, next_position, inputs, positions)


def encode_blocks(model, prefix_kv: list[tuple], blocks: list[list[int]], batch_tokens: int = 4096,
                  pad_id: int = 0, capture=()) -> BlockStates:
    """Encode `blocks` block-sparse after a prefix whose KV is `prefix_kv` (from `encode_prefix`):
    each block attends to the prefix and itself, at positions P..P+L_i-1, independent of every
    other block. Batched by similar length, right-padded (under the causal mask no real token
    sees a pad), at most `batch_tokens` block tokens (padding included) a batch. `capture`:
    layers whose k_proj inputs are kept too (BlockStates.block_inputs)."""
    import torch

    depth = len(prefix_kv)
    device = prefix_kv[0][0].device
    p = int(prefix_kv[0][0].shape[-2])
    order = sorted(range(len(blocks)), key=lambda i: len(blocks[i]))
    batches, current = [], []
    for i in order:
        longest = max([len(blocks[j]) for j in current] + [len(blocks[i])])
        if current and longest * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    out: list = [None] * len(blocks)
    inputs: list = [None] * len(blocks)
    for batch in batches:
        width = max(len(blocks[i]) for i in batch)
        if width == 0:
            raise ModelError("an empty block cannot be encoded")
        x = torch.full((len(batch), width), pad_id, dtype=torch.long)
        for row, i in enumerate(batch):
            x[row, : len(blocks[i])] = torch.tensor(blocks[i])
        positions = (torch.arange(width) + p).expand(len(batch), width)
        cache = _cache([(k.expand(len(batch), -1, -1, -1), v.expand(len(batch), -1, -1, -1))
                        for k, v in prefix_kv])
        with torch.inference_mode(), _inputs_of(model, capture) as got:
            run_layers(model, [depth], input_ids=x.to(device), cache=cache, position_ids=positions.to(device))
        kv = _cache_kv(cache, depth)
        for row, i in enumerate(batch):
            n = len(blocks[i])
            out[i] = [(k[row, :, p:p + n].clone(), v[row, :, p:p + n].clone()) for k, v in kv]
            inputs[i] = {layer: got[layer][row, :n].clone() for layer in capture}
    return BlockStates(prefix_kv, out, None, inputs if capture else None)


class BlockKVCache:
    """Per-block KV of block-sparse encodings, least recently used first out, bounded by bytes.
    A block's KV depends only on the model, the prefix, the block's tokens and the depth encoded,
    which is the key; a resident daemon keeps one for its lifetime, so candidates that come back
    (another question over the same book) are not encoded again."""

    def __init__(self, max_bytes: int = 768 << 20):
        import threading

        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(*parts) -> str:
        import hashlib

        digest = hashlib.blake2b(digest_size=16)
        for part in parts:
            if isinstance(part, (list, tuple)):
                digest.update(np.asarray(part, dtype=np.int64).tobytes())
            else:
                digest.update(str(part).encode())
            digest.update(b"|")
        return digest.hexdigest()

    def get(self, key: str):
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self.hits += 1
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: str, value: list[tuple]) -> None:
        size = sum(t.numel() * t.element_size() for item in value for t in item)
        with self._lock:
            if key in self._items or size > self.max_bytes:
                return
            self._items[key] = (value, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, old) = self._items.popitem(last=False)
                self.bytes -= old

    def __len__(self) -> int:
        return len(self._items)


def encode_blocks_cached(model, prefix_ids: list[int], blocks: list[list[int]], depth: int,
                         cache: BlockKVCache | None, batch_tokens: int = 4096, pad_id: int = 0,
                         model_key: str = "", capture=()) -> BlockStates:
    """`encode_prefix` + `encode_blocks`, taking the prefix's and every block's KV (and, for the
    `capture` layers, k_proj inputs) from `cache` when there, encoding only the rest (one batch
    over the prefix) and caching them."""
    capture = tuple(capture)
    if cache is None:
        prefix_kv, prefix_inputs = _encode(model, prefix_ids, depth, capture)
        states = encode_blocks(model, prefix_kv, blocks, batch_tokens, pad_id, capture)
        states.prefix_inputs = prefix_inputs if capture else None
        return states
    pkey = cache.key("prefix", model_key, depth, prefix_ids)
    ikey = cache.key("prefix-inputs", model_key, capture, prefix_ids)
    prefix_kv = cache.get(pkey)
    prefix_inputs = cache.get(ikey) if capture else []
    if prefix_kv is None or prefix_inputs is None:
        prefix_kv, got = _encode(model, prefix_ids, depth, capture)
        prefix_inputs = [(got[layer],) for layer in capture]
        cache.put(pkey, prefix_kv)
        if capture:
            cache.put(ikey, prefix_inputs)
    keys = [cache.key("block", model_key, depth, prefix_ids, b) for b in blocks]
    ikeys = [cache.key("block-inputs", model_key, capture, prefix_ids, b) for b in blocks]
    found = [cache.get(k) for k in keys]
    found_inputs = [cache.get(k) for k in ikeys] if capture else [[]] * len(blocks)
    missing = [i for i, (kv, x) in enumerate(zip(found, found_inputs)) if kv is None or x is None]
    if missing:
        fresh = encode_blocks(model, prefix_kv, [blocks[i] for i in missing], batch_tokens, pad_id, capture)
        for j, i in enumerate(missing):
            found[i] = fresh.blocks[j]
            cache.put(keys[i], found[i])
            if capture:
                found_inputs[i] = [(fresh.block_inputs[j][layer],) for layer in capture]
                cache.put(ikeys[i], found_inputs[i])
    if not capture:
        return BlockStates(prefix_kv, found)
    return BlockStates(prefix_kv, found, {layer: x for layer, (x,) in zip(capture, prefix_inputs)},
                       [{layer: x for layer, (x,) in zip(capture, item)} for item in found_inputs])


# ---------------------------------------------------------------------------------------------
# the query pass


def _rotate(x, cos, sin):
    """RoPE as Llama applies it: x * cos + rotate_half(x) * sin."""
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def query_attention(model, context: Context, suffix: list[int], span_start: int, layers: list[int],
                    check_rope: bool = False, adapter=None) -> dict:
    """Run `suffix` over `context` (only the suffix is computed; the context KV is not changed)
    and return {layer: (heads, T_ctx) float32}: the attention of each query-span token (suffix
    tokens from `span_start` on) onto each context token, averaged over those tokens. Softmax rows
    over everything a suffix token sees (context, earlier suffix tokens, itself), as the model
    computes them; only those rows are built. `layers` are 0-based; the pass stops after the
    deepest. `check_rope`: also verify that our RoPE of k_proj reproduces the cache's keys."""
    return query_attentions(model, context, [(suffix, span_start)], layers, check_rope, adapter)[0]


def query_attentions(model, context: Context, suffixes: list[tuple[list[int], int]], layers: list[int],
                     check_rope: bool = False, adapter=None) -> list[dict]:
    """`query_attention` for several suffixes (the question and the null query) in one batched
    pass over the same context: [(ids, span_start)] -> one {layer: (heads, T_ctx)} each. Shorter
    suffixes are right-padded; under the causal mask no real token sees a pad. With `adapter`
    (a QRAdapter) the read layers' q/k carry its deltas; the backbone's pass does not."""
    import torch

    with torch.inference_mode():
        states = suffix_states(model, context, suffixes, layers, check_rope, adapter is not None)
        return head_attention(model, read_states(context, layers), states, layers, adapter)


@dataclass
class ReadStates:
    """What scoring reads of a context at the read layers: post-RoPE keys {layer: (kv, T, d)},
    k_proj inputs {layer: (T, hidden)} (adapted layers only; None without an adapter), and the
    tokens' positions (T,)."""

    keys: dict
    inputs: dict | None
    positions: object

    def select(self, index) -> ReadStates:
        """The tokens at `index` (a (T',) long tensor), in that order."""
        return ReadStates({layer: k.index_select(1, index) for layer, k in self.keys.items()},
                          None if self.inputs is None else
                          {layer: x.index_select(0, index) for layer, x in self.inputs.items()},
                          self.positions.index_select(0, index))

    def detached(self) -> ReadStates:
        """Plain copies (tensors made under inference mode cannot enter a graph that trains)."""
        return ReadStates({layer: k.clone() for layer, k in self.keys.items()},
                          None if self.inputs is None else {layer: x.clone() for layer, x in self.inputs.items()},
                          self.positions.clone())


@dataclass
class SuffixStates:
    """One suffix's pass at the read layers: post-RoPE queries of its query span {layer: (H, S, d)},
    post-RoPE keys of all its tokens {layer: (kv, n, d)}, k_proj inputs {layer: (n, hidden)} (with an
    adapter), positions (n,), and where the query span starts."""

    queries: dict
    keys: dict
    inputs: dict | None
    positions: object
    start: int

    def detached(self) -> SuffixStates:
        return SuffixStates({layer: q.clone() for layer, q in self.queries.items()},
                            {layer: k.clone() for layer, k in self.keys.items()},
                            None if self.inputs is None else {layer: x.clone() for layer, x in self.inputs.items()},
                            self.positions.clone(), self.start)


def read_states(context: Context, layers: list[int]) -> ReadStates:
    import torch

    positions = context.positions
    if positions is None:
        positions = torch.arange(context.length, device=context.kv[0][0].device)
    inputs = None if context.inputs is None else {layer: x for layer, x in context.inputs.items() if layer in layers}
    return ReadStates({layer: context.kv[layer][0][0] for layer in layers}, inputs, positions)


def suffix_states(model, context: Context, suffixes: list[tuple[list[int], int]], layers: list[int],
                  check_rope: bool = False, capture: bool = False) -> list[SuffixStates]:
    """The backbone's pass of `suffixes` over `context` (one padded batch, stopping after the
    deepest of `layers`); call under no_grad or inference_mode. `capture`: keep the k_proj inputs
    of the read layers (an adapter reads them)."""
    import torch

    inner = model.model
    depth = max(layers) + 1
    if depth > len(context.kv):
        raise ModelError(f"the context holds {len(context.kv)} layers, the query needs {depth}")
    taps = {}
    for layer in layers:
        taps[("q", layer)] = inner.layers[layer].self_attn.q_proj
        if check_rope:
            taps[("k", layer)] = inner.layers[layer].self_attn.k_proj
    device = context.kv[0][0].device
    b, width = len(suffixes), max(len(ids) for ids, _ in suffixes)
    x = torch.zeros(b, width, dtype=torch.long)
    for row, (ids, _) in enumerate(suffixes):
        x[row, : len(ids)] = torch.tensor(ids)
    positions = (torch.arange(width) + context.next_position)[None].expand(b, width).to(device)
    cache = _cache([(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in context.kv[:depth]])
    n_heads = model.config.num_attention_heads
    with _inputs_of(model, layers if capture else ()) as got_inputs:
        got = run_layers(model, [depth], taps=taps, input_ids=x.to(device), cache=cache, position_ids=positions)
    t_ctx = context.length
    cos, sin = inner.rotary_emb(context.kv[0][0], positions[:1])  # (1, W, d), the model's dtype
    cos, sin = cos[:, None], sin[:, None]
    out = [SuffixStates({}, {}, {} if capture else None, positions[0, : len(ids)], start) for ids, start in suffixes]
    for layer in layers:
        keys = cache.layers[layer].keys  # (B, kv, T_ctx + W, d), post-RoPE
        head_dim = keys.shape[-1]
        q_all = _rotate(got[("q", layer)].view(b, width, n_heads, head_dim).transpose(1, 2), cos, sin)
        if check_rope:
            k = _rotate(got[("k", layer)].view(b, width, keys.shape[1], head_dim).transpose(1, 2), cos, sin)
            n = len(suffixes[0][0])
            if not torch.allclose(k[0, :, :n].float(), keys[0, :, t_ctx:t_ctx + n].float(), atol=1e-2, rtol=1e-2):
                raise ModelError("this backbone's attention is not Llama-style RoPE attention; QRRanker cannot "
                                 "read its heads", "use a Llama-family backbone (e.g. the bundled SmolLM2)")
        for row, (ids, start) in enumerate(suffixes):
            n = len(ids)
            out[row].queries[layer] = q_all[row, :, start:n]
            out[row].keys[layer] = keys[row, :, t_ctx:t_ctx + n]
            if capture:
                out[row].inputs[layer] = got_inputs[layer][row, :n]
    return out


def _rope_tables(model, positions):
    """float32 cos, sin (T, d) of the model's RoPE at `positions`."""
    import torch

    cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=torch.float32, device=positions.device), positions[None])
    return cos[0].float(), sin[0].float()


def head_attention(model, context: ReadStates, suffixes: list[SuffixStates], layers: list[int],
                   adapter=None) -> list[dict]:
    """The attention rows of each suffix's query span onto the context's tokens, averaged over
    the span: one {layer: (heads, T_ctx) float32} per suffix. With `adapter`, the adapted layers'
    queries and keys (context and suffix) get its rotated LoRA deltas first. Differentiable in the
    adapter's parameters when run with gradients."""
    import torch

    inner = model.model
    n_heads = model.config.num_attention_heads
    adapted = [layer for layer in layers if adapter is not None and adapter.has(layer)]
    if adapted and (context.inputs is None or any(s.inputs is None for s in suffixes)):
        raise ModelError("the adapter needs the k_proj inputs of the context and the query",
                         "encode with the adapter's layers captured")
    tables = {}
    if adapted:
        tables["ctx"] = _rope_tables(model, context.positions)
        for i, s in enumerate(suffixes):
            tables[i] = _rope_tables(model, s.positions)
    out: list[dict] = [{} for _ in suffixes]
    for layer in layers:
        scaling = float(inner.layers[layer].self_attn.scaling)
        k_ctx = context.keys[layer].float()  # (kv, T_ctx, d)
        kv_heads, t_ctx, head_dim = k_ctx.shape
        group = n_heads // kv_heads
        if layer in adapted:
            cos, sin = tables["ctx"]
            delta = adapter.delta(layer, "k", context.inputs[layer]).view(t_ctx, kv_heads, head_dim).transpose(0, 1)
            k_ctx = k_ctx + _rotate(delta, cos, sin)
        k_ctx = k_ctx.repeat_interleave(group, dim=0)  # head h reads KV h // group
        for row, s in enumerate(suffixes):
            q = s.queries[layer].float()  # (H, S_q, d)
            k_suf = s.keys[layer].float()  # (kv, n, d)
            n, start = k_suf.shape[1], s.start
            if layer in adapted:
                cos, sin = tables[row]
                dq = adapter.delta(layer, "q", s.inputs[layer][start:]).view(n - start, n_heads, head_dim)
                q = q + _rotate(dq.transpose(0, 1), cos[start:], sin[start:])
                dk = adapter.delta(layer, "k", s.inputs[layer]).view(n, kv_heads, head_dim).transpose(0, 1)
                k_suf = k_suf + _rotate(dk, cos, sin)
            k_all = torch.cat([k_ctx, k_suf.repeat_interleave(group, dim=0)], dim=1)  # (H, T_ctx + n, d)
            logits = torch.matmul(q, k_all.transpose(1, 2)) * scaling  # (H, S_q, T_ctx + n)
            causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device))
            allowed = torch.cat([torch.ones(n - start, t_ctx, dtype=torch.bool, device=q.device),
                                 causal[start:n, :n]], dim=1)
            weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
            out[row][layer] = weights[:, :, :t_ctx].mean(dim=1)  # (H, T_ctx)
    return out


# ---------------------------------------------------------------------------------------------
# the adapter: LoRA on q_proj and k_proj of the read layers, for reranking only


@dataclass
class AdapterConfig:
    layers: list[int]
    rank: int = 8
    alpha: float = 16.0
    heads: list[list[int]] = field(default_factory=list)  # the head list it was trained with
    encoding: str = DEFAULT_ENCODING

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class QRAdapter:
    """Low-rank deltas on the q_proj and k_proj outputs of some layers (delta(x) = s B A x, B
    starting at zero), applied only where QR scoring computes its heads' queries and keys
    (`head_attention`). The backbone's own passes never see them: layers above an adapted one get
    the untouched hidden states, so the answering path, the KV a block caches and everything the
    scorer does not read stay those of the frozen model."""

    FORMAT = ADAPTER_FORMAT
    PROJECTIONS = ("q", "k")  # the projections carrying deltas (BlockSearch's decoder: q and v)
    KIND = "QRRanker adapter"  # what errors call it, and the command that writes one
    TRAIN_COMMAND = "evsel train qrranker"

    def __init__(self, config: AdapterConfig, hidden: int, q_out: int, k_out: int, device=None, seed: int = 0,
                 tensors: dict | None = None):
        """`k_out`: the output width of k_proj and v_proj (kv_heads * head_dim)."""
        import torch

        self.config = config
        self.shapes = {p: q_out if p == "q" else k_out for p in self.PROJECTIONS}
        self.params: dict = {}
        generator = torch.Generator().manual_seed(seed)
        for layer in config.layers:
            for proj, out in self.shapes.items():
                a_name, b_name = self.name(layer, proj, "A"), self.name(layer, proj, "B")
                if tensors is not None:
                    a, b = tensors[a_name].float(), tensors[b_name].float()
                else:
                    a = torch.randn(config.rank, hidden, generator=generator) / hidden ** 0.5
                    b = torch.zeros(out, config.rank)
                self.params[a_name] = a.to(device).requires_grad_(True)
                self.params[b_name] = b.to(device).requires_grad_(True)

    @staticmethod
    def name(layer: int, proj: str, which: str) -> str:
        return f"layers.{layer}.{proj}_proj.lora_{which}"

    @classmethod
    def for_model(cls, model, config: AdapterConfig, seed: int = 0, tensors: dict | None = None) -> QRAdapter:
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(config, cfg.hidden_size, cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim,
                   _device(model), seed, tensors)

    def has(self, layer: int) -> bool:
        return layer in self.config.layers

    def delta(self, layer: int, proj: str, x):
        """s B A x for rows x (..., hidden), float32 (..., out)."""
        a = self.params[self.name(layer, proj, "A")]
        b = self.params[self.name(layer, proj, "B")]
        return (x.float() @ a.t()) @ b.t() * self.config.scale

    def parameters(self) -> list:
        return list(self.params.values())

    def digest(self) -> str:
        import hashlib

        h = hashlib.blake2b(digest_size=8)
        for name in sorted(self.params):
            h.update(self.params[name].detach().float().cpu().numpy().tobytes())
        return h.hexdigest()

    def save(self, folder: str | Path, extra: dict | None = None) -> None:
        """OUT/adapter.safetensors and OUT/adapter.json (the config and `extra`)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().float().cpu().contiguous() for k, v in self.params.items()},
                  str(folder / ADAPTER_FILE))
        meta = {"format": self.FORMAT, **asdict(self.config), "shapes": self.shapes, **(extra or {})}
        (folder / ADAPTER_CONFIG).write_text(json.dumps(meta, indent=1) + "\n")


def load_adapter(folder: str | Path, model, kind: type[QRAdapter] = QRAdapter) -> QRAdapter:
    """The adapter in `folder` (adapter.safetensors + adapter.json) on the model's device; `kind`:
    the adapter class (its FORMAT must match the file's)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        meta = json.loads((folder / ADAPTER_CONFIG).read_text())
        tensors = load_file(str(folder / ADAPTER_FILE))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read a {kind.KIND} from {folder}: {exc}",
                         f"give a folder written by: {kind.TRAIN_COMMAND} --out DIR") from exc
    if meta.get("format") != kind.FORMAT:
        raise ModelError(f"{folder / ADAPTER_CONFIG} is not a {kind.FORMAT} adapter (it says {meta.get('format')!r})")
    config = AdapterConfig(layers=[int(x) for x in meta["layers"]], rank=int(meta["rank"]), alpha=float(meta["alpha"]),
                           heads=[list(h) for h in meta.get("heads", [])],
                           encoding=meta.get("encoding", DEFAULT_ENCODING))
    check_heads(model, [(layer, 0) for layer in config.layers])
    adapter = kind.for_model(model, config, tensors=tensors)
    if adapter.shapes != {k: int(v) for k, v in meta.get("shapes", adapter.shapes).items()}:
        raise ModelError(f"the adapter in {folder} was trained for another backbone shape",
                         f"train one for this backbone: {kind.TRAIN_COMMAND} --out DIR")
    for p in adapter.parameters():
        p.requires_grad_(False)
    return adapter


def adapter_folder(backbone, setting: str | None) -> Path | None:
    """Where a trained adapter sits for the heads that `setting` names: beside its heads.json (or
    in its folder); with no setting, beside the shipped heads. None: no adapter (untrained heads)."""
    if setting and re.fullmatch(r"\s*\d+-\d+\s*(,\s*\d+-\d+\s*)*", setting):
        return None
    if setting:
        path = Path(setting)
        folder = path if path.is_dir() else path.parent
    else:
        folder = shipped_heads_dir(backbone.fingerprint)
    return folder if (folder / ADAPTER_FILE).is_file() else None


# ---------------------------------------------------------------------------------------------
# scoring


def trimmed_sum(values, dim: int = -1):
    """Sum along `dim`, leaving out entries below mean - 2 std (unbiased std, as QRHead) of that
    slice; a slice of one entry is kept whole."""
    import torch

    values = torch.as_tensor(values)
    if values.shape[dim] < 2:
        return values.sum(dim=dim)
    threshold = values.mean(dim=dim, keepdim=True) - 2 * values.std(dim=dim, keepdim=True)
    return torch.where(values > threshold, values, torch.zeros_like(values)).sum(dim=dim)


def calibrated(real: dict, null: dict) -> dict:
    """Per layer: attention under the question minus attention under the null query."""
    return {layer: real[layer] - null[layer] for layer in real}


def chunk_scores(cal: dict, spans: list[tuple[int, int]], heads: list[tuple[int, int]]):
    """QRHead's chunk score: per token the calibrated values summed over `heads`, trimmed within
    each candidate (mean - 2 std), summed over the candidate's span. Returns (N,) float64 numpy."""

    return chunk_score_tensor(cal, spans, heads).detach().cpu().double().numpy()


def chunk_score_tensor(cal: dict, spans: list[tuple[int, int]], heads: list[tuple[int, int]]):
    """`chunk_scores` as a (N,) float32 tensor (differentiable: trimming only masks)."""
    import torch

    per_token = sum(cal[layer][head] for layer, head in heads)  # (T_ctx,)
    return torch.stack([trimmed_sum(per_token[a:b]) for a, b in spans])


def listwise_loss(scores, gold: list[int], scale: float = 8.0):
    """The seed's loss over one question's candidates: scores max-min normalised to [0, scale],
    then -1/|G| sum over gold p of log(e^{s_p} / (e^{s_p} + sum over non-gold n of e^{s_n}))."""
    import torch

    span = (scores.max() - scores.min()).clamp_min(1e-12)
    s = (scores - scores.min()) / span * scale
    negative = torch.ones_like(s, dtype=torch.bool)
    negative[gold] = False
    if not bool(negative.any()):
        raise ModelError("a listwise instance needs at least one non-gold candidate")
    rest = torch.logsumexp(s[negative], dim=0)
    positive = s[gold]
    return -(positive - torch.logaddexp(positive, rest)).mean()


def head_scores(cal: dict, spans: list[tuple[int, int]]):
    """Every head's own chunk scores (trimmed per head): (N, len(cal) layers, heads) numpy, layers
    in sorted order of `cal`'s keys."""
    import torch

    stack = torch.stack([cal[layer] for layer in sorted(cal)])  # (L, H, T)
    return np.stack([trimmed_sum(stack[:, :, a:b]).numpy() for a, b in spans]).astype(np.float64)


def groups_for(lengths: list[int], fixed: int, window: int) -> list[list[int]]:
    """Candidates (by index) in the fewest groups of equal count whose tokens plus `fixed`
    (prefix + suffix) fit `window`; one group when they all fit."""
    n = len(lengths)
    for k in range(1, n + 1):
        size = -(-n // k)
        groups = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
        if all(fixed + sum(lengths[i] for i in g) <= window for g in groups):
            return groups
    raise ModelError(f"a candidate of {max(lengths)} tokens does not fit the model's {window}-token window")


# ---------------------------------------------------------------------------------------------
# the scorer


@dataclass
class ScorerConfig:
    encoding: str = DEFAULT_ENCODING  # block | causal
    truncate: bool = True  # stop after the deepest layer read (False: run the whole stack)
    batch_tokens: int = 4096  # block encoding: block tokens per batch
    block_labels: str = "same"  # block encoding: "same" ([1] on every block, as if each were alone
    # after the prefix, so a block's KV depends on its text only and is cached per chunk) or "slot"
    window: int | None = None  # tokens a query may read (None: the model's positions)
    prompt: PromptConfig = field(default_factory=PromptConfig)

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ModelError(f"unknown QRRanker encoding {self.encoding!r}", f"use one of {', '.join(ENCODINGS)}")
        if self.block_labels not in ("same", "slot"):
            raise ModelError(f"unknown block label scheme {self.block_labels!r}", "use same or slot")

    def to_dict(self) -> dict:
        return asdict(self)


class QRScorer:
    """Scores candidate texts for a question with a head set, one encoding. Keeps the last
    context (the candidates' KV), so several questions over the same candidates (detection over
    one story, the null query) encode them once."""

    def __init__(self, backbone, heads: list[tuple[int, int]] | None, config: ScorerConfig | None = None,
                 kv_cache: BlockKVCache | None = None, adapter: QRAdapter | None = None):
        """`kv_cache`: per-block KV kept between calls (block encoding); None: a private one.
        `adapter`: a trained QRAdapter applied to the read layers' q/k inside scoring only."""
        self.backbone = backbone
        self.adapter = adapter
        self.kv_cache = kv_cache if kv_cache is not None else BlockKVCache()
        self.model = backbone.model
        self.config = config or ScorerConfig()
        self.heads = list(heads) if heads else []
        if self.heads:
            check_heads(self.model, self.heads)
        self.prompt = Prompt(backbone.tokenizer, self.config.prompt)
        self.n_layers = self.model.config.num_hidden_layers
        self.window = self.config.window or int(self.model.config.max_position_embeddings)
        self._contexts: OrderedDict = OrderedDict()
        self._rope_checked = False
        # what cached block KV depends on besides the tokens: the weights and their dtype (a
        # scorer over changed q/k weights must extend it)
        self.model_key = f"{backbone.fingerprint}:{next(self.model.parameters()).dtype}"

    @property
    def layers(self) -> list[int]:
        """Layers read (0-based): those of the heads, or all for detection."""
        return sorted({layer for layer, _ in self.heads}) if self.heads else list(range(self.n_layers))

    @property
    def depth(self) -> int:
        """Layers the forward passes run: up to the deepest read layer, or all without truncation."""
        return max(self.layers) + 1 if self.config.truncate else self.n_layers

    @property
    def captured(self) -> tuple[int, ...]:
        """Read layers whose k_proj inputs the encoders keep (those the adapter changes)."""
        return tuple(layer for layer in self.layers if self.adapter is not None and self.adapter.has(layer))

    def _pieces(self, texts: list[str], memory: str | None):
        """Prefix, candidate blocks, where each candidate's span starts. Causal encoding puts the
        memory in the prefix, as the seed does; block encoding gives it a block of its own
        (`contexts`), so the candidates' KV stays independent of the memory and cacheable."""
        block = self.config.encoding == "block"
        prefix = self.prompt.prefix(None if block else memory)
        same = block and self.config.block_labels == "same"
        pieces = [self.prompt.candidate(1 if same else i + 1, t) for i, t in enumerate(texts)]
        return prefix, [p[0] for p in pieces], [p[1] for p in pieces]

    def contexts(self, texts: list[str], memory: str | None = None) -> list[tuple[list[int], Context]]:
        """[(candidate indices, context)] per group, cached for the last few candidate lists."""
        key = (tuple(texts), memory, self.depth)
        hit = self._contexts.get(key)
        if hit is not None:
            self._contexts.move_to_end(key)
            return hit
        prefix, blocks, starts = self._pieces(texts, memory)
        block = self.config.encoding == "block"
        memory_ids = self.prompt.memory_block(memory) if memory and block else []
        fixed = len(prefix) + len(memory_ids) + self.prompt.suffix_budget()
        groups = groups_for([len(b) for b in blocks], fixed, self.window)
        made = []
        if not block:
            for group in groups:
                made.append((group, encode_causal(self.model, prefix, [blocks[i] for i in group],
                                                  [starts[i] for i in group], self.depth, self.captured)))
        else:
            # the memory block (if any) is encoded like a candidate, read by the query in every
            # group, and is no candidate's span
            states = self._block_states(prefix, blocks + ([memory_ids] if memory_ids else []))
            longest = max(states.lengths(), default=0)
            lead = [len(blocks)] if memory_ids else []
            for group in groups:  # one query position for every group: after the longest block
                context = states.context(lead + group, starts + [0] * len(lead), states.prefix_len + longest)
                context.spans = context.spans[len(lead):]
                made.append((group, context))
        self._contexts[key] = made
        while len(self._contexts) > 2:
            self._contexts.popitem(last=False)
        return made

    def _block_states(self, prefix: list[int], blocks: list[list[int]]) -> BlockStates:
        return encode_blocks_cached(self.model, prefix, blocks, self.depth, self.kv_cache, self.config.batch_tokens,
                                    self.backbone.tokenizer.pad_token_id or 0, self.model_key, self.captured)

    def block_states(self, texts: list[str], memory: str | None = None) -> tuple[BlockStates, list[int]]:
        """Block encoding of `texts` (from the KV cache where it can) and where each block's span
        starts in it; training reads a story's blocks once and picks each question's from them."""
        prefix, blocks, starts = self._pieces(texts, memory)
        return self._block_states(prefix, blocks), starts

    def suffixes(self, question: str) -> list[tuple[list[int], int]]:
        """The question's suffix and the null query's."""
        return [self.prompt.suffix(question), self.prompt.suffix(self.prompt.config.null_query)]

    def suffix_states(self, question: str, context: Context) -> list[SuffixStates]:
        """The backbone's pass of the question's and the null query's suffixes over `context`
        (no gradients), as scoring reads them."""
        import torch

        check = not self._rope_checked
        with torch.no_grad():
            states = suffix_states(self.model, context, self.suffixes(question), self.layers, check,
                                   capture=bool(self.captured))
        self._rope_checked = True
        return states

    def calibrated(self, question: str, context: Context, layers: list[int]) -> dict:
        """Per layer (heads, T_ctx): the question's attention minus the null query's, both
        suffixes run in one batched pass over the context."""
        check = not self._rope_checked
        real, null = query_attentions(self.model, context, self.suffixes(question), layers, check_rope=check,
                                      adapter=self.adapter if layers == self.layers else None)
        self._rope_checked = True
        return calibrated(real, null)

    def scores(self, question: str, texts: list[str], memory: str | None = None) -> np.ndarray:
        """One score per text with the selected heads, higher is better."""
        if not self.heads:
            raise ModelError("no QR heads selected", "give heads or detect them first")
        out = np.zeros(len(texts), dtype=np.float64)
        if not texts:
            return out
        for group, context in self.contexts(texts, memory):
            cal = self.calibrated(question, context, self.layers)
            out[group] = chunk_scores(cal, context.spans, self.heads)
        return out

    def all_head_scores(self, question: str, texts: list[str], memory: str | None = None) -> np.ndarray:
        """(N, layers, heads) per-head calibrated chunk scores of every head of the model (for
        detection; layers 0-based, the whole stack)."""
        out = np.zeros((len(texts), self.n_layers, self.model.config.num_attention_heads))
        for group, context in self.contexts(texts, memory):
            cal = self.calibrated(question, context, list(range(self.n_layers)))
            out[group] = head_scores(cal, context.spans)
        return out


# ---------------------------------------------------------------------------------------------
# position bias


def order_correlation(score, question: str, texts: list[str], seed: int = 0) -> dict:
    """Position bias: `score(question, texts)` for the same candidates in two random orders;
    Pearson and Spearman correlation of each candidate's two scores (1.0: no order effect)."""
    rng = np.random.default_rng(seed)
    a, b = rng.permutation(len(texts)), rng.permutation(len(texts))
    sa = np.empty(len(texts))
    sb = np.empty(len(texts))
    sa[a] = score(question, [texts[i] for i in a])
    sb[b] = score(question, [texts[i] for i in b])
    return {"pearson": _pearson(sa, sb), "spearman": _pearson(_ranks(sa), _ranks(sb))}


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    return ranks


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])
