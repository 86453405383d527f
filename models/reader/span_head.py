"""The reader: the answer's exact words, found in the shown passages by a small trained head on the
frozen backbone's own states.

Each passage is read once, after the question ("Question: ...\\nPassage: ..."), so every passage
token's state has seen the question; all passages go through the backbone in one batched,
early-stopping pass (`run_layers`, up to the deepest layer the head reads). The head mixes the
states of a few layers, lets each passage's tokens see one another (one small bidirectional layer:
the causal backbone cannot look ahead), and scores a start and an end for every token. Spans of
whole words, at most MAX_SPAN_TOKENS long, compete in one softmax across all passages, so a
name in the passage ranked second beats a number in the first. The best span's probability is the
reader's confidence; the answer step abstains below a threshold chosen on held-out questions.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from evsel.errors import ModelError
from evsel.models.shared.trained_files import read_json, read_tensors, reading

READER_FORMAT = "evsel-reader-1"
HEAD_FILE = "adapter.safetensors"  # the name the shared training loop checkpoints under
CONFIG_FILE = "reader.json"
MAX_SPAN_TOKENS = 30
MAX_PASSAGE_TOKENS = 640  # longer passages are read up to here (a chunk ~140 tokens; a window 3-4 chunks)


@dataclass
class ReaderConfig:
    layers: list[int] = field(default_factory=lambda: [14, 22])  # 1-based decoder layers read
    width: int = 256
    heads: int = 4
    dropout: float = 0.1
    max_span: int = MAX_SPAN_TOKENS


@dataclass
class Encoded:
    """Passages tokenized after the question: ids per row, where each passage starts in its row,
    and each passage token's character offsets in the passage text."""

    rows: list[list[int]]
    starts: list[int]
    offsets: list[list[tuple[int, int]]]
    word_start: list[list[bool]]
    word_end: list[list[bool]]


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch in "£$€%'"


def encode(tokenizer, bos_id: int, question: str, passages: list[str]) -> Encoded:
    prefix = [bos_id] + tokenizer(f"Question: {' '.join(question.split())}\nPassage:",
                                  add_special_tokens=False)["input_ids"]
    rows, starts, offsets, w_start, w_end = [], [], [], [], []
    for text in passages:
        got = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = got["input_ids"][:MAX_PASSAGE_TOKENS]
        spans = []
        for a, b in got["offset_mapping"][: len(ids)]:
            while a < b and text[a].isspace():  # byte-level tokens carry their leading space
                a += 1
            spans.append((a, b))
        starts_ok = [a < b and _is_word(text[a]) and (a == 0 or not text[a - 1].isalnum()) for a, b in spans]
        ends_ok = [a < b and (b == len(text) or not text[b].isalnum()) and text[b - 1] not in " \n\t" for a, b in spans]
        rows.append(prefix + ids)
        starts.append(len(prefix))
        offsets.append(spans)
        w_start.append(starts_ok)
        w_end.append(ends_ok)
    return Encoded(rows, starts, offsets, w_start, w_end)


def backbone_states(model, encoded: Encoded, layers: list[int]):
    """(P, T, len(layers) * d) float states of each row, right-padded, and the (P, T) mask."""
    import torch

    width = max(map(len, encoded.rows))
    ids = torch.zeros((len(encoded.rows), width), dtype=torch.long)
    mask = torch.zeros((len(encoded.rows), width), dtype=torch.long)
    for i, row in enumerate(encoded.rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    from evsel.models.runtime.backbone import run_layers

    device = next(model.parameters()).device
    with torch.inference_mode():
        got = run_layers(model, layers, input_ids=ids.to(device), attention_mask=mask.to(device))
    states = torch.cat([got[layer].float() for layer in layers], dim=-1).cpu()
    return states, mask.bool()


def span_mask(encoded: Encoded, width: int, max_span: int):
    """(P, T, max_span) bool: may a span start at token t of row p and run `length` + 1 tokens?"""
    import torch

    allowed = torch.zeros((len(encoded.rows), width, max_span), dtype=torch.bool)
    for p, (first, ok_start, ok_end) in enumerate(zip(encoded.starts, encoded.word_start, encoded.word_end)):
        n = len(ok_start)
        start = torch.tensor(ok_start, dtype=torch.bool)
        end = torch.tensor(ok_end, dtype=torch.bool)
        for length in range(min(max_span, n)):
            allowed[p, first: first + n - length, length] = start[: n - length] & end[length:]
    return allowed


def _head_module(d_in: int, config: ReaderConfig):
    import torch
    from torch import nn

    class SpanHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(d_in)
            self.proj = nn.Linear(d_in, config.width)
            self.mix = nn.TransformerEncoderLayer(config.width, config.heads, 2 * config.width, config.dropout,
                                                  batch_first=True, norm_first=True)
            self.start = nn.Linear(config.width, 1)
            self.end = nn.Linear(config.width, 1)
            self.length = nn.Parameter(torch.zeros(config.max_span))

        def forward(self, states, mask):
            """(P, T, max_span) span scores from (P, T, d_in) states and the (P, T) real-token mask."""
            h = self.proj(self.norm(states))
            h = self.mix(h, src_key_padding_mask=~mask)
            start = self.start(h).squeeze(-1)
            end = self.end(h).squeeze(-1)
            width = end.shape[1]
            shifted = torch.stack([torch.nn.functional.pad(end[:, k:], (0, k), value=0.0)
                                   for k in range(config.max_span)], dim=-1)[:, :width]
            return start.unsqueeze(-1) + shifted + self.length

    return SpanHead()


class Reader:
    """A trained span head for one backbone (its hidden size), ready to read."""

    def __init__(self, config: ReaderConfig, d_model: int, head=None, meta: dict | None = None):
        self.config = config
        self.d_model = d_model
        self.head = head if head is not None else _head_module(d_model * len(config.layers), config)
        self.meta = meta or {}

    # the shared training loop's adapter interface
    def parameters(self):
        return self.head.parameters()

    def save(self, folder: str | Path, extra: dict | None = None) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().float().cpu().contiguous() for k, v in self.head.state_dict().items()},
                  str(folder / HEAD_FILE))
        meta = {"format": READER_FORMAT, "d_model": self.d_model, **asdict(self.config), **self.meta, **(extra or {})}
        (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=1) + "\n")

    @classmethod
    def load(cls, folder: str | Path, d_model: int | None = None) -> "Reader":
        folder = Path(folder)
        meta = read_json(folder / CONFIG_FILE, "the reader's config", "evsel train reader")
        tensors = read_tensors(folder / HEAD_FILE, "the reader", "evsel train reader")
        if meta.get("format") != READER_FORMAT:
            raise ModelError(f"{folder} holds no evsel reader", "give a folder written by: evsel train reader --out DIR")
        if d_model is not None and meta.get("d_model") != d_model:
            raise ModelError(f"the reader in {folder} was trained for hidden size {meta['d_model']}, not {d_model}",
                             "train one for this model: evsel train reader --out DIR")
        fields = ReaderConfig.__dataclass_fields__
        with reading(folder / CONFIG_FILE, "the reader's config", "evsel train reader"):
            config = ReaderConfig(**{k: v for k, v in meta.items() if k in fields})
            reader = cls(config, meta["d_model"], meta={k: v for k, v in meta.items() if k not in fields
                                                        and k not in ("format", "d_model")})
        with reading(folder / HEAD_FILE, "the reader", "evsel train reader"):
            reader.head.load_state_dict(tensors)
        reader.head.eval()
        return reader

    @property
    def threshold(self) -> float:
        """Abstain below this probability of the best span (0: never), as chosen when trained."""
        return float(self.meta.get("abstain_below", 0.0))

    def rescore_weights(self, answer_type: str) -> dict:
        """The weights the answer step gives a span's other signals (its type, its sentence's match
        to the question, ...) beside the reader's log-probability, for a question of this answer
        type, as chosen on dev questions (`evsel train reader --rescore`); none: the reader alone."""
        chosen = self.meta.get("rescore", {}).get("weights", {})
        return chosen.get(answer_type) or chosen.get("*") or {}

    def scores(self, states, mask, allowed):
        """Log-probabilities of every allowed span across all passages: (P, T, max_span), -inf
        where not allowed."""
        import torch

        raw = self.head(states, mask)
        raw = raw.masked_fill(~allowed, float("-inf"))
        return raw - torch.logsumexp(raw.reshape(-1), dim=0)

    def read(self, backbone, question: str, passages: list[str], top: int = 1) -> list["Found"]:
        """The `top` likeliest answer spans, best first."""
        return self.reading(backbone, question, passages).top(top)

    def reading(self, backbone, question: str, passages: list[str]) -> "Reading":
        """Every allowed span's log-probability, from one batched backbone pass over the passages."""
        import torch

        encoded = encode(backbone.tokenizer, backbone.bos_id(), question, passages)
        states, mask = backbone_states(backbone.model, encoded, self.config.layers)
        allowed = span_mask(encoded, states.shape[1], self.config.max_span)
        with torch.inference_mode():
            logp = self.scores(states, mask, allowed) if allowed.any() else None
        return Reading(passages, encoded, logp, allowed)


class Reading:
    """One read of the passages: the span log-probabilities (P, T, max_span) and where each token
    lies in its passage, to list the best spans or score any span given by character offsets."""

    def __init__(self, passages: list[str], encoded: Encoded, logp, allowed):
        self.passages = passages
        self.encoded = encoded
        self.logp = logp  # None: no span is allowed (the passages hold no words)
        self.allowed = allowed

    def top(self, k: int) -> list["Found"]:
        if self.logp is None:
            return []
        k = min(k, int(self.allowed.sum()))
        values, where = self.logp.reshape(-1).topk(k)
        width, span = self.logp.shape[1], self.logp.shape[2]
        out = []
        for value, index in zip(values.tolist(), where.tolist()):
            p, rest = divmod(index, width * span)
            t, length = divmod(rest, span)
            first = t - self.encoded.starts[p]
            a = self.encoded.offsets[p][first][0]
            b = self.encoded.offsets[p][first + length][1]
            out.append(Found(p, a, b, self.passages[p][a:b], math.exp(value)))
        return out

    def logp_of(self, passage: int, start: int, end: int) -> float | None:
        """The log-probability of the token span that covers exactly passage[start:end] (None
        when no whole-token span does, or it is not allowed)."""
        if self.logp is None:
            return None
        offsets = self.encoded.offsets[passage]
        first = next((i for i, (a, b) in enumerate(offsets) if a == start and a < b), None)
        last = next((i for i, (a, b) in enumerate(offsets) if b == end and a < b), None)
        if first is None or last is None or not 0 <= last - first < self.logp.shape[2]:
            return None
        value = float(self.logp[passage, self.encoded.starts[passage] + first, last - first])
        return None if value == float("-inf") else value


@dataclass
class Found:
    passage: int  # index into the passages given
    start: int  # character offsets in that passage
    end: int
    text: str
    probability: float


def gold_targets(encoded: Encoded, spans: list[tuple[int, int, int]], width: int, max_span: int):
    """(P, T, max_span) bool of the token spans that cover the gold character spans (passage,
    start, end) exactly as whole words; spans the tokens cannot express are left out."""
    import torch

    target = torch.zeros((len(encoded.rows), width, max_span), dtype=torch.bool)
    for p, a, b in spans:
        offsets = encoded.offsets[p]
        first = next((i for i, (s, e) in enumerate(offsets) if s < e and (s <= a < e or s >= a)), None)
        last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < min(b, offsets[i][1])), None)
        if first is None or last is None or last < first or last - first >= max_span:
            continue
        target[p, encoded.starts[p] + first, last - first] = True
    return target
