"""One backbone pass per chunk for every per-chunk state that reads the chunk in QRRanker's block
context (issue 45's shared encode pass; bench/encode.py times it against the separate passes).

The pass is QRRanker's block encoding (models/shared/blocksparse.py's `encode_blocks`: each chunk as its
"\\n\\n[1] text" block after QRRanker's prefix, batched by length, to the depth the states need), and
from that one forward it keeps:
- the block KV that QRRanker's stored files hold (`QRScorer.store_kv` computes exactly this: the same
  encoder, prefix, batches and depth), written to the scorer's KV files;
- the residual stream after `layer` decoder layers over the chunk's own text tokens (the label
  left out), mean-pooled into `pool` segments: UNREAL's chunk-state shape, stored in the state cache
  under its own config (`block_state_key`).

What it does not give: UNREAL's chunk states as UNREAL defines and was trained on them. UNREAL
encodes a chunk alone after a BOS sink ([BOS] + text, models/unreal/selection.py); here the same text sits
after QRRanker's 30-token chat prefix and the block label, and the residual at UNREAL's layer 24
differs: on the Sherlock Holmes book's first 150 chunks, pooled states' cosine 0.99 raw but 0.92
standardized (min 0.64), and UNREAL's scores over them rank with Spearman 0.95-0.97 against the own
states, the top 10 sharing 5-9 of 10 chunks on six questions (docs/UNREAL.md). So UNREAL's ingest
hook keeps its own pass, and these states are kept apart (another config key) until UNREAL is
evaluated, and if need be trained, on them. BlockSearch's keys cannot come from this pass either:
they read each chunk after BlockSearch's own prefix, without the label, through its trained
router's LoRA on every layer up to the routing layer.
"""

from __future__ import annotations

import numpy as np

CONTEXT = "qrranker-block"


def block_state_key(layer: int, pool: int) -> str:
    """The state-cache config of residual states read in QRRanker's block context (never UNREAL's
    own `layer=..;pool=..`)."""
    return f"layer={layer};pool={pool};context={CONTEXT}"


class BlockPass:
    """The shared pass for one QRRanker scorer (block encoding, "same" labels, with KV files) and
    one residual read-out (`layer`: decoder layers, 1-based; `pool`: segments)."""

    def __init__(self, scorer, layer: int, pool: int):
        from evsel.errors import ModelError

        if scorer.config.encoding != "block" or scorer.config.block_labels != "same":
            raise ModelError("the shared encode pass reads QRRanker's block encoding with the same label on every block")
        self.scorer = scorer
        self.layer = layer
        self.pool = pool
        self.depth = max(scorer.depth, layer)
        self.label = len(scorer.prompt.ids("[1]"))
        self._prefix_kv = None
        self.encoded_tokens = 0

    @property
    def prefix_kv(self) -> list[tuple]:
        from evsel.models.shared.blocksparse import encode_prefix

        if self._prefix_kv is None:
            self._prefix_kv = encode_prefix(self.scorer.model, self.scorer.prompt.prefix(None), self.depth)
        return self._prefix_kv

    def encode(self, texts: list[str]) -> tuple[list, list, np.ndarray]:
        """(per text its block KV of the scorer's depth, per text the captured k_proj inputs, the
        pooled residuals (N, pool, hidden) float16), from one forward."""
        from evsel.models.shared.blocksparse import encode_blocks
        from evsel.models.unreal.selection import pool_states

        scorer = self.scorer
        _, blocks, starts = scorer.pieces(texts, None)
        states = encode_blocks(scorer.model, self.prefix_kv, blocks, scorer.config.batch_tokens,
                               scorer.backbone.tokenizer.pad_token_id or 0, scorer.captured, residual=self.layer)
        kv = [block[: scorer.depth] for block in states.blocks]
        inputs = states.block_inputs if scorer.captured else [{} for _ in blocks]
        hidden = scorer.model.config.hidden_size
        pooled = np.zeros((len(texts), self.pool, hidden), np.float16)
        for i, (block, start) in enumerate(zip(blocks, starts)):
            first = min(start + self.label, len(block) - 1)  # the text after "[1]" (a cut block keeps a token)
            text = states.residuals[i][first:][None]
            pooled[i] = pool_states(text, [text.shape[1]], self.pool, offset=0)[0].cpu().numpy().astype(np.float16)
        self.encoded_tokens += sum(len(b) for b in blocks)
        return kv, inputs, pooled

    def encode_store(self, chunks, states=None) -> int:
        """Encode `chunks` (ChunkRecords) once: their QRRanker KV files written, and with `states` (a
        StateCache) the pooled residuals stored under `block_state_key`. Returns the chunks encoded."""
        chunks = list({c.content_hash: c for c in chunks}.values())
        if not chunks:
            return 0
        kv, inputs, pooled = self.encode([c.text for c in chunks])
        files = self.scorer.kv_files
        if files is not None:
            files.store({c.content_hash: (kv[i], inputs[i]) for i, c in enumerate(chunks)})
        if states is not None:
            from evsel.models.unreal.selection import METHOD

            states.store.put_states(self.scorer.backbone.fingerprint, METHOD, block_state_key(self.layer, self.pool),
                                    {c.content_hash: pooled[i] for i, c in enumerate(chunks)})
        return len(chunks)
