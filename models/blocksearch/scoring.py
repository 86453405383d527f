"""BlockSearch's routing scores as pure tensor functions over a scope's packed keys at the routing
layer (models/blocksearch/routing.py holds the router that encodes, caches and packs them): per-head
QK-MaxSim, the softmax attention mass onto each chunk, and SSMax's factor. Keys are scored in
slices of whole chunks, so memory stays bounded by `SLICE_TOKENS` whatever the scope."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from evsel.errors import ModelError

SLICE_TOKENS = 1 << 13  # keys scored at a time (whole chunks): one reused float32 copy and (H, slice) logits


@dataclass
class PackedKeys:
    """The scope's keys at the routing layer, concatenated: keys (kv, T, d) in their storage type,
    owner (T,) the chunk of each token, counted (T,) True for text tokens (the separator every
    block starts with is the same in all of them and enters softmax denominators only), offsets
    (N + 1,) where each chunk's tokens start: every chunk is one contiguous run."""

    keys: object
    owner: object
    counted: object
    offsets: np.ndarray
    _skipped: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)
    _skipping: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def n(self) -> int:
        return len(self.offsets) - 1

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def skipped(self) -> np.ndarray:
        """Positions of the tokens not counted, sorted (found once: routing masks them per slice)."""
        if self._skipped is None:
            counted = self.counted.numpy() if hasattr(self.counted, "numpy") else self.counted
            self._skipped = np.flatnonzero(~np.asarray(counted, dtype=bool))
        return self._skipped

    def kv_slice(self, kv: slice) -> PackedKeys:
        """The same tokens with only the KV heads `kv` (a view; made once per slice)."""
        key = ("kv", kv.start, kv.stop)
        if key not in self._skipping:
            view = PackedKeys(self.keys[kv], self.owner, self.counted, self.offsets)
            view._skipped = self.skipped
            self._skipping[key] = view
        return self._skipping[key]

    def skipping(self, k: int) -> PackedKeys:
        """The same keys with each chunk's first `k` counted tokens uncounted too (a chunk's last
        token always stays counted, so every chunk keeps a score). Made once per k."""
        import torch

        if k in self._skipping:
            return self._skipping[k]
        counted = torch.as_tensor(self.counted).numpy().astype(bool)
        owner = torch.as_tensor(self.owner).numpy()
        running = np.cumsum(counted)
        before = np.concatenate([[0], running])[self.offsets[:-1]]  # counted tokens before each chunk
        nth = running - before[owner]  # 1-based rank of a counted token inside its chunk
        last = np.zeros(len(counted), dtype=bool)
        last[self.offsets[1:] - 1] = True
        keep = counted & ((nth > k) | last)
        out = PackedKeys(self.keys, self.owner, torch.from_numpy(keep), self.offsets)
        self._skipping[k] = out
        return out

    def subset(self, which: list[int]) -> PackedKeys:
        """The chunks `which` only, in that order (renumbered 0..len(which) - 1)."""
        import torch

        spans = [(int(self.offsets[i]), int(self.offsets[i + 1])) for i in which]
        lengths = [b - a for a, b in spans]
        keys = torch.cat([self.keys[:, a:b] for a, b in spans], dim=1) if spans else self.keys[:, :0]
        counted = torch.cat([self.counted[a:b] for a, b in spans]) if spans else self.counted[:0]
        owner = torch.repeat_interleave(torch.arange(len(which)), torch.tensor(lengths, dtype=torch.long))
        return PackedKeys(keys, owner, counted, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def pack(keys: list, start: int = 0) -> PackedKeys:
    """Pack per-chunk keys [(kv, L_i, d)] (numpy or torch); the first `start` tokens of each
    chunk are the shared separator (not counted)."""
    import torch

    tensors = [torch.as_tensor(k) for k in keys]
    lengths = [int(k.shape[1]) for k in tensors]
    if any(n <= start for n in lengths):
        raise ModelError("a chunk has no text tokens to score")
    owner = torch.repeat_interleave(torch.arange(len(tensors)), torch.tensor(lengths, dtype=torch.long))
    counted = torch.cat([torch.arange(n) >= start for n in lengths]) if tensors else torch.zeros(0, dtype=torch.bool)
    stacked = torch.cat(tensors, dim=1) if tensors else torch.zeros(0, 0, 0)
    return PackedKeys(stacked, owner, counted, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def head_logits(q, keys, scaling: float):
    """q (H, d) against keys (kv, T, d): (H, T) float32 logits q_h . k_t * scaling, query head h
    reading KV head h // (H / kv)."""
    kv, t, d = keys.shape
    h = q.shape[0]
    grouped = q.float().reshape(kv, h // kv, d)  # heads kv*g .. kv*g + g - 1 share KV head kv
    return (grouped @ keys.float().transpose(1, 2)).reshape(h, t) * scaling  # (H, T)


def _spans(offsets: np.ndarray, slice_tokens: int) -> list[tuple[int, int]]:
    """Runs of whole chunks [i, j) of at most `slice_tokens` tokens (a longer chunk alone), so that
    each chunk's max or sum is taken inside one slice."""
    spans, i, n = [], 0, len(offsets) - 1
    while i < n:
        j = int(np.searchsorted(offsets, offsets[i] + slice_tokens, side="right")) - 1
        j = min(max(j, i + 1), n)
        spans.append((i, j))
        i = j
    return spans


def _sliced_logits(q, packed: PackedKeys, scale: float, slice_tokens: int, masked: float | None):
    """Per run of whole chunks: (i, j, its first token a, the (H, t) float32 logits
    scale * q_h . k_t as a numpy view of a reused buffer, the positions of its uncounted tokens
    in it). One (g, d) @ (d, t) product per KV head, its g query heads together (GQA), on a
    float32 copy of the slice small enough to stay in cache. Uncounted tokens' logits are set to
    `masked` unless it is None."""
    import torch

    keys = torch.as_tensor(packed.keys)
    kv, _, d = keys.shape
    h = q.shape[0]
    g = h // kv  # query heads k*g .. k*g + g - 1 read KV head k
    qs = (torch.as_tensor(q).float() * scale).reshape(kv, g, d)
    spans = _spans(packed.offsets, slice_tokens)
    if not spans:
        return
    longest = max(int(packed.offsets[j] - packed.offsets[i]) for i, j in spans)
    convert = keys.dtype != torch.float32
    logits_flat = torch.empty(h * longest)
    copy_flat = torch.empty(kv * longest * d) if convert else None
    skipped = packed.skipped
    for i, j in spans:
        a, b = int(packed.offsets[i]), int(packed.offsets[j])
        t = b - a
        part = keys[:, a:b]
        if convert:
            part = copy_flat[: kv * t * d].view(kv, t, d).copy_(part)
        out = logits_flat[: h * t].view(kv, g, t)
        torch.bmm(qs, part.transpose(1, 2), out=out)
        logits = out.view(h, t).numpy()
        lo, hi = np.searchsorted(skipped, (a, b))
        skip = skipped[lo:hi] - a
        if masked is not None and len(skip):
            logits[:, skip] = masked
        yield i, j, a, logits, skip


def maxsim(q, packed: PackedKeys, scaling: float, factor: float = 1.0, slice_tokens: int = SLICE_TOKENS):
    """(N, H) per-head QK-MaxSim: for each chunk the max over its text tokens of
    factor * q_h . k_t * scaling (factor: SSMax's s log N, else 1). A segment max over each slice's
    chunk runs (the uncounted tokens masked to -inf)."""
    import torch

    out = np.full((q.shape[0], packed.n), -np.inf, dtype=np.float32)
    for i, j, a, logits, _ in _sliced_logits(q, packed, scaling * factor, slice_tokens, -np.inf):
        out[:, i:j] = np.maximum.reduceat(logits, packed.offsets[i:j] - a, axis=1)
    return torch.from_numpy(out).T


def attention_mass(q, packed: PackedKeys, scaling: float, factor: float = 1.0, extra=None,
                   slice_tokens: int = SLICE_TOKENS, extra_mask=None):
    """(N, H) the query's softmax attention onto each chunk's text tokens, the softmax taken over
    `extra` keys (kv, E, d: the prefix and the query's own tokens; `extra_mask` (H, E) those each
    row sees) and every packed token, of the
    logits factor * q . k * scaling. One pass over the keys: per slice its max m and the segment
    sums of exp(logit - m) over each chunk's text tokens, rescaled by exp(m - lse) at the end."""
    import torch

    h = q.shape[0]
    scale = scaling * factor
    parts = []  # the log-sum-exp terms: extra keys, then each slice's
    if extra is not None and extra.shape[1]:
        extra_logits = head_logits(q, extra, scale)
        if extra_mask is not None:  # (H, E): the extra keys each query row sees (its own causally)
            extra_logits = extra_logits.masked_fill(~extra_mask, float("-inf"))
        parts.append(torch.logsumexp(extra_logits, dim=1).double().numpy())
    out = np.zeros((h, packed.n), dtype=np.float32)
    peaks = np.zeros((h, packed.n), dtype=np.float32)
    for i, j, a, logits, skip in _sliced_logits(q, packed, scale, slice_tokens, None):
        peak = logits.max(axis=1, keepdims=True)
        e = torch.from_numpy(logits)
        e.sub_(torch.from_numpy(peak)).exp_()  # in place: logits is the reused buffer
        parts.append(peak[:, 0].astype(np.float64) + np.log(logits.sum(axis=1, dtype=np.float64)))
        if len(skip):
            logits[:, skip] = 0.0  # separators count in the denominator only
        out[:, i:j] = np.add.reduceat(logits, packed.offsets[i:j] - a, axis=1)
        peaks[:, i:j] = peak
    if not parts:
        return torch.from_numpy(out).T
    lse = np.logaddexp.reduce(np.stack(parts), axis=0)  # (H,)
    return torch.from_numpy((out * np.exp(peaks - lse[:, None])).astype(np.float32)).T


def ssmax_factor(s: float, n: int) -> float:
    """SSMax's multiplier s * log N for a scope of N tokens (the keys the softmax runs over)."""
    return float(s) * math.log(max(n, 1))
