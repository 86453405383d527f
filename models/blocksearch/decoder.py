"""BlockSearch's trained decoder (seed 001, Sec. 3.2, Appx. A, F, J): every chunk of the decode set
carries a four-digit code, and the query block decodes the code of the chunk that answers it.

Prompt (the seed's Fig. 4 in our chat frame):

    <chat header> Here are some documents, each with a four-digit code:      <- prefix, shared
    \\n\\n[4821] chunk text [4821]                                              <- one block each: the
    ...                                                                          prefix and itself, RoPE
                                                                                 from the prefix's end
    \\n\\nWhich document ... code.\\n\\nQuery: q<assistant header>[d1 d2 d3 d4   <- the query block at the
                                                                                 fixed position P + offset

The chunks' K/V are the frozen backbone's (models/shared/blocksparse.py's encoder, cached per block), so
they cache like every other block and the answering path never sees a trained weight. What trains
is a LoRA adapter on q_proj and v_proj of every layer, applied only to the query block's own
tokens (`Decoder.forward`, our own pass of the query over the context KV): the query learns to read
the chunks and copy a code. This is a deviation from the seed, which fine-tunes the whole model
(chunk encoding included); it keeps training a CPU job and the chunk KV shared.

Digits are single tokens in SmolLM2's vocabulary; the code distribution at each answer slot is the
softmax over the ten digit logits. Decoding is the seed's digit beam search (Algorithm 2: width 25,
5 digits kept per beam and step), constrained to the codes present, so every returned code names a
chunk. Inference codes are a function of each chunk's content hash (collisions in a decode set move
to the next free code), so a chunk's block, and its cached KV, is the same for every question.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from evsel.errors import ModelError
from evsel.models.shared.blocksparse import (
    BlockStateCache,
    Prompt,
    PromptConfig,
    encode_blocks_cached,
    model_device,
    rotate,
)
from evsel.models.shared.lora import AdapterConfig, AdapterKind, LoRAAdapter, load_adapter

FORMAT = "evsel-blocksearch-decoder/1"
CODE_LENGTH = 4
CODES = 10 ** CODE_LENGTH
BEAM_WIDTH = 25
PER_STEP = 5


def decoder_prompt() -> PromptConfig:
    return PromptConfig(instruction="Here are some documents, each with a four-digit code:",
                           closing="Which document above answers the following query? Answer with its code.",
                           query_label="Query:", separator="\n\n", max_chunk_tokens=384, max_query_tokens=96)


# LoRA deltas on q_proj and v_proj of every layer, read by `Decoder.forward` for the query block only
ADAPTER = AdapterKind(format=FORMAT, projections=("q", "v"), name="BlockSearch decoder",
                      train_command="evsel train blocksearch")


def new_adapter(model, rank: int = 8, alpha: float = 16.0, seed: int = 0) -> LoRAAdapter:
    layers = list(range(model.config.num_hidden_layers))
    return LoRAAdapter.for_model(model, ADAPTER, AdapterConfig(layers=layers, rank=rank, alpha=alpha), seed)


def load_decoder_adapter(folder: str | Path, model) -> LoRAAdapter:
    return load_adapter(folder, model, ADAPTER)


def shipped_adapter_dir(fingerprint: str) -> Path:
    return Path(__file__).resolve().parent.parent / "adapters" / fingerprint[:16] / "blocksearch"  # as the other adapters


def digits_of(code: int) -> list[int]:
    if not 0 <= code < CODES:
        raise ModelError(f"{code} is not a {CODE_LENGTH}-digit code")
    return [int(c) for c in f"{code:0{CODE_LENGTH}d}"]


def scope_codes(hashes: list[str]) -> list[int]:
    """One distinct code per chunk, from its content hash (the next free code on a collision, in
    the order given), so a chunk keeps its code, and its block, across questions."""
    if len(hashes) > CODES:
        raise ModelError(f"{len(hashes)} chunks do not fit {CODES} codes", "decode fewer chunks (top_b)")
    taken: set[int] = set()
    out = []
    for h in hashes:
        code = int.from_bytes(hashlib.blake2b(h.encode(), digest_size=8).digest(), "big") % CODES
        while code in taken:
            code = (code + 1) % CODES
        taken.add(code)
        out.append(code)
    return out


def random_codes(n: int, rng) -> list[int]:
    """Distinct random codes (training: fresh for every encoding, the seed's random identifiers)."""
    return rng.sample(range(CODES), n)


class CodeTrie:
    """Which digit may follow a prefix, over a set of codes."""

    def __init__(self, codes: list[int]):
        self.next: dict[tuple, set[int]] = {}
        for code in codes:
            d = digits_of(code)
            for t in range(CODE_LENGTH):
                self.next.setdefault(tuple(d[:t]), set()).add(d[t])

    def allowed(self, prefix) -> list[int]:
        return sorted(self.next.get(tuple(prefix), ()))


@dataclass
class DecoderConfig:
    beam: int = BEAM_WIDTH
    per_step: int = PER_STEP
    batch_tokens: int = 4096
    prompt: PromptConfig = field(default_factory=decoder_prompt)


@dataclass
class DecodeContext:
    """The context the query block reads: per layer the (kv, T, d) K and V of the prefix and the
    coded blocks, the codes in block order, and where the query block starts."""

    keys: list
    values: list
    codes: list[int]
    position: int
    _float: dict | None = None

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[1])

    def float_kv(self, layer: int):
        """Layer `layer`'s K and V as float32, converted once (a beam search reads them 4 times)."""
        if self._float is None:
            self._float = {}
        if layer not in self._float:
            self._float[layer] = (self.keys[layer].float(), self.values[layer].float())
        return self._float[layer]

    def trainable(self) -> DecodeContext:
        """Plain copies (tensors made under inference mode cannot be saved for a backward pass)."""
        return DecodeContext([k.clone() for k in self.keys], [v.clone() for v in self.values], self.codes,
                             self.position)


class Decoder:
    """The trained decoder of one backbone (`adapter` None: the untouched backbone decodes)."""

    def __init__(self, backbone, adapter: LoRAAdapter | None = None, config: DecoderConfig | None = None,
                 kv_cache: BlockStateCache | None = None):
        self.backbone = backbone
        self.model = backbone.model
        self.adapter = adapter
        self.config = config or DecoderConfig()
        self.kv_cache = kv_cache
        cfg = self.model.config
        self.n_layers = cfg.num_hidden_layers
        self.n_heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.prompt = Prompt(backbone.tokenizer, self.config.prompt)
        self.prefix_ids = self.prompt.prefix()
        self.separator = self.prompt.ids(self.config.prompt.separator)
        self.digit_ids = []
        for d in range(10):
            ids = self.prompt.ids(str(d))
            if len(ids) != 1:
                raise ModelError("this backbone's tokenizer does not give each digit one token; BlockSearch's "
                                 "codes need that", "use a backbone like the bundled SmolLM2")
            self.digit_ids.append(ids[0])
        self.open_ids, self.close_ids = self.prompt.ids("["), self.prompt.ids("]")
        self.tail_open = self.prompt.ids(" [")
        # the longest block: separator, [code], the text, [code]
        self.query_offset = (len(self.separator) + 2 * (len(self.open_ids) + CODE_LENGTH + len(self.close_ids))
                             + len(self.tail_open) + self.config.prompt.max_chunk_tokens)
        self.model_key = f"{backbone.fingerprint}:decoder"
        self.pad_id = backbone.tokenizer.pad_token_id or 0
        self.encoded = 0

    @property
    def query_position(self) -> int:
        return len(self.prefix_ids) + self.query_offset

    # prompt pieces
    def code_ids(self, code: int) -> list[int]:
        return [self.digit_ids[d] for d in digits_of(code)]

    def block(self, code: int, text: str) -> list[int]:
        body = self.prompt.ids(" " + text.strip())[: self.config.prompt.max_chunk_tokens]
        tag = self.code_ids(code)
        return (self.separator + self.open_ids + tag + self.close_ids + body + self.tail_open + tag
                + self.close_ids)

    def query_ids(self, question: str) -> list[int]:
        """The query block up to the first answer slot: separator, instruction, query, the chat
        footer and '['; the next token is the code's first digit."""
        return self.prompt.suffix(question)[0] + self.open_ids

    # context
    def context(self, texts: list[str], codes: list[int]) -> DecodeContext:
        """The prefix and one coded block per text, block-sparse, every layer (the frozen backbone;
        blocks come from the KV cache when there)."""
        if len(set(codes)) != len(codes):
            raise ModelError("two chunks of a decode set share a code")
        blocks = [self.block(c, t) for c, t in zip(codes, texts)]
        before = self.kv_cache.misses if self.kv_cache is not None else 0
        states = encode_blocks_cached(self.model, self.prefix_ids, blocks, self.n_layers, self.kv_cache,
                                         self.config.batch_tokens, self.pad_id, self.model_key)
        self.encoded += (self.kv_cache.misses - before) if self.kv_cache is not None else len(blocks)
        ctx = states.context(next_position=self.query_position)
        return DecodeContext([k[0] for k, _ in ctx.kv], [v[0] for _, v in ctx.kv], list(codes), self.query_position)

    # the query pass
    def forward(self, ctx: DecodeContext, ids, start: int, past: list | None = None):
        """The query tokens `ids` (B, S) at positions start.. over the context KV and their own
        `past` (per layer (B, kv, S0, d) K and V, float32); the adapter's deltas on their q and v.
        Returns (final hidden states (B, S, hidden), the new past). Differentiable in the adapter."""
        import torch

        inner = self.model.model
        b, s = ids.shape
        x = inner.embed_tokens(ids)
        positions = (torch.arange(s, device=ids.device) + start)[None]
        cos, sin = inner.rotary_emb(x, positions)
        cos, sin = cos[:, None].float(), sin[:, None].float()
        h, kvh, d = self.n_heads, self.kv_heads, self.head_dim
        out_past = []
        for li, layer in enumerate(inner.layers):
            attn = layer.self_attn
            y = layer.input_layernorm(x)
            q, k, v = attn.q_proj(y), attn.k_proj(y), attn.v_proj(y)
            if self.adapter is not None and self.adapter.has(li):
                q = q + self.adapter.delta(li, "q", y).to(q.dtype)
                v = v + self.adapter.delta(li, "v", y).to(v.dtype)
            q = rotate(q.view(b, s, h, d).transpose(1, 2).float(), cos, sin)
            k = rotate(k.view(b, s, kvh, d).transpose(1, 2).float(), cos, sin)
            v = v.view(b, s, kvh, d).transpose(1, 2).float()
            if past is not None:
                k = torch.cat([past[li][0], k], dim=2)
                v = torch.cat([past[li][1], v], dim=2)
            out_past.append((k, v))
            ctx_k, ctx_v = ctx.float_kv(li)
            o = _attend(q, ctx_k, ctx_v, k, v, float(attn.scaling))
            x = x + attn.o_proj(o.transpose(1, 2).reshape(b, s, h * d).to(x.dtype))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x, out_past

    def digit_logits(self, hidden):
        """(..., hidden) final states -> (..., 10) float32 logits of the ten digit tokens."""
        normed = self.model.model.norm(hidden)
        weight = self.model.lm_head.weight[self.digit_ids]
        return normed.float() @ weight.float().t()

    # training losses
    def teacher_forced_logits(self, ctx: DecodeContext, question: str, prefixes: list[list[int]]):
        """(B, 4, 10) digit logits at the four answer slots, each row fed its own digit prefix
        (the gold code's, or a rollout's): the slot t reads digits < t of its row."""
        import torch

        base = self.query_ids(question)
        rows = [base + [self.digit_ids[x] for x in p[: CODE_LENGTH - 1]] for p in prefixes]
        ids = torch.tensor(rows, dtype=torch.long, device=model_device(self.model))
        hidden, _ = self.forward(ctx, ids, ctx.position)
        return self.digit_logits(hidden[:, -CODE_LENGTH:])

    def train_logits(self, ctx: DecodeContext, question: str, gold: list[int], rng=None):
        """One training pass: the query block once (with gradients), then the gold code's digits
        teacher-forced and, with `rng`, a rollout sampled from the model's own digit distribution
        (restricted to codes present, no gradients) replayed at the same slots, both rows over the
        shared query KV. Returns ((4, 10) teacher-forced logits, (4, 10) replay logits or None,
        the rollout's digits or None)."""
        import torch

        device = model_device(self.model)
        ids = torch.tensor([self.query_ids(question)], dtype=torch.long, device=device)
        hidden, past = self.forward(ctx, ids, ctx.position)
        first = self.digit_logits(hidden[0, -1])  # slot 1: the same for both rows
        at = ctx.position + ids.shape[1]
        rollout = None
        if rng is not None:
            trie = CodeTrie(ctx.codes)
            with torch.no_grad():
                quiet = [(k.detach(), v.detach()) for k, v in past]
                logits, rollout = first.detach(), []
                for t in range(CODE_LENGTH):
                    allowed = trie.allowed(rollout)
                    p = torch.softmax(logits[allowed].double(), dim=0).cpu().numpy()
                    rollout.append(allowed[int(rng.choice(len(allowed), p=p / p.sum()))])
                    if t < CODE_LENGTH - 1:
                        step = torch.tensor([[self.digit_ids[rollout[-1]]]], device=device)
                        h, quiet = self.forward(ctx, step, at + t, quiet)
                        logits = self.digit_logits(h[0, -1])
        rows = [gold] + ([rollout] if rollout is not None else [])
        tail = torch.tensor([[self.digit_ids[x] for x in r[: CODE_LENGTH - 1]] for r in rows], device=device)
        shared = [(k.expand(len(rows), -1, -1, -1), v.expand(len(rows), -1, -1, -1)) for k, v in past]
        h, _ = self.forward(ctx, tail, at, shared)
        rest = self.digit_logits(h)  # (rows, 3, 10): slots 2-4
        out = torch.cat([first[None, None].expand(len(rows), 1, -1), rest], dim=1)
        return out[0], (out[1] if rollout is not None else None), rollout

    # decoding
    def beam_search(self, ctx: DecodeContext, question: str, width: int | None = None,
                    per_step: int | None = None) -> list[tuple[int, float]]:
        """The seed's digit beam search (Algorithm 2) over the codes in `ctx`: [(code, log p)],
        best first, at most `width` codes, every one a code of the context."""
        import torch

        width = width or self.config.beam
        per_step = per_step or self.config.per_step
        trie = CodeTrie(ctx.codes)
        device = model_device(self.model)
        with torch.inference_mode():
            ids = torch.tensor([self.query_ids(question)], dtype=torch.long, device=device)
            hidden, past = self.forward(ctx, ids, ctx.position)
            at = ctx.position + ids.shape[1]
            beams: list[list[int]] = [[]]
            scores = torch.zeros(1, dtype=torch.float64)
            for t in range(CODE_LENGTH):
                logp = torch.log_softmax(self.digit_logits(hidden[:, -1]).double(), dim=-1).cpu()  # (beams, 10)
                cand = torch.full_like(logp, float("-inf"))
                for row, prefix in enumerate(beams):
                    allowed = torch.tensor(trie.allowed(prefix), dtype=torch.long)
                    values = logp[row, allowed]
                    keep = allowed[torch.topk(values, min(per_step if t else width, len(allowed))).indices]
                    cand[row, keep] = scores[row] + logp[row, keep]
                flat = cand.flatten()
                n = min(width, int(torch.isfinite(flat).sum()))
                best = torch.topk(flat, n).indices
                parents, digits = (best // 10).tolist(), (best % 10).tolist()
                beams = [beams[p] + [dg] for p, dg in zip(parents, digits)]
                scores = flat[best]
                if t < CODE_LENGTH - 1:
                    index = torch.tensor(parents, dtype=torch.long, device=device)
                    past = [(k.index_select(0, index), v.index_select(0, index)) for k, v in past]
                    step = torch.tensor([[self.digit_ids[dg]] for dg in digits], dtype=torch.long, device=device)
                    hidden, past = self.forward(ctx, step, at, past)
                    at += 1
        out = [(int("".join(map(str, code))), float(score)) for code, score in zip(beams, scores.tolist())]
        return sorted(out, key=lambda item: -item[1])

    def rank(self, question: str, texts: list[str], hashes: list[str]) -> list[tuple[int, float]]:
        """[(index into texts, log p)] of the codes the beam search returns, best first."""
        codes = scope_codes(hashes)
        ctx = self.context(texts, codes)
        where = {c: i for i, c in enumerate(codes)}
        return [(where[code], score) for code, score in self.beam_search(ctx, question)]


def _attend(q, ctx_k, ctx_v, own_k, own_v, scaling: float):
    """Attention of the query tokens q (B, H, S, d) over the shared context (kv, T, d), which every
    row reads, and their own keys (B, kv, S0 + S, d) under the causal mask; GQA: head h reads KV
    head h // (H / kv). Returns (B, H, S, d)."""
    import torch

    b, h, s, d = q.shape
    kvh = ctx_k.shape[0]
    qg = q.reshape(b, kvh, h // kvh, s, d)
    t = ctx_k.shape[1]
    on_ctx = torch.einsum("bkgsd,ktd->bkgst", qg, ctx_k) * scaling
    on_own = torch.einsum("bkgsd,bktd->bkgst", qg, own_k) * scaling
    n = own_k.shape[2]
    visible = torch.arange(n, device=q.device)[None, :] <= (torch.arange(s, device=q.device)[:, None] + n - s)
    on_own = on_own.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(torch.cat([on_ctx, on_own], dim=-1), dim=-1)
    out = torch.einsum("bkgst,ktd->bkgsd", weights[..., :t], ctx_v)
    out = out + torch.einsum("bkgst,bktd->bkgsd", weights[..., t:], own_v)
    return out.reshape(b, h, s, d)


# ---------------------------------------------------------------------------------------------
# the loss (teacher-forced cross-entropy + the on-policy auxiliary loss, Appx. F)


def teacher_weights(n: int, gold: list[int], relevance: dict[int, float] | None = None, gold_margin: float = 4.0,
                    temperature: float = 1.0) -> np.ndarray:
    """w_k ∝ exp(r_k / τ) over the context's chunks: r = gold_margin + 1 for gold chunks, a
    relevance in [0, 1] for the others (BM25 here, where the seed has an 8B embedder)."""
    r = np.zeros(n)
    for k, value in (relevance or {}).items():
        r[k] = float(value)
    r[list(gold)] = gold_margin + 1.0
    w = np.exp((r - r.max()) / temperature)
    return w / w.sum()


def position_teachers(codes: list[int], weights: np.ndarray, rollout: list[int]) -> np.ndarray:
    """(4, 10) q_t: the candidate-weighted digit vote of the candidates whose first t digits match
    the rollout's (Algorithm 1, step 2); a row with no match is all zero (no loss there)."""
    out = np.zeros((CODE_LENGTH, 10))
    digits = [digits_of(c) for c in codes]
    for t in range(CODE_LENGTH):
        for w, dg in zip(weights, digits):
            if dg[:t] == rollout[:t]:
                out[t, dg[t]] += w
        total = out[t].sum()
        if total > 0:
            out[t] /= total
    return out


def decoder_loss(decoder: Decoder, ctx: DecodeContext, question: str, gold_code: int, weights=None,
                 aux_weight: float = 0.0, rng=None):
    """L = CE(gold code, teacher-forced) + λ L_aux: the auxiliary term is the cross-entropy of the
    per-position teachers (from the candidates' `weights`) against the model replayed on its own
    rollout's prefix. Returns (loss, {"ce", "aux"} floats, the rollout or None)."""
    import torch

    gold = digits_of(gold_code)
    on_policy = weights is not None and aux_weight > 0 and rng is not None
    forced, replay, rollout = decoder.train_logits(ctx, question, gold, rng if on_policy else None)
    target = torch.tensor(gold, dtype=torch.long, device=forced.device)
    ce = -torch.log_softmax(forced, dim=-1).gather(1, target[:, None]).mean()
    parts = {"ce": float(ce.detach())}
    loss = ce
    if on_policy:
        q = torch.tensor(position_teachers(ctx.codes, weights, rollout), dtype=replay.dtype, device=replay.device)
        has = q.sum(dim=1) > 0
        logp = torch.log_softmax(replay, dim=-1)
        aux = -(q[has] * logp[has]).sum(dim=1).mean() if bool(has.any()) else logp.new_zeros(())
        loss = loss + aux_weight * aux
        parts["aux"] = float(aux.detach())
    return loss, parts, rollout
