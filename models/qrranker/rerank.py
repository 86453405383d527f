"""QRRanker (seed 003): listwise reranking with the backbone's query-focused retrieval (QR) heads.

Prompt (the seed's template, Appx. J.3, in the backbone's chat format; models/shared/blocksparse.py's
`Prompt`):

    <chat header> Here are some retrieved chunks:      <- prefix (shared; the KV everything reuses)
    \\n\\n[1] chunk text                                  <- candidate 1: its span is "[1] chunk text"
    ...
    \\n\\n[K] chunk text
    \\n\\nPlease find ... in the chunks above.\\n\\nQuery: {question}<chat footer>   <- suffix

The query span is the suffix after its separator: the closing instruction, "Query: q" and the
assistant header, as QRHead defines it.

Score of candidate c for head (l, h): the attention of each query-span token onto c's tokens
(softmax over everything the token sees, as the model computes it: post-RoPE q.k times the
layer's scaling, KV head h // group for query head h), averaged over the query-span tokens;
calibrated per token by subtracting the same quantity for the null query "N/A" run over the same
context KV (only the suffix is recomputed); summed over the selected heads per token; tokens
below mean - 2 std of the candidate's calibrated values dropped; the rest summed. The query pass
is blocksparse's (`query_attentions`: no T x T map, only the suffix rows), truncated after the
deepest selected layer.

Two candidate encodings (blocksparse's encoders): causal, one prefill of prefix + all candidates
(the seed); block, every candidate attends to the prefix and itself only, so its KV is cached per
candidate and the suffix reads them all from the position after the longest.

Beyond the context window (causal: prefix + candidates + suffix > the model's positions; block:
the keys one query reads), candidates go in groups of equal size sharing the prefix, each group
scored by its own query and null-query passes. Scores stay comparable because each is a
calibrated share of one softmax whose denominator is dominated by the shared prefix (the sink
alone takes most of the mass) and by candidates of a group of the same size and length budget;
with block encoding a candidate's own states are identical in every group, so only that
denominator differs.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
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
    SuffixStates,
    check_heads,
    encode_blocks,
    encode_blocks_cached,
    encode_causal,
    query_attentions,
    suffix_states,
)
from evsel.models.shared.caches import LRUCache
from evsel.models.shared.lora import ADAPTER_FILE, AdapterConfig, AdapterKind, LoRAAdapter
from evsel.models.shared.lora import load_adapter as load_lora
# the head list's format and reader are shared with BlockSearch; QRRanker's users read them here too
from evsel.models.shared.qr_heads import (  # noqa: F401  (HEADS_FORMAT, format_heads: for the recipe and tests)
    HEADS_FILE,
    HEADS_FORMAT,
    format_heads,
    heads_of,
    load_head_file,
    parse_heads,
    shipped_heads_dir,
)

METHOD = "qrranker"
# the query pass computes the attention rows of the selected heads only (False: every head's, as
# detection reads them; bench/cold_rerank.py times both)
READ_HEADS_ONLY = True
ENCODINGS = ("block", "causal")
DEFAULT_ENCODING = "block"
# LoRA on q_proj and k_proj of the read layers, applied inside QR scoring only (blocksparse's
# `head_attention`): layers above an adapted one get the untouched hidden states
ADAPTER = AdapterKind(format="evsel-qrranker-adapter/1", projections=("q", "k"), name="QRRanker adapter",
                      train_command="evsel train qrranker")


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


# ---------------------------------------------------------------------------------------------
# the adapter


def new_adapter(model, heads: list[tuple[int, int]], rank: int = 8, alpha: float = 16.0,
                encoding: str = DEFAULT_ENCODING, seed: int = 0) -> LoRAAdapter:
    """A fresh QRRanker adapter on the layers of `heads` (B at zero: it scores as the untrained heads)."""
    config = AdapterConfig(layers=sorted({layer for layer, _ in heads}), rank=rank, alpha=alpha,
                           heads=[list(h) for h in heads], encoding=encoding)
    return LoRAAdapter.for_model(model, ADAPTER, config, seed)


def load_adapter(folder: str | Path, model) -> LoRAAdapter:
    """The QRRanker adapter in `folder` on the model's device (frozen)."""
    return load_lora(folder, model, ADAPTER)


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
                 kv_cache: BlockStateCache | None = None, adapter: LoRAAdapter | None = None):
        """`kv_cache`: per-block KV kept between calls (block encoding); None: a private one.
        `adapter`: a trained QRRanker adapter applied to the read layers' q/k inside scoring only."""
        self.backbone = backbone
        self.adapter = adapter
        self.kv_cache = kv_cache if kv_cache is not None else BlockStateCache()
        self.model = backbone.model
        self.config = config or ScorerConfig()
        self.heads = list(heads) if heads else []
        if self.heads:
            check_heads(self.model, self.heads)
        self.prompt = Prompt(backbone.tokenizer, self.config.prompt)
        self.n_layers = self.model.config.num_hidden_layers
        self.window = self.config.window or int(self.model.config.max_position_embeddings)
        self.encoded_contexts = LRUCache(max_items=2)  # candidate lists -> their groups' contexts
        self._rope_checked = False
        # what cached block KV depends on besides the tokens: the weights and their dtype (a
        # scorer over changed q/k weights must extend it)
        self.model_key = f"{backbone.fingerprint}:{next(self.model.parameters()).dtype}"
        self.kv_files = None  # BlockKVFiles (`use_kv_files`): the candidates' block KV on disk

    def use_kv_files(self, store_dir: str | Path | None, max_bytes: int | None = None, on_warning=None) -> None:
        """Keep the candidates' block KV in files beside the store in `store_dir` (models/qrranker/kv.py),
        read before encoding and written after (block encoding with "same" labels only: there a
        block's KV depends on its text alone). None: memory only. `max_bytes`: the files' cap;
        `on_warning(message)`: told of a damaged file (deleted and encoded again)."""
        from evsel.models.qrranker import kv as qrranker_kv

        if store_dir is None or self.config.encoding != "block" or self.config.block_labels != "same":
            self.kv_files = None
            return
        cfg = self.model.config
        param = next(self.model.parameters())
        prompt = self.prompt
        kv_heads = cfg.num_key_value_heads
        group = cfg.num_attention_heads // kv_heads
        read: dict = {}  # layer -> the KV heads its QR heads read
        for layer, head in self.heads:
            read.setdefault(layer, set()).add(head // group)
        read = {layer: sorted(heads) for layer, heads in sorted(read.items())} if self.heads else None
        projections = {layer: self.adapter.params[self.adapter.name(layer, "k", "A")] for layer in self.captured}
        digest = qrranker_kv.kv_digest(str(param.dtype).replace("torch.", ""), self.depth, prompt.prefix(None),
                                       prompt.ids(prompt.config.separator), prompt.config.max_chunk_tokens,
                                       self.config.block_labels, self.captured,
                                       [(layer, h) for layer, heads in (read or {}).items() for h in heads],
                                       qrranker_kv.projection_digest(projections) if projections else "")
        root = qrranker_kv.kv_root(store_dir)
        first = len(prompt.prefix(None))  # a block's tokens sit at positions first.. ("same" labels)

        def rope(n: int):
            import torch

            from evsel.models.shared.blocksparse import rope_tables

            return rope_tables(self.model, torch.arange(first, first + n, device=param.device))

        self.kv_files = qrranker_kv.BlockKVFiles(
            root / self.backbone.fingerprint / digest, root, self.depth, kv_heads,
            getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads, cfg.hidden_size,
            self.captured, param.dtype, param.device, read, projections, max_bytes=max_bytes, on_warning=on_warning,
            rope=rope)
        # blocks read from files are quantized: the shared in-memory cache keeps them apart from
        # exact ones (another scorer over the same backbone and depth reads exact states only)
        self.model_key = f"{self.model_key.split(':kv-')[0]}:kv-{digest}"

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

    def pieces(self, texts: list[str], memory: str | None):
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
        hit = self.encoded_contexts.get(key)
        if hit is not None:
            return hit
        prefix, blocks, starts = self.pieces(texts, memory)
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
            states = self._block_states(prefix, blocks + ([memory_ids] if memory_ids else []), texts)
            longest = max(states.lengths(), default=0)
            lead = [len(blocks)] if memory_ids else []
            for group in groups:  # one query position for every group: after the longest block
                context = states.context(lead + group, starts + [0] * len(lead), states.prefix_len + longest)
                context.spans = context.spans[len(lead):]
                made.append((group, context))
        self.encoded_contexts.put(key, made)
        return made

    def _block_states(self, prefix: list[int], blocks: list[list[int]], texts: list[str] | None = None) -> BlockStates:
        """`texts`: the candidates of the first blocks; with `kv_files`, their KV is read from and
        written to files by content hash (a block past them, the memory's, stays in memory)."""
        backing = None
        if self.kv_files is not None and texts:
            backing = _FileBacking(self.kv_files, texts, [len(b) for b in blocks])
        return encode_blocks_cached(self.model, prefix, blocks, self.depth, self.kv_cache, self.config.batch_tokens,
                                    self.backbone.tokenizer.pad_token_id or 0, self.model_key, self.captured,
                                    backing)

    def store_kv(self, texts: list[str], hashes: list[str] | None = None) -> int:
        """Encode and write the block KV files of `texts` that are missing (ingest's background work);
        the in-memory cache is left as it is, so a large ingest does not evict what asks read.
        Returns the blocks written."""
        if self.kv_files is None:
            raise ModelError("this QRRanker scorer keeps no block KV files", "give it a store folder (use_kv_files)")
        hashes = list(hashes) if hashes is not None else [content_hash(t) for t in texts]
        todo = {h: t for h, t in zip(hashes, texts) if not self.kv_files.has(h)}
        if not todo:
            return 0
        prefix, blocks, _ = self.pieces(list(todo.values()), None)
        prefix_kv = self._block_states(prefix, []).prefix
        states = encode_blocks(self.model, prefix_kv, blocks, self.config.batch_tokens,
                               self.backbone.tokenizer.pad_token_id or 0, self.captured)
        self.kv_files.store({h: (states.blocks[j], states.block_inputs[j] if self.captured else {})
                             for j, h in enumerate(todo)})
        return len(todo)

    def block_states(self, texts: list[str], memory: str | None = None) -> tuple[BlockStates, list[int]]:
        """Block encoding of `texts` (from the KV cache where it can) and where each block's span
        starts in it; training reads a story's blocks once and picks each question's from them."""
        prefix, blocks, starts = self.pieces(texts, memory)
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

    def calibrated(self, question: str, context: Context, layers: list[int], selected: bool = False) -> dict:
        """Per layer (heads, T_ctx): the question's attention minus the null query's, both
        suffixes run over the context; `selected`: only the selected heads' rows (the others zero)."""
        check = not self._rope_checked
        read = None
        if selected and READ_HEADS_ONLY and self.heads:
            read = {}
            for layer, head in self.heads:
                read.setdefault(layer, set()).add(head)
        real, null = query_attentions(self.model, context, self.suffixes(question), layers, check_rope=check,
                                      adapter=self.adapter if layers == self.layers else None, heads=read)
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
            cal = self.calibrated(question, context, self.layers, selected=True)
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


class _FileBacking:
    """`encode_blocks_cached`'s backing for a candidate list: block i <-> the KV file of texts[i]."""

    def __init__(self, files, texts: list[str], lengths: list[int]):
        self.files = files
        self.hashes = [content_hash(t) for t in texts]
        self.lengths = lengths

    def load(self, i: int):
        return self.files.load(self.hashes[i], self.lengths[i]) if i < len(self.hashes) else None

    def store(self, items: dict) -> None:
        try:
            self.files.store({self.hashes[i]: value for i, value in items.items() if i < len(self.hashes)})
        except OSError as exc:  # a cache: a full or read-only disk costs the next ask an encode, never a wrong score
            from evsel.models.qrranker import kv as qrranker_kv

            if qrranker_kv.disk_is_full(exc):
                qrranker_kv.note_disk_full(self.files.top)


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
