"""The block-sparse machinery that QRRanker, BlockSearch and BlockSearch's decoder share: the prompt as
token pieces, the encoders (KV of the context a query reads), the KV cache of encoded blocks, and the
query pass (a suffix run over cached context KV, its attention rows computed without a T x T map).

Pieces are tokenized one by one and concatenated, so a candidate's tokens are the same whichever
encoding or slot holds it. Two encodings:
- causal: one prefill of prefix + all candidates (`encode_causal`, QRRanker's seed encoding);
- block: every block attends to the prefix and itself only, RoPE positions restarting right after
  the prefix for each one (`encode_blocks`, one batch over the cached prefix); a query attends to
  everything (prefix, the chosen blocks, itself) and starts at the position after the longest
  block (`BlockStates.context`). A block's KV depends only on the prefix and its own tokens, so it
  is cached per block (`BlockStateCache`).

The query pass (`suffix_states`, `query_attentions`): the suffix runs over the context's KV cache,
its queries are taken from the q_proj outputs of the layers needed (RoPE applied here, checked
against the cache's keys), and only the suffix rows of the softmax are computed; the forward pass
stops after the deepest layer read.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from evsel.errors import ModelError
from evsel.models.runtime.backbone import run_layers
from evsel.models.shared.caches import LRUCache


def check_heads(model, heads: list[tuple[int, int]]) -> None:
    """Every (layer, head) is one of the model's attention heads (layers 0-based)."""
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
    """The prompt's text pieces (QRRanker's by default; BlockSearch and its decoder give their own)."""

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


def dynamic_cache(kv: list[tuple]):
    """A transformers DynamicCache holding `kv` as they are (no copy: the pass's own update makes
    the one copy it needs, and the tensors given are never changed)."""
    from transformers import DynamicCache

    cache = DynamicCache(ddp_cache_data=[(k[..., :0, :], v[..., :0, :]) for k, v in kv])
    for layer, (k, v) in zip(cache.layers, kv):
        layer.keys, layer.values = k, v
    return cache


def _cache_kv(cache, depth: int) -> list[tuple]:
    return [(cache.layers[i].keys, cache.layers[i].values) for i in range(depth)]


def model_device(model):
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
    x = torch.tensor([ids], dtype=torch.long, device=model_device(model))
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
    residuals: list | None = None  # per block (L_i, hidden): `encode_blocks(residual=...)`

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
                  pad_id: int = 0, capture=(), residual: int | None = None) -> BlockStates:
    """Encode `blocks` block-sparse after a prefix whose KV is `prefix_kv` (from `encode_prefix`):
    each block attends to the prefix and itself, at positions P..P+L_i-1, independent of every
    other block. Batched by similar length, right-padded (under the causal mask no real token
    sees a pad), at most `batch_tokens` block tokens (padding included) a batch. `capture`:
    layers whose k_proj inputs are kept too (BlockStates.block_inputs); `residual`: the residual
    stream after this many decoder layers (at most the prefix KV's) is kept too, from the same pass
    (BlockStates.residuals)."""
    import torch

    depth = len(prefix_kv)
    if residual is not None and not 1 <= residual <= depth:
        raise ModelError(f"the residual after layer {residual} needs the prefix's KV of as many layers ({depth} given)")
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
    residuals: list = [None] * len(blocks)
    for batch in batches:
        width = max(len(blocks[i]) for i in batch)
        if width == 0:
            raise ModelError("an empty block cannot be encoded")
        x = torch.full((len(batch), width), pad_id, dtype=torch.long)
        for row, i in enumerate(batch):
            x[row, : len(blocks[i])] = torch.tensor(blocks[i])
        positions = (torch.arange(width) + p).expand(len(batch), width)
        cache = dynamic_cache([(k.expand(len(batch), -1, -1, -1), v.expand(len(batch), -1, -1, -1))
                        for k, v in prefix_kv])
        with torch.inference_mode(), _inputs_of(model, capture) as got:
            states = run_layers(model, sorted({depth, residual or depth}), input_ids=x.to(device), cache=cache,
                                position_ids=positions.to(device))
        kv = _cache_kv(cache, depth)
        for row, i in enumerate(batch):
            n = len(blocks[i])
            out[i] = [(k[row, :, p:p + n].clone(), v[row, :, p:p + n].clone()) for k, v in kv]
            inputs[i] = {layer: got[layer][row, :n].clone() for layer in capture}
            if residual:
                residuals[i] = states[residual][row, :n].clone()
    return BlockStates(prefix_kv, out, None, inputs if capture else None, residuals if residual else None)


def _state_bytes(value: list[tuple]) -> int:
    return sum(t.numel() * t.element_size() for item in value for t in item)


class BlockStateCache(LRUCache):
    """The key/value states of block-sparse encodings, per block (and per prefix), with the
    k_proj inputs an adapter reads: least recently used first out, bounded by bytes. A block's
    states depend only on the model, the prefix, the block's tokens and the depth encoded, which is
    the key; a resident daemon keeps one for its lifetime, so candidates that come back (another
    question over the same book) are not encoded again."""

    def __init__(self, max_bytes: int = 768 << 20):
        super().__init__(max_bytes, size_of=_state_bytes)

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


def encode_blocks_cached(model, prefix_ids: list[int], blocks: list[list[int]], depth: int,
                         cache: BlockStateCache | None, batch_tokens: int = 4096, pad_id: int = 0,
                         model_key: str = "", capture=(), backing=None) -> BlockStates:
    """`encode_prefix` + `encode_blocks`, taking the prefix's and every block's KV (and, for the
    `capture` layers, k_proj inputs) from `cache` when there, encoding only the rest (one batch
    over the prefix) and caching them. `backing`: a slower store behind `cache` (QRRanker's files):
    `load(i)` -> (kv, {layer: inputs}) or None for block i, `store({i: (kv, {layer: inputs})})`
    given the blocks it lacked once they are encoded."""
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
    if backing is not None:
        for i in missing:
            got = backing.load(i)
            if got is not None:
                found[i], found_inputs[i] = got[0], [(got[1][layer],) for layer in capture]
                cache.put(keys[i], found[i])
                if capture:
                    cache.put(ikeys[i], found_inputs[i])
        missing = [i for i in missing if found[i] is None]
    if missing:
        fresh = encode_blocks(model, prefix_kv, [blocks[i] for i in missing], batch_tokens, pad_id, capture)
        for j, i in enumerate(missing):
            found[i] = fresh.blocks[j]
            cache.put(keys[i], found[i])
            if capture:
                found_inputs[i] = [(fresh.block_inputs[j][layer],) for layer in capture]
                cache.put(ikeys[i], found_inputs[i])
        if backing is not None:
            backing.store({i: (found[i], {layer: x for layer, (x,) in zip(capture, found_inputs[i])})
                           for i in missing})
    if not capture:
        return BlockStates(prefix_kv, found)
    return BlockStates(prefix_kv, found, {layer: x for layer, (x,) in zip(capture, prefix_inputs)},
                       [{layer: x for layer, (x,) in zip(capture, item)} for item in found_inputs])


# ---------------------------------------------------------------------------------------------
# the query pass


def rotate(x, cos, sin):
    """RoPE as Llama applies it: x * cos + rotate_half(x) * sin."""
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def query_attentions(model, context: Context, suffixes: list[tuple[list[int], int]], layers: list[int],
                     check_rope: bool = False, adapter=None, heads: dict | None = None) -> list[dict]:
    """Run each suffix over `context` (only the suffixes are computed; the context KV is not
    changed), the question and the null query in one batched pass: [(ids, span_start)] -> one
    {layer: (heads, T_ctx) float32} each, the attention of each query-span token (suffix tokens
    from `span_start` on) onto each context token, averaged over those tokens. Softmax rows over
    everything a suffix token sees (context, earlier suffix tokens, itself), as the model computes
    them; only those rows are built. `layers` are 0-based; the pass stops after the deepest.
    `check_rope`: also verify that our RoPE of k_proj reproduces the cache's keys. Shorter
    suffixes are right-padded; under the causal mask no real token sees a pad. With `adapter`
    (a LoRAAdapter) the read layers' q/k carry its deltas; the backbone's pass does not. `heads`:
    {layer: the query heads read} (`head_attention`)."""
    import torch

    with torch.inference_mode():
        states = suffix_states(model, context, suffixes, layers, check_rope, adapter is not None)
        return head_attention(model, read_states(context, layers), states, layers, adapter, heads)


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


# suffixes that begin alike (the question's and the null query's: separator, closing instruction,
# "Query:") run those tokens once over the context, then each its own rest (`suffix_states`);
# False: one padded batch of whole suffixes, as before (bench/cold_rerank.py times both)
SHARE_LEADING = True
# the suffix passes let torch's SDPA read the KV heads as they are (enable_gqa) instead of copying
# each to its query heads over the whole context (transformers does that copy whenever a mask is
# given, as a suffix over cached context needs); the same attention, without ~15 MB moved a layer
GQA_SDPA = True


@contextmanager
def _gqa_sdpa():
    """transformers' switch for `enable_gqa` with a mask, on for the passes inside (process-wide
    while they run: any other pass meanwhile computes the same attention the same way)."""
    import os

    import torch

    key = "TRANSFORMERS_SDPA_FORCE_GQA"
    if not GQA_SDPA or os.environ.get(key) is not None or \
            tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 5):
        yield
        return
    os.environ[key] = "1"
    try:
        yield
    finally:
        os.environ.pop(key, None)


def leading_shared(suffixes: list[tuple[list[int], int]]) -> int:
    """How many leading tokens all of several suffixes share, each keeping one of its own."""
    if len(suffixes) < 2:
        return 0
    ids = [list(s[0]) for s in suffixes]
    most = min(len(x) for x in ids) - 1
    n = 0
    while n < most and all(x[n] == ids[0][n] for x in ids):
        n += 1
    return n


def suffix_states(model, context: Context, suffixes: list[tuple[list[int], int]], layers: list[int],
                  check_rope: bool = False, capture: bool = False) -> list[SuffixStates]:
    """The backbone's pass of `suffixes` over `context` (stopping after the deepest of `layers`):
    their shared leading tokens once, then each suffix's rest (`SHARE_LEADING`), else one padded
    batch; call under no_grad or inference_mode. `capture`: keep the k_proj inputs of the read
    layers (an adapter reads them)."""
    import torch

    # the shared path writes each pass's K/V into one buffer in place: only where nothing is
    # differentiated (a trained router's loss backpropagates through these passes)
    shared = leading_shared(suffixes) if SHARE_LEADING and not torch.is_grad_enabled() else 0
    if shared >= 2:
        return _suffix_states_shared(model, context, suffixes, layers, check_rope, capture, shared)
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
    cache = dynamic_cache([(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in context.kv[:depth]])
    n_heads = model.config.num_attention_heads
    with _inputs_of(model, layers if capture else ()) as got_inputs, _gqa_sdpa():
        got = run_layers(model, [depth], taps=taps, input_ids=x.to(device), cache=cache, position_ids=positions)
    t_ctx = context.length
    cos, sin = inner.rotary_emb(context.kv[0][0], positions[:1])  # (1, W, d), the model's dtype
    cos, sin = cos[:, None], sin[:, None]
    out = [SuffixStates({}, {}, {} if capture else None, positions[0, : len(ids)], start) for ids, start in suffixes]
    for layer in layers:
        keys = cache.layers[layer].keys  # (B, kv, T_ctx + W, d), post-RoPE
        head_dim = keys.shape[-1]
        q_all = rotate(got[("q", layer)].view(b, width, n_heads, head_dim).transpose(1, 2), cos, sin)
        if check_rope:
            k = rotate(got[("k", layer)].view(b, width, keys.shape[1], head_dim).transpose(1, 2), cos, sin)
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


def _slot_cache(kv: list[tuple], room: int):
    """A transformers DynamicCache holding `kv` (per layer (1, kv, T, d)) in buffers with `room` more
    slots: a pass writes its tokens' K/V in place after the ones held (`_SlotLayer.hold`), so passes
    over one long context never copy it again (a concatenating cache copies it for every pass and layer)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class _SlotLayer(DynamicLayer):
        def __init__(self, keys, values):
            super().__init__()
            t = keys.shape[-2]
            self.buffers = []
            for held in (keys, values):
                buffer = held.new_empty((*held.shape[:-2], t + room, held.shape[-1]))
                buffer[..., :t, :] = held
                self.buffers.append(buffer)
            self.device = keys.device
            self.is_initialized = True
            self.hold(t)

        def hold(self, n: int) -> None:
            """Hold the first n slots (what the next pass reads before its own tokens)."""
            self.keys, self.values = self.buffers[0][..., :n, :], self.buffers[1][..., :n, :]

        def update(self, key_states, value_states, *args, **kwargs):
            at, n = self.keys.shape[-2], key_states.shape[-2]
            self.buffers[0][..., at:at + n, :] = key_states
            self.buffers[1][..., at:at + n, :] = value_states
            self.hold(at + n)
            return self.keys, self.values

    cache = DynamicCache(ddp_cache_data=[(k[..., :0, :], v[..., :0, :]) for k, v in kv])
    cache.layers = [_SlotLayer(k, v) for k, v in kv]
    return cache


def _suffix_states_shared(model, context: Context, suffixes: list[tuple[list[int], int]], layers: list[int],
                          check_rope: bool, capture: bool, shared: int) -> list[SuffixStates]:
    """`suffix_states` where every suffix starts with the same `shared` tokens: those run once over
    the context (their states are the same in every suffix: causal attention), then each suffix's
    own tokens over the context and them, unpadded. The query pass's cost is mostly its rows'
    attention over the whole context, so rows computed once are cost saved."""
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
    n_heads = model.config.num_attention_heads
    t_ctx = context.length
    cache = _slot_cache(context.kv[:depth], max(len(ids) for ids, _ in suffixes))

    def run(ids: list[int], first: int, held: int):
        for layer in cache.layers:
            layer.hold(held)
        x = torch.tensor([ids], dtype=torch.long, device=device)
        positions = (torch.arange(len(ids), device=device) + first)[None]
        with _inputs_of(model, layers if capture else ()) as got_inputs, _gqa_sdpa():
            got = run_layers(model, [depth], taps=taps, input_ids=x, cache=cache, position_ids=positions)
        return got, dict(got_inputs)

    lead, lead_inputs = run(list(suffixes[0][0][:shared]), context.next_position, t_ctx)
    out = []
    for row, (ids, start) in enumerate(suffixes):
        rest, rest_inputs = run(list(ids[shared:]), context.next_position + shared, t_ctx + shared)
        kv = [(layer.keys, layer.values) for layer in cache.layers]  # this suffix's, until the next one's pass
        n = len(ids)
        positions = torch.arange(n, device=device) + context.next_position
        cos, sin = inner.rotary_emb(context.kv[0][0], positions[None])  # (1, n, d), the model's dtype
        cos, sin = cos[:, None], sin[:, None]
        state = SuffixStates({}, {}, {} if capture else None, positions, start)
        for layer in layers:
            keys = kv[layer][0]  # (1, kv, T_ctx + n, d), post-RoPE
            head_dim = keys.shape[-1]
            q = torch.cat([lead[("q", layer)], rest[("q", layer)]], dim=1)
            q = rotate(q.view(1, n, n_heads, head_dim).transpose(1, 2), cos, sin)
            if check_rope and row == 0:
                k = torch.cat([lead[("k", layer)], rest[("k", layer)]], dim=1)
                k = rotate(k.view(1, n, keys.shape[1], head_dim).transpose(1, 2), cos, sin)
                if not torch.allclose(k[0].float(), keys[0, :, t_ctx:t_ctx + n].float(), atol=1e-2, rtol=1e-2):
                    raise ModelError("this backbone's attention is not Llama-style RoPE attention; QRRanker cannot "
                                     "read its heads", "use a Llama-family backbone (e.g. the bundled SmolLM2)")
            state.queries[layer] = q[0, :, start:n]
            state.keys[layer] = keys[0, :, t_ctx:t_ctx + n].clone()  # the buffer's slots are the next suffix's
            if capture:
                state.inputs[layer] = torch.cat([lead_inputs[layer][0], rest_inputs[layer][0]])
        out.append(state)
    return out


def rope_tables(model, positions):
    """float32 cos, sin (T, d) of the model's RoPE at `positions`."""
    import torch

    cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=torch.float32, device=positions.device), positions[None])
    return cos[0].float(), sin[0].float()


def head_attention(model, context: ReadStates, suffixes: list[SuffixStates], layers: list[int],
                   adapter=None, heads: dict | None = None) -> list[dict]:
    """The attention rows of each suffix's query span onto the context's tokens, averaged over
    the span: one {layer: (heads, T_ctx) float32} per suffix. With `adapter`, the adapted layers'
    queries and keys (context and suffix) get its rotated LoRA deltas first. Differentiable in the
    adapter's parameters when run with gradients. `heads`: {layer: the query heads wanted}: only
    their rows are computed, the others left at zero (None: every head)."""
    import torch

    inner = model.model
    n_heads = model.config.num_attention_heads
    adapted = [layer for layer in layers if adapter is not None and adapter.has(layer)]
    if adapted and (context.inputs is None or any(s.inputs is None for s in suffixes)):
        raise ModelError("the adapter needs the k_proj inputs of the context and the query",
                         "encode with the adapter's layers captured")
    tables = {}
    if adapted:
        tables["ctx"] = rope_tables(model, context.positions)
        for i, s in enumerate(suffixes):
            tables[i] = rope_tables(model, s.positions)
    out: list[dict] = [{} for _ in suffixes]
    for layer in layers:
        scaling = float(inner.layers[layer].self_attn.scaling)
        k_ctx = context.keys[layer].float()  # (kv, T_ctx, d)
        kv_heads, t_ctx, head_dim = k_ctx.shape
        group = n_heads // kv_heads
        if layer in adapted:
            cos, sin = tables["ctx"]
            delta = adapter.delta(layer, "k", context.inputs[layer]).view(t_ctx, kv_heads, head_dim).transpose(0, 1)
            k_ctx = k_ctx + rotate(delta, cos, sin)
        wanted = list(range(n_heads)) if heads is None else sorted(heads[layer])
        reads = torch.tensor([h // group for h in wanted], device=k_ctx.device)  # head h reads KV h // group
        k_ctx = k_ctx.index_select(0, reads)
        for row, s in enumerate(suffixes):
            q = s.queries[layer].float()  # (H, S_q, d)
            k_suf = s.keys[layer].float()  # (kv, n, d)
            n, start = k_suf.shape[1], s.start
            if layer in adapted:
                cos, sin = tables[row]
                dq = adapter.delta(layer, "q", s.inputs[layer][start:]).view(n - start, n_heads, head_dim)
                q = q + rotate(dq.transpose(0, 1), cos[start:], sin[start:])
                dk = adapter.delta(layer, "k", s.inputs[layer]).view(n, kv_heads, head_dim).transpose(0, 1)
                k_suf = k_suf + rotate(dk, cos, sin)
            if heads is not None:
                q = q[wanted]
            k_all = torch.cat([k_ctx, k_suf.index_select(0, reads)], dim=1)  # (wanted, T_ctx + n, d)
            logits = torch.matmul(q, k_all.transpose(1, 2)) * scaling  # (H, S_q, T_ctx + n)
            causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device))
            allowed = torch.cat([torch.ones(n - start, t_ctx, dtype=torch.bool, device=q.device),
                                 causal[start:n, :n]], dim=1)
            weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
            rows = weights[:, :, :t_ctx].mean(dim=1)  # (wanted, T_ctx)
            if heads is not None:
                rows = torch.zeros(n_heads, t_ctx, dtype=rows.dtype, device=rows.device).index_copy(
                    0, torch.tensor(wanted, device=rows.device), rows)
            out[row][layer] = rows
    return out
