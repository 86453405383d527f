"""QRRanker's per-chunk block KV on disk, so that a document's first rerank reads what ingest
computed instead of encoding 50 candidates (models/qrranker.py, block encoding with "same" labels:
a block's KV depends on the prefix and its own text only, never on the question).

What is kept per chunk is exactly what the scorer's in-memory cache (blocksparse's BlockStateCache)
holds for it, so scores read from a file are bit-identical to scores read from memory: the K and V
of every layer the query pass runs (0 .. deepest read layer; the suffix's hidden states at a read
layer depend on every head of every layer below it), in the model's own dtype, and with a trained
adapter the k_proj inputs of the adapted layers (the adapter rotates its key deltas from them).

Files: <store dir>/qrranker/<backbone fingerprint>/<config digest>/<chunk content hash>.npy, one
flat array a chunk (ArrayCache: 0600 files in 0700 folders, written to a temp sibling, fsynced and
renamed; a damaged file is deleted and computed again). The digest covers everything a block's KV
depends on besides its text and the weights (the model's dtype, the depth, the prefix, the block's
cut and label, the captured layers), so another encoding or head set never reads these files. The
selectors package deletes a chunk's files once no chunk of the store holds its text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from evsel.models.caches import ArrayCache, config_digest, delete_chunk_files, method_root

FORMAT = "evsel-qrranker-kv/1"
FOLDER = "qrranker"


def kv_root(store_dir: str | Path) -> Path:
    return method_root(store_dir, FOLDER)


def kv_digest(model_dtype: str, depth: int, prefix: list[int], separator: list[int], max_chunk_tokens: int,
              labels: str, capture) -> str:
    data = {"format": FORMAT, "model_dtype": model_dtype, "depth": depth, "prefix": list(prefix),
            "separator": list(separator), "max_chunk_tokens": max_chunk_tokens, "labels": labels,
            "capture": list(capture)}
    return config_digest(data)


def delete_kv_files(store_dir: str | Path, hashes) -> int:
    """Delete the KV files of these content hashes under every backbone and config of a store."""
    return delete_chunk_files(store_dir, FOLDER, hashes)


# numpy has no bfloat16: its bits are stored as int16 (and read back as they were)
_STORED = {"bfloat16": ("int16", np.int16), "float16": (None, np.float16), "float32": (None, np.float32)}


class BlockKVFiles:
    """The block KV of chunks by content hash, in one folder (see the module's docstring)."""

    def __init__(self, folder: str | Path, top: str | Path, depth: int, kv_heads: int, head_dim: int, hidden: int,
                 capture, dtype, device):
        import torch

        self.folder = Path(folder)
        self.files = ArrayCache(self.folder, top=top)
        self.depth, self.kv_heads, self.head_dim, self.hidden = depth, kv_heads, head_dim, hidden
        self.capture = tuple(capture)
        self.dtype = dtype  # the model's torch dtype
        name = str(dtype).replace("torch.", "")
        if name not in _STORED:
            raise ValueError(f"no storage for {name} block KV")
        bits, self.np_dtype = _STORED[name]
        self.bits = getattr(torch, bits) if bits else None
        self.device = device
        self.reads = self.writes = 0

    @property
    def per_token(self) -> int:
        """Stored elements per block token: K and V of every layer, and the captured k_proj inputs."""
        return 2 * self.depth * self.kv_heads * self.head_dim + len(self.capture) * self.hidden

    @property
    def bytes_per_token(self) -> int:
        return self.per_token * np.dtype(self.np_dtype).itemsize

    def has(self, name: str) -> bool:
        return self.files.path(name).is_file()

    def load(self, name: str, length: int):
        """(per layer (K, V) each (kv, L, d), {layer: (L, hidden)}) of a block of `length` tokens,
        or None when there is no whole file of that shape."""
        import torch

        array = self.files.get(name, (length * self.per_token,), self.np_dtype)
        if array is None:
            return None
        flat = torch.from_numpy(array)
        if self.bits is not None:
            flat = flat.view(self.dtype)
        flat = flat.to(self.device)
        part = self.kv_heads * length * self.head_dim
        kv, at = [], 0
        for _ in range(self.depth):
            k = flat[at:at + part].view(self.kv_heads, length, self.head_dim)
            v = flat[at + part:at + 2 * part].view(self.kv_heads, length, self.head_dim)
            kv.append((k, v))
            at += 2 * part
        inputs = {}
        for layer in self.capture:
            inputs[layer] = flat[at:at + length * self.hidden].view(length, self.hidden)
            at += length * self.hidden
        self.reads += 1
        return kv, inputs

    def store(self, items: dict) -> None:
        """Write {content hash: (kv, inputs)} (as `load` returns them), each file atomically."""
        import torch

        arrays = {}
        for name, (kv, inputs) in items.items():
            parts = [t.reshape(-1) for pair in kv[: self.depth] for t in pair]
            parts += [inputs[layer].reshape(-1) for layer in self.capture]
            flat = torch.cat(parts).to("cpu", self.dtype)
            arrays[name] = (flat.view(self.bits) if self.bits is not None else flat).numpy()
        if arrays:
            self.files.put_many(arrays)
            self.writes += len(arrays)
