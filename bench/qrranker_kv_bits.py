"""Which bit layouts of QRRanker's stored KV (models/qrranker/kv.py) keep scores within 1e-2 of a
fresh encode, with the same top 10: the Sherlock Holmes book, BM25's top 50 of three questions, the
shipped heads and adapter. Each block goes through the files' own codec (`BlockKVFiles.encode`
then `decode`: keys before RoPE per head and channel, values turned per token and layer, the
adapter's projections in 8 bits) with each layout's bits, and the candidates are scored from those
blocks. Prints max |stored - fresh|, whether the top 10 (and its set) is the fresh one, and the
layout's payload per block token at 140 tokens and at these candidates' mean block length.

    EVSEL_THREADS=1 python bench/qrranker_kv_bits.py

The table in docs/QRRANKER.md ("Block KV at ingest") is its output. (Format 2's codec, post-RoPE
keys and values with a (minimum, step) per token and layer, is gone with that format; its rows
there are from this script at commit f274105.)
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qrranker import BOOK  # noqa: E402

QUESTIONS = ["What was the speckled band?", "Who is Irene Adler?", "What was the Red-Headed League really for?"]
LAYOUTS = [(8, 4, 4), (8, 3, 3), (6, 3, 3), (5, 3, 3), (6, 3, 2), (4, 3, 3)]


class LayoutBacking:
    """Stands where the scorer's files stand: each block from a fresh encode, through the files'
    codec with one layout's bits."""

    def __init__(self, files, states: dict, layout: tuple[int, int, int]):
        self.files, self.states = files, states
        self.files.bits = layout
        self.reads = 0

    def load(self, name: str, length: int):
        kv, inputs = self.states[name]
        self.reads += 1
        return self.files.decode(name, self.files.encode(name, kv, inputs), length)

    def store(self, items: dict) -> None:
        pass


def main() -> int:
    os.environ["EVSEL_HOME"] = tempfile.mkdtemp(prefix="evsel-bench-kvbits-")
    from evsel.ingest.chunker import content_hash
    from evsel.engine import Engine
    from evsel.models.qrranker import rerank as qr
    from evsel.models.selectors import get_selector
    from evsel.settings import Settings

    engine = Engine(Settings.resolve().with_(qrranker_kv=False, encode=False, no_daemon=True))
    engine.ingest([str(BOOK)])
    selector = get_selector("qrranker", engine.selector_context())
    bm25 = get_selector("bm25", engine.selector_context())
    chunks = engine.store.chunks()
    for question in QUESTIONS:
        texts = [s.chunk.text for s in bm25.rank(question, chunks, 50)]
        fresh_scorer = qr.QRScorer(engine.backbone, selector.heads, selector.config, adapter=selector.adapter)
        fresh = fresh_scorer.scores(question, texts)
        states, _ = fresh_scorer.block_states(texts)
        by_hash = {content_hash(t): (states.blocks[i], states.block_inputs[i] if states.block_inputs else {})
                   for i, t in enumerate(texts)}
        mean_block = float(np.mean(states.lengths()))
        want = list(np.argsort(-fresh, kind="stable")[:10])
        for layout in LAYOUTS:
            scorer = qr.QRScorer(engine.backbone, selector.heads, selector.config, adapter=selector.adapter)
            scorer.use_kv_files(tempfile.mkdtemp(prefix="evsel-bench-kvbits-files-"))
            files = scorer.kv_files
            scorer.kv_files = LayoutBacking(files, by_hash, layout)
            scorer.model_key += f":layout-{layout}"
            got = scorer.scores(question, texts)
            top = list(np.argsort(-got, kind="stable")[:10])
            print(f"{question} {layout}: max diff {np.abs(got - fresh).max():.4f}, same top 10 {top == want}, "
                  f"same set {set(top) == set(want)}, bytes per block token {files.bytes_per_token(140):.0f} at 140, "
                  f"{files.bytes_per_token(round(mean_block)):.0f} at {mean_block:.0f} (blocks read "
                  f"{scorer.kv_files.reads})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
