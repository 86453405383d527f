"""Which bit layouts of QRRanker's stored KV (models/qrranker_kv.py) keep scores within 1e-2 of a
fresh encode, with the same top 10: the Sherlock Holmes book, BM25's top 50 of two questions, the
shipped heads and adapter. Each layout (read keys, other keys, values) is applied in memory as the
files apply it (keys per head and channel, values per token and layer; of the deepest read layer
only its read keys; the adapter's inputs exact) and the candidates are scored from those blocks.
Prints max |stored - fresh| and whether the top 10 (and its set) is the fresh one.

    EVSEL_THREADS=1 python bench/qrranker_kv_bits.py

The table in docs/QRRANKER.md ("Block KV at ingest") is its output.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qrranker import BOOK  # noqa: E402

QUESTIONS = ["What was the speckled band?", "Who is Irene Adler?"]
LAYOUTS = [(8, 8, 8), (8, 4, 4), (8, 3, 3), (6, 3, 3), (4, 4, 4), (8, 4, 2), (8, 2, 4), (8, 3, 2)]


def round_trip(x, axis: int, bits: int):
    """`x` quantized along `axis` with `bits` bits and back, as the files do it."""
    import torch
    from evsel.models import qrranker_kv

    codes, low, step = qrranker_kv.quantize(x.float().numpy(), axis, bits)
    return torch.from_numpy(qrranker_kv.dequantize(codes, low, step)).to(x.dtype)


def quantized(kv, read: dict, layout: tuple[int, int, int]) -> list[tuple]:
    """A block's (K, V) per layer as a file with this layout would give it back."""
    import torch

    read_bits, key_bits, value_bits = layout
    deepest = max(read)
    out = []
    for layer, (keys, values) in enumerate(kv):
        if layer > deepest:
            out.append((keys, values))
            continue
        got = torch.zeros_like(keys)
        for head in range(keys.shape[0]):
            if head in read.get(layer, ()):
                got[head] = round_trip(keys[head], 0, read_bits)
            elif layer < deepest:
                got[head] = round_trip(keys[head], 0, key_bits)
        if layer == deepest:
            out.append((got, torch.zeros_like(values)))
            continue
        heads, length, dim = values.shape
        flat = round_trip(values.transpose(0, 1).reshape(length, heads * dim), 1, value_bits)
        out.append((got, flat.reshape(length, heads, dim).transpose(0, 1)))
    return out


class LayoutBacking:
    """Stands where the scorer's files stand: each block from a fresh encode, through `quantized`."""

    def __init__(self, states: dict, read: dict, layout: tuple[int, int, int]):
        self.states, self.read, self.layout = states, read, layout
        self.reads = 0

    def load(self, name: str, length: int):
        kv, inputs = self.states[name]
        self.reads += 1
        return quantized(kv, self.read, self.layout), inputs

    def store(self, items: dict) -> None:
        pass


def main() -> int:
    os.environ["EVSEL_HOME"] = tempfile.mkdtemp(prefix="evsel-bench-kvbits-")
    from evsel.chunker import content_hash
    from evsel.engine import Engine
    from evsel.models import qrranker as qr
    from evsel.models.selectors import get_selector
    from evsel.settings import Settings

    engine = Engine(Settings.resolve().with_(qrranker_kv=False, encode=False, no_daemon=True))
    engine.ingest([str(BOOK)])
    selector = get_selector("qrranker", engine.selector_context())
    bm25 = get_selector("bm25", engine.selector_context())
    chunks = engine.store.chunks()
    group = engine.backbone.model.config.num_attention_heads // engine.backbone.model.config.num_key_value_heads
    read: dict = {}
    for layer, head in selector.heads:
        read.setdefault(layer, set()).add(head // group)
    for question in QUESTIONS:
        texts = [s.chunk.text for s in bm25.rank(question, chunks, 50)]
        fresh_scorer = qr.QRScorer(engine.backbone, selector.heads, selector.config, adapter=selector.adapter)
        fresh = fresh_scorer.scores(question, texts)
        states, _ = fresh_scorer.block_states(texts)
        by_hash = {content_hash(t): (states.blocks[i], states.block_inputs[i] if states.block_inputs else {})
                   for i, t in enumerate(texts)}
        want = list(np.argsort(-fresh, kind="stable")[:10])
        for layout in LAYOUTS:
            scorer = qr.QRScorer(engine.backbone, selector.heads, selector.config, adapter=selector.adapter)
            scorer.kv_files = LayoutBacking(by_hash, read, layout)
            scorer.model_key += f":layout-{layout}"
            got = scorer.scores(question, texts)
            top = list(np.argsort(-got, kind="stable")[:10])
            print(f"{question} {layout}: max diff {np.abs(got - fresh).max():.4f}, same top 10 {top == want}, "
                  f"same set {set(top) == set(want)}, blocks read {scorer.kv_files.reads}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
