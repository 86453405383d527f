"""The memory prefix of QRRanker (seed 003): short summaries written by the same LLM, one per
block of 20 consecutive chunks of a document, or one per session of a dialogue, cached in the
store by their chunks' content and the writer's fingerprint. `ingest --summaries` writes them
ahead (in the daemon, in the background); `--memory` prepends the summaries covering a question's
candidates (at most 512 tokens) to the reranking prompt, writing any that are missing first.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from evsel.store.store import ChunkRecord, Store

BLOCK_CHUNKS = 20  # consecutive chunks per prose block (the seed's memory granularity)
MEMORY_TOKENS = 512  # the memory prefix's budget in the reranking prompt
MAX_WORDS = 100


@dataclass(frozen=True)
class SummaryConfig:
    block_chunks: int = BLOCK_CHUNKS
    max_input_tokens: int = 2048  # of the block's text the writer reads (a 20-chunk block is ~2.8K)
    max_new_tokens: int = 150  # ~100 words; the text is cut to MAX_WORDS at a sentence end
    prose_prompt: str = ("Summarize the following passage in 50 to 100 words. Name the people, places "
                         "and events it mentions.")
    dialogue_prompt: str = ("Summarize the following conversation in 50 to 100 words. Say who talked "
                            "about what, and name the people, places and events mentioned.")

    def digest(self) -> str:
        return hashlib.blake2b(json.dumps(asdict(self), sort_keys=True).encode(), digest_size=8).hexdigest()


@dataclass
class Block:
    """A run of one document's chunks that one summary covers."""

    doc_id: int
    kind: str  # "block" (prose) or "session" (a dialogue's session)
    label: str  # "chunks 1-20" or the session's name and date
    chunks: list[ChunkRecord] = field(default_factory=list)

    def key(self, fingerprint: str, config: SummaryConfig) -> str:
        digest = hashlib.blake2b(digest_size=16)
        for part in (fingerprint, config.digest(), self.kind, self.label if self.kind == "session" else ""):
            digest.update(part.encode() + b"|")
        for chunk in self.chunks:
            digest.update(chunk.content_hash.encode() + b",")
        return digest.hexdigest()


def blocks_of(chunks: list[ChunkRecord], config: SummaryConfig | None = None) -> list[Block]:
    """The summary blocks of whole documents: their sessions when the chunks carry sessions
    (dialogues), else runs of `block_chunks` consecutive chunks."""
    config = config or SummaryConfig()
    by_doc: dict[int, list[ChunkRecord]] = {}
    for chunk in chunks:
        by_doc.setdefault(chunk.doc_id, []).append(chunk)
    out: list[Block] = []
    for doc_id, doc_chunks in by_doc.items():
        doc_chunks.sort(key=lambda c: c.seq)
        if any(c.session for c in doc_chunks):
            for chunk in doc_chunks:
                name = chunk.session or "no session"
                name = f"session {name}" if name.isdigit() else name
                if not out or out[-1].doc_id != doc_id or out[-1].chunks[-1].session != chunk.session:
                    label = name + (f" ({chunk.time_start})" if chunk.time_start else "")
                    out.append(Block(doc_id, "session", label))
                out[-1].chunks.append(chunk)
        else:
            for at in range(0, len(doc_chunks), config.block_chunks):
                part = doc_chunks[at:at + config.block_chunks]
                out.append(Block(doc_id, "block", f"chunks {part[0].seq + 1}-{part[-1].seq + 1}", part))
    return out


def clean_summary(text: str) -> str:
    """One paragraph of at most MAX_WORDS words, cut at the last sentence end within them."""
    text = re.sub(r"\s+", " ", re.sub(r"^(summary|here is a summary)[^:]*:\s*", "", text.strip(), flags=re.I))
    words = text.split(" ")
    if len(words) <= MAX_WORDS:
        return text
    cut = " ".join(words[:MAX_WORDS])
    end = max(cut.rfind(". "), cut.rfind("! "), cut.rfind("? "), cut.rfind(".") if cut.endswith(".") else -1)
    return cut[: end + 1] if end > len(cut) // 2 else cut + " ..."


class SummaryWriter:
    """Writes and reads block summaries with one backbone, cached in one store's `summaries`."""

    def __init__(self, backbone, store: Store, config: SummaryConfig | None = None):
        self.backbone = backbone
        self.store = store
        self.config = config or SummaryConfig()

    def key(self, block: Block) -> str:
        return block.key(self.backbone.fingerprint, self.config)

    def messages(self, block: Block) -> list[dict]:
        tok = self.backbone.tokenizer
        text = "\n\n".join(c.text for c in block.chunks)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) > self.config.max_input_tokens:
            text = tok.decode(ids[: self.config.max_input_tokens], skip_special_tokens=True) + " ..."
        prompt = self.config.dialogue_prompt if block.kind == "session" else self.config.prose_prompt
        return [{"role": "user", "content": f"{prompt}\n\n{text}"}]

    def missing(self, blocks: list[Block]) -> list[Block]:
        found = self.store.get_summaries([self.key(b) for b in blocks])
        return [b for b in blocks if self.key(b) not in found]

    def ensure(self, blocks: list[Block], on_event: Callable[[dict], None] | None = None,
               label: str = "writing summaries") -> dict[str, str]:
        """{key: summary} for `blocks`, writing the missing ones (each stored when written, so an
        interrupted run keeps what it finished). Progress events per summary."""
        keys = [self.key(b) for b in blocks]
        found = self.store.get_summaries(keys)
        todo = [(k, b) for k, b in zip(keys, blocks) if k not in found]
        todo = list({k: (k, b) for k, b in todo}.values())
        if todo and on_event:
            on_event({"type": "progress", "task": "summaries", "label": label, "done": 0, "total": len(todo)})
        for done, (key, block) in enumerate(todo, 1):
            started = time.perf_counter()
            out = self.backbone.generate(self.messages(block), self.config.max_new_tokens)
            text = clean_summary(out["text"]) or "(no summary)"
            self.store.put_summary(key, self.backbone.fingerprint, block.kind, block.chunks[0].content_hash, text,
                                   time.perf_counter() - started)
            found[key] = text
            if on_event:
                on_event({"type": "progress", "task": "summaries", "label": label, "done": done, "total": len(todo)})
        return found


def memory_for(candidates: list[ChunkRecord], blocks: list[Block], summaries: dict[str, str], keys: list[str],
               count_tokens: Callable[[str], int], budget: int = MEMORY_TOKENS) -> list[dict]:
    """The summaries covering `candidates` that fit in `budget` tokens: blocks holding more
    candidates first (document order breaks ties), then shown in document order. Each item:
    doc_id, kind, label, text."""
    holder = {}
    for index, block in enumerate(blocks):
        for chunk in block.chunks:
            holder[chunk.id] = index
    counts: dict[int, int] = {}
    for chunk in candidates:
        if chunk.id in holder:
            counts[holder[chunk.id]] = counts.get(holder[chunk.id], 0) + 1
    chosen, used = [], 0
    for index in sorted(counts, key=lambda i: (-counts[i], i)):
        block = blocks[index]
        text = summaries.get(keys[index])
        if not text:
            continue
        n = count_tokens(memory_text([_item(block, text)]))
        if used + n > budget:
            continue
        chosen.append(index)
        used += n
    return [_item(blocks[i], summaries[keys[i]]) for i in sorted(chosen)]


def _item(block: Block, text: str) -> dict:
    return {"doc_id": block.doc_id, "title": block.chunks[0].title if block.chunks else "", "kind": block.kind,
            "label": block.label, "text": text}


def memory_text(items: list[dict]) -> str:
    """The memory prefix's text (one line per summary), as the reranking prompt shows it."""
    return "\n".join(f"- {item.get('title') + ', ' if item.get('title') else ''}{item['label']}: {item['text']}"
                     for item in items)
