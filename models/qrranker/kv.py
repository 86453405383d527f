"""QRRanker's per-chunk block KV on disk, so that a document's first rerank reads what ingest
computed instead of encoding 50 candidates (models/qrranker/rerank.py, block encoding with "same" labels:
a block's KV depends on the prefix and its own text only, never on the question).

What is kept per chunk is what the query pass reads of it, quantized (`BITS`):
- the keys of the KV heads the QR heads read, at their layers, in 6 bits (their logits are the scores);
- the other keys and all values of every layer below the deepest read one in 3 bits (the
  suffix's hidden states at a read layer depend on every head of every layer below it); of the
  deepest read layer only its read keys (nothing above it runs, so its values and other heads
  are never read: they load as zeros);
- keys before RoPE (the rotation is undone at the block's positions, the prefix length on, and
  applied again on load): a channel's pre-RoPE values have a steady range, where RoPE swings each
  pair through its angles; a float16 (minimum, step) per head and channel over the block's tokens
  (keys have outlier channels);
- values turned by a fixed orthonormal matrix (a Hadamard with fixed signs, per head vector), which
  spreads their outlier dimensions over all of them, then levels spread evenly over [-max, max]
  with one float16 max per token and layer;
- with a trained adapter, the rank-r projections A x of the adapted layers' k_proj inputs (the
  adapter reads them only through A) in 8 bits, a float16 max per layer and rank channel: a file
  loads the least-norm inputs with the same projections, so the adapter's key deltas are those of
  the true inputs up to that rounding.

Format 3 (these two turns, 6/3/3 bits) keeps scores within 1e-2 of a fresh encode under 4 KiB a token;
format 2 (post-RoPE keys, 8/4/4 bits) took 5.3 KiB, and 3 bits without the turns moved scores by more
(docs/QRRANKER.md, bench/qrranker_kv_bits.py).

Files: <store dir>/qrranker/<backbone fingerprint>/<config digest>/<chunk content hash>.npy, one
uint8 array a chunk (ArrayCache: 0600 files in 0700 folders, written to a temp sibling, fsynced and
renamed). Each starts with a header naming the format, the config digest, the chunk hash, the
block's length and the blake2b digest of the payload; a file whose header or digest does not
match (torn, zeroed, random bytes, another chunk's) is deleted with a warning and encoded again.
The config digest covers everything a block's KV depends on besides its text and the weights (the
model's dtype, the depth, the prefix, the block's cut and label, the read heads, the adapter's
projections, the bits), so another encoding or head set never reads these files. The selectors
package deletes a chunk's files once no chunk of the store holds its text; past `max_bytes` in
all, the least recently read files go first.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import struct
import threading
from pathlib import Path

import numpy as np
from evsel.models.shared.caches import ArrayCache, config_digest, delete_chunk_files, method_root

FORMAT = "evsel-qrranker-kv/3"  # 2: post-RoPE keys, 8/4/4 bits (its files are never read: another digest)
FOLDER = "qrranker"
MAGIC = b"EVKV"
# bits per stored value: the keys the QR heads read, the other keys, the values (docs/QRRANKER.md:
# within 1e-2 of fresh scores with the same top 10 on the Sherlock Holmes book)
BITS = (6, 3, 3)


# a full disk: the KV root -> the bytes free when a write failed; until more is free than that
# (plus FREED), no background work writes there again (a process's note: `daemon status` shows it)
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FREED = 64 << 20
_full: dict[str, int] = {}
_full_lock = threading.Lock()


def _free_bytes(root: Path) -> int:
    at = Path(root)
    while not at.exists() and at != at.parent:
        at = at.parent
    return shutil.disk_usage(at).free


def note_disk_full(root: str | Path) -> str:
    """Record that writing under `root` ran out of space; returns the line that says so."""
    with _full_lock:
        _full[str(root)] = _free_bytes(Path(root))
    return disk_full_line(root)


def disk_full_line(root: str | Path) -> str:
    return (f"QRRanker block KV not written: the disk of {root} is full; background work waits until space "
            "is freed (or turn the files off with EVSEL_QRRANKER_KV=0, or cap them with EVSEL_QRRANKER_KV_MAX_MB)")


def disk_still_full(root: str | Path) -> bool:
    """Is `root` noted full with no space freed since? (Freed: the note is dropped.)"""
    with _full_lock:
        if str(root) not in _full:
            return False
        try:
            if _free_bytes(Path(root)) < _full[str(root)] + FREED:
                return True
        except OSError:
            return True
        del _full[str(root)]
        return False


def disk_full_notes() -> list[str]:
    """A line for each KV root still full (for `evsel daemon status`)."""
    with _full_lock:
        roots = list(_full)
    return [disk_full_line(root) for root in roots if disk_still_full(root)]


def disk_is_full(exc: OSError) -> bool:
    return exc.errno in FULL_ERRNOS


def kv_root(store_dir: str | Path) -> Path:
    return method_root(store_dir, FOLDER)


def kv_digest(model_dtype: str, depth: int, prefix: list[int], separator: list[int], max_chunk_tokens: int,
              labels: str, capture, read_heads=(), projections: str = "", bits=None) -> str:
    data = {"format": FORMAT, "model_dtype": model_dtype, "depth": depth, "prefix": list(prefix),
            "separator": list(separator), "max_chunk_tokens": max_chunk_tokens, "labels": labels,
            "capture": list(capture), "read_heads": [list(h) for h in read_heads], "projections": projections,
            "bits": list(bits if bits is not None else BITS)}
    return config_digest(data)


def delete_kv_files(store_dir: str | Path, hashes) -> int:
    """Delete the KV files of these content hashes under every backbone and config of a store."""
    return delete_chunk_files(store_dir, FOLDER, hashes)


def projection_digest(matrices: dict) -> str:
    """What the stored projections depend on: the adapter's A of each captured layer's k_proj."""
    digest = hashlib.blake2b(digest_size=8)
    for layer in sorted(matrices):
        digest.update(np.ascontiguousarray(matrices[layer].detach().float().cpu().numpy()).tobytes())
    return digest.hexdigest()


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes < 2**bits -> their low `bits` bits as one bit stream, first code in the high bits
    (8 codes make `bits` bytes: arithmetic on whole groups, no per-bit arrays)."""
    codes = codes.astype(np.uint8).reshape(-1)
    if bits == 8:
        return codes
    n = codes.size
    groups = np.zeros(-(-n // 8) * 8, np.uint64)
    groups[:n] = codes
    groups = groups.reshape(-1, 8)
    word = np.zeros(groups.shape[0], np.uint64)
    for j in range(8):
        word |= groups[:, j] << np.uint64(bits * (7 - j))
    out = word.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - bits:].reshape(-1)
    return out[: -(-n * bits // 8)]


def unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    if bits == 8:
        return packed[:count]
    groups = -(-count // 8)
    raw = np.zeros(groups * bits, np.uint8)
    raw[: packed.size] = packed[: groups * bits]
    size = 4 if bits <= 4 else 8  # 8 codes in one 32- or 64-bit word
    wide = np.zeros((groups, size), np.uint8)
    wide[:, size - bits:] = raw.reshape(groups, bits)
    kind = np.uint32 if size == 4 else np.uint64
    word = wide.reshape(-1).view(f">u{size}").astype(kind)
    mask = kind((1 << bits) - 1)
    out = np.empty((groups, 8), np.uint8)
    for j in range(8):
        out[:, j] = (word >> kind(bits * (7 - j))) & mask
    return out.reshape(-1)[:count]


def value_rotation(head_dim: int) -> np.ndarray:
    """The fixed orthonormal (head_dim, head_dim) turn of stored values: a Sylvester Hadamard
    matrix with fixed row signs (the identity where head_dim is not a power of two)."""
    if head_dim & (head_dim - 1):
        return np.eye(head_dim, dtype=np.float32)
    h = np.ones((1, 1))
    while h.shape[0] < head_dim:
        h = np.block([[h, h], [h, -h]])
    signs = np.unpackbits(np.frombuffer(hashlib.blake2b(b"evsel-qrranker-kv/3 value signs").digest(), np.uint8))
    return (h * np.where(signs[:head_dim], -1.0, 1.0)[:, None] / np.sqrt(head_dim)).astype(np.float32)


def quantize(x: np.ndarray, axis: int, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, float16 minimum and step of `x` (float32), one (minimum, step) along `axis`."""
    low = x.min(axis=axis, keepdims=True).astype(np.float16)
    high = x.max(axis=axis, keepdims=True)
    step = ((high - low.astype(np.float32)) / (2 ** bits - 1)).astype(np.float16)
    safe = np.where(step.astype(np.float32) > 0, step.astype(np.float32), 1.0)
    codes = np.clip(np.rint((x - low.astype(np.float32)) / safe), 0, 2 ** bits - 1).astype(np.uint8)
    return codes, low, step


def dequantize(codes: np.ndarray, low: np.ndarray, step: np.ndarray) -> np.ndarray:
    return codes.astype(np.float32) * step.astype(np.float32) + low.astype(np.float32)


def quantize_symmetric(x: np.ndarray, axis: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes and the float16 largest magnitude of `x` (float32) along `axis`: 2**bits levels
    spread evenly over [-max, max] (turned values and projections centre on zero: no minimum kept)."""
    top = np.abs(x).max(axis=axis, keepdims=True).astype(np.float16)
    half = (2 ** bits - 1) / 2
    step = top.astype(np.float32) / half
    safe = np.where(step > 0, step, 1.0)
    codes = np.clip(np.rint(x / safe + half), 0, 2 ** bits - 1).astype(np.uint8)
    return codes, top


def dequantize_symmetric(codes: np.ndarray, top: np.ndarray, bits: int) -> np.ndarray:
    half = (2 ** bits - 1) / 2
    return (codes.astype(np.float32) - half) * (top.astype(np.float32) / half)


def _turn_pairs(x, cos, sin):
    """RoPE as Llama applies it (x cos + rotate_half(x) sin), written into one new tensor."""
    import torch

    half = x.shape[-1] // 2
    out = torch.mul(x, cos)
    out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-1.0)
    out[..., half:].addcmul_(x[..., :half], sin[..., half:])
    return out


def torch_turn(head_dim: int):
    import torch

    return torch.from_numpy(value_rotation(head_dim))


class DamagedKV(ValueError):
    """A stored file that is not what its name and folder promise."""


class BlockKVFiles:
    """The block KV of chunks by content hash, in one folder (see the module's docstring)."""

    def __init__(self, folder: str | Path, top: str | Path, depth: int, kv_heads: int, head_dim: int, hidden: int,
                 capture, dtype, device, read_heads: dict | None = None, projections: dict | None = None,
                 bits: tuple[int, int, int] | None = None, max_bytes: int | None = None, on_warning=None, rope=None):
        """`read_heads`: {layer: the KV heads its QR heads read} (None: every head of every layer
        read); `projections`: {captured layer: the adapter's A of its k_proj (rank, hidden)};
        `bits`: (read keys, other keys, values; None: `BITS`); `max_bytes`: the cap of all files under `top`
        (None: none); `on_warning(message)`: told of a damaged file; `rope(n)`: the float32 (cos,
        sin), each (n, head_dim), of a block's first n positions (keys are stored before RoPE;
        None: as they are)."""
        self.folder = Path(folder)
        self.top = Path(top)
        self.config = self.folder.name
        self.files = ArrayCache(self.folder, top=top)
        self.depth, self.kv_heads, self.head_dim, self.hidden = depth, kv_heads, head_dim, hidden
        self.capture = tuple(capture)
        self.dtype = dtype  # the model's torch dtype
        self.device = device
        self.bits = tuple(bits if bits is not None else BITS)
        every = list(range(kv_heads))
        self.read = {layer: sorted(set(heads)) for layer, heads in read_heads.items()} if read_heads is not None \
            else {layer: every for layer in range(depth)}
        self.projections = {layer: projections[layer].detach().float().cpu() for layer in self.capture} \
            if self.capture else {}
        # the least-norm inputs with given projections y: y (A A^T)^-1 A
        self.lift = {layer: np.linalg.solve((a @ a.T).numpy(), a.numpy()).astype(np.float32)
                     for layer, a in self.projections.items()}
        self.max_bytes = max_bytes
        self.rope = rope
        self._rope_tables = None  # (cos, sin) of the longest block seen, on the CPU
        self.turn = torch_turn(head_dim)
        self.on_warning = on_warning or (lambda _message: None)
        self.reads = self.writes = self.rejected = self.evicted = 0
        # layout: (layer, head) of the read keys, of the other keys stored, the layers whose V is stored
        self.read_keys = [(layer, h) for layer in range(depth) for h in self.read.get(layer, [])]
        self.other_keys = [(layer, h) for layer in range(depth - 1) for h in every if h not in self.read.get(layer, [])]
        self.value_layers = list(range(depth - 1))  # nothing above the deepest layer runs: its V is never read

    @property
    def rank(self) -> int:
        return int(next(iter(self.projections.values())).shape[0]) if self.projections else 0

    def _sizes(self, length: int) -> list[tuple[str, int]]:
        """(section, bytes) of a block of `length` tokens, in file order."""
        d = self.head_dim
        read_bits, key_bits, value_bits = self.bits
        sizes = []
        for section, heads, bits in (("read_keys", self.read_keys, read_bits), ("other_keys", self.other_keys, key_bits)):
            sizes += [(section, -(-len(heads) * length * d * bits // 8)), (section + "_scale", len(heads) * d * 4)]
        values = len(self.value_layers)
        return sizes + [("values", -(-values * self.kv_heads * length * d * value_bits // 8)),
                        ("values_scale", values * length * 2),
                        ("projections", len(self.capture) * length * self.rank),
                        ("projections_scale", len(self.capture) * self.rank * 2)]

    def payload_bytes(self, length: int) -> int:
        return sum(n for _, n in self._sizes(length))

    def bytes_per_token(self, length: int = 140) -> float:
        """Stored bytes per block token for a block of `length` tokens (the header aside)."""
        return self.payload_bytes(length) / length

    def has(self, name: str) -> bool:
        return self.files.path(name).is_file()

    def _tables(self, length: int):
        if self._rope_tables is None or self._rope_tables[0].shape[0] < length:
            cos, sin = self.rope(max(length, 512))
            self._rope_tables = (cos.float().cpu(), sin.float().cpu())
        return self._rope_tables[0][:length], self._rope_tables[1][:length]

    def unrope(self, keys):
        """Post-RoPE keys (..., L, d) float32 of a block -> before RoPE (as stored)."""
        if self.rope is None:
            return keys
        cos, sin = self._tables(keys.shape[-2])
        return _turn_pairs(keys, cos, -sin)

    def rerope(self, keys):
        """`unrope` undone: stored keys (..., L, d) float32 at the block's positions."""
        if self.rope is None:
            return keys
        cos, sin = self._tables(keys.shape[-2])
        return _turn_pairs(keys, cos, sin)

    # encoding
    def encode(self, name: str, kv, inputs: dict) -> np.ndarray:
        """One file's bytes: header then payload (see the module's docstring)."""
        import torch

        length = int(kv[0][0].shape[-2])
        read_bits, key_bits, value_bits = self.bits
        parts = []
        for heads, bits in ((self.read_keys, read_bits), (self.other_keys, key_bits)):
            if not heads:
                parts += [np.zeros(0, np.uint8)] * 2
                continue
            keys = self.unrope(torch.stack([kv[layer][0][h] for layer, h in heads]).float().cpu())  # (n, L, d)
            codes, low, step = quantize(keys.numpy(), 1, bits)  # per channel
            parts += [pack(codes, bits), np.concatenate([low, step], axis=1).view(np.uint8).reshape(-1)]
        if self.value_layers:  # each head vector turned, then per token and layer: (layers, L, heads x d)
            values = torch.stack([kv[layer][1] for layer in self.value_layers]).float().cpu() @ self.turn
            values = values.transpose(1, 2).reshape(len(self.value_layers), length, -1)
            codes, scale = quantize_symmetric(values.numpy(), 2, value_bits)
            parts += [pack(codes, value_bits), scale.view(np.uint8).reshape(-1)]
        else:
            parts += [np.zeros(0, np.uint8)] * 2
        if self.capture:  # (layers, L, rank) in 8 bits, a scale per layer and rank channel
            y = np.stack([inputs[layer].float().cpu().numpy() @ self.projections[layer].numpy().T
                          for layer in self.capture])
            codes, scale = quantize_symmetric(y, 1, 8)
            parts += [codes.reshape(-1), scale.view(np.uint8).reshape(-1)]
        else:
            parts += [np.zeros(0, np.uint8)] * 2
        payload = np.concatenate(parts)
        if payload.size != self.payload_bytes(length):
            raise ValueError("block KV layout mismatch")
        header = json.dumps({"format": FORMAT, "config": self.config, "name": name, "length": length,
                             "bytes": int(payload.size),
                             "blake2b": hashlib.blake2b(payload.tobytes(), digest_size=16).hexdigest()}).encode()
        lead = np.frombuffer(MAGIC + struct.pack("<I", len(header)) + header, np.uint8)
        return np.concatenate([lead, payload])

    def decode(self, name: str, data: np.ndarray, length: int):
        """(per layer (K, V) each (kv, L, d), {layer: (L, hidden)}) from one file's bytes; raises
        DamagedKV where it is not this block's whole, intact file."""
        import torch

        raw = data.tobytes()
        if raw[:4] != MAGIC or len(raw) < 8:
            raise DamagedKV("no block KV header")
        size = struct.unpack("<I", raw[4:8])[0]
        try:
            header = json.loads(raw[8:8 + size].decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise DamagedKV("unreadable header") from exc
        payload = raw[8 + size:]
        expected = {"format": FORMAT, "config": self.config, "name": name, "length": length,
                    "bytes": self.payload_bytes(length)}
        if not isinstance(header, dict) or any(header.get(key) != value for key, value in expected.items()):
            raise DamagedKV("header does not match this block")
        if len(payload) != expected["bytes"] or \
                hashlib.blake2b(payload, digest_size=16).hexdigest() != header.get("blake2b"):
            raise DamagedKV("digest mismatch")
        buffer = np.frombuffer(payload, np.uint8)
        sections, at = {}, 0
        for section, n in self._sizes(length):
            sections[section] = buffer[at:at + n]
            at += n
        d = self.head_dim
        read_bits, key_bits, value_bits = self.bits
        keys = torch.zeros(self.depth, self.kv_heads, length, d, dtype=self.dtype)
        for section, heads, bits in (("read_keys", self.read_keys, read_bits), ("other_keys", self.other_keys, key_bits)):
            if not heads:
                continue
            codes = unpack(sections[section], bits, len(heads) * length * d).reshape(len(heads), length, d)
            scale = sections[section + "_scale"].view(np.float16).reshape(len(heads), 2, d)
            got = self.rerope(torch.from_numpy(dequantize(codes, scale[:, :1], scale[:, 1:]))).to(self.dtype)
            index = torch.tensor([layer * self.kv_heads + h for layer, h in heads])
            keys.view(-1, length, d)[index] = got
        values = torch.zeros(self.depth, self.kv_heads, length, d, dtype=self.dtype)
        if self.value_layers:
            n = len(self.value_layers)
            codes = unpack(sections["values"], value_bits, n * length * self.kv_heads * d)
            scale = sections["values_scale"].view(np.float16).reshape(n, length, 1)
            got = torch.from_numpy(dequantize_symmetric(codes.reshape(n, length, -1), scale, value_bits))
            got = (got.view(-1, d) @ self.turn.T).view(n, length, self.kv_heads, d).transpose(1, 2)
            if self.value_layers == list(range(n)):  # layers 0..n-1: a slice, not an index
                values[:n] = got
            else:
                values[self.value_layers] = got.to(self.dtype)
        keys, values = keys.to(self.device), values.to(self.device)
        kv = [(keys[layer], values[layer]) for layer in range(self.depth)]
        inputs = {}
        if self.capture:
            scale = sections["projections_scale"].view(np.float16).reshape(len(self.capture), 1, self.rank)
            y = dequantize_symmetric(sections["projections"].reshape(len(self.capture), length, self.rank), scale, 8)
            for j, layer in enumerate(self.capture):
                inputs[layer] = torch.from_numpy(y[j] @ self.lift[layer]).to(self.device, self.dtype)
        return kv, inputs

    # reading and writing
    def load(self, name: str, length: int):
        """The block's states (as `decode`), or None when there is no intact file for it (a damaged
        one is deleted, with a warning, and the caller encodes the block again)."""
        before = self.files.rejected
        data = self.files.get(name, None, np.uint8)
        if data is None:
            if self.files.rejected > before:  # ArrayCache deleted it already
                self._damaged(name, "unreadable file")
            return None
        try:
            got = self.decode(name, data.reshape(-1), length)
        except DamagedKV as exc:
            self.files.delete([name])
            self._damaged(name, str(exc))
            return None
        try:
            os.utime(self.files.path(name))  # the cap evicts the least recently read first
        except OSError:
            pass
        self.reads += 1
        return got

    def _damaged(self, name: str, why: str) -> None:
        self.rejected += 1
        self.on_warning(f"QRRanker block KV file {name[:16]}... was damaged ({why}); deleted, it is encoded again")

    def store(self, items: dict) -> None:
        """Write {content hash: (kv, inputs)} (as `load` returns them), each file atomically, then
        keep the files under the cap."""
        arrays = {name: self.encode(name, kv, inputs) for name, (kv, inputs) in items.items()}
        if arrays:
            self.files.put_many(arrays)
            self.writes += len(arrays)
            self.enforce_cap(keep=set(arrays))

    def enforce_cap(self, keep: set = frozenset()) -> int:
        """Delete the least recently read files under `top` (every backbone and config) until they
        fit `max_bytes`; `keep`: names not to delete (just written). Returns the files deleted."""
        if self.max_bytes is None or not self.top.is_dir():
            return 0
        found = []
        for path in self.top.glob("*/*/*.npy"):
            try:
                stat = path.stat()
            except OSError:
                continue
            found.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in found)
        gone = 0
        for _, size, path in sorted(found):
            if total <= self.max_bytes:
                break
            if path.stem in keep:
                continue
            try:
                path.unlink()
            except OSError:
                continue
            total -= size
            gone += 1
        self.evicted += gone
        return gone
