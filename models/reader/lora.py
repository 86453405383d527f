"""The LoRA reader: the frozen backbone adapted to reading by low-rank deltas on the attention and
MLP projections of its upper layers, and a start/end head on the deepest of them.

The question and every shown passage are read in one sequence ("Question: ...", then "[1] ...",
"[2] ...", each passage after a short label, then "Answer:"), so a passage is read beside the
others. Layers 1..cut run frozen (their output is what training caches); layers cut+1..deepest run
with the deltas, and the forward stops there. Every whole-word span of at most max_span tokens in
any passage competes in one softmax with a null ("no answer") scored on the last token, the only
one that has read everything (SQuAD 2.0 puts the null on the first token, which in a causal model
has read nothing). The backbone's own weights never change: the deltas are hooks that exist only
while the reader reads.

Files: OUT/adapter.safetensors (lora A/B per layer and projection, the head) and OUT/reader.json
(format evsel-reader-lora-1, the config, what it was trained on, its abstention margin).
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from evsel.errors import ModelError
from evsel.models.shared.trained_files import read_json, read_tensors, reading

LORA_READER_FORMAT = "evsel-reader-lora-1"
TENSOR_FILE = "adapter.safetensors"
CONFIG_FILE = "reader.json"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraReaderConfig:
    cut: int = 14  # layers 1..cut frozen (cached in training); 1-based
    deepest: int = 22  # the adapted layers are cut+1..deepest; the head reads this one's output
    rank: int = 8
    alpha: float = 16.0
    projections: list[str] = field(default_factory=lambda: list(PROJECTIONS))
    max_span: int = 30
    max_tokens: int = 1024  # the whole sequence; passages are cut to share what the question leaves
    max_question_tokens: int = 64

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def adapted(self) -> list[int]:
        return list(range(self.cut + 1, self.deepest + 1))


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch in "£$€%'"


def passage_tokens(tokenizer, text: str, limit: int):
    """(ids, character spans, may-start, may-end) of a passage's first `limit` tokens; a span may
    start or end only at a word's edge."""
    got = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = got["input_ids"][:limit]
    spans = []
    for a, b in got["offset_mapping"][: len(ids)]:
        while a < b and text[a].isspace():  # byte-level tokens carry their leading space
            a += 1
        spans.append((a, b))
    starts = [a < b and _is_word(text[a]) and (a == 0 or not text[a - 1].isalnum()) for a, b in spans]
    ends = [a < b and (b == len(text) or not text[b].isalnum()) and text[b - 1] not in " \n\t" for a, b in spans]
    return ids, spans, starts, ends


@dataclass
class Sequence:
    """One read: the token ids, where each passage's tokens start, their character spans, and
    which of them may start or end a span. The null is scored at the last token."""

    ids: list[int]
    starts: list[int]
    offsets: list[list[tuple[int, int]]]
    word_start: list[list[bool]]
    word_end: list[list[bool]]


def encode(tokenizer, bos_id: int, question: str, passages: list[str], config: LoraReaderConfig) -> Sequence:
    plain = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = [bos_id] + plain("Question: " + " ".join(question.split()))[: config.max_question_tokens] + plain("\n")
    end = plain("\nAnswer:")
    labels = [plain(f"[{i}] ") for i in range(1, len(passages) + 1)]
    room = config.max_tokens - len(ids) - len(end) - sum(len(x) + 1 for x in labels)
    encoded = [passage_tokens(tokenizer, text, 100_000) for text in passages]
    windows = middle_windows([len(e[0]) for e in encoded], room)
    starts, offsets, w_start, w_end = [], [], [], []
    newline = plain("\n")
    for label, (p_ids, spans, ok_start, ok_end), (a, n) in zip(labels, encoded, windows):
        ids += label
        starts.append(len(ids))
        ids += p_ids[a:a + n]
        offsets.append(spans[a:a + n])
        w_start.append(ok_start[a:a + n])
        w_end.append(ok_end[a:a + n])
        ids += newline
    ids += end
    return Sequence(ids, starts, offsets, w_start, w_end)


def middle_windows(lengths: list[int], room: int) -> list[tuple[int, int]]:
    """(first token, tokens kept) of each passage sharing `room` tokens: a fair share each (a short
    passage leaves its room to the others), and a passage over its share keeps its middle (a shown
    chunk read with the text beside it, evsel/answer/windows.py, sits in the middle of its window)."""
    return [((length - n) // 2, n) for length, n in zip(lengths, _fair_share(lengths, max(room, 0)))]


def _fair_share(lengths: list[int], room: int) -> list[int]:
    """How many tokens each passage keeps: all of it when all fit, else an equal cap, raised
    while the short ones leave room."""
    if sum(lengths) <= room:
        return list(lengths)
    cap = room // max(1, len(lengths))
    while True:
        used = sum(min(n, cap) for n in lengths)
        over = [n for n in lengths if n > cap]
        if not over or room - used < len(over):
            return [min(n, cap) for n in lengths]
        cap += (room - used) // len(over)


def span_mask(seq: Sequence, max_span: int):
    """(T, max_span) bool: may a span start at token t and run `length` + 1 tokens?"""
    import torch

    allowed = torch.zeros((len(seq.ids), max_span), dtype=torch.bool)
    for first, ok_start, ok_end in zip(seq.starts, seq.word_start, seq.word_end):
        n = len(ok_start)
        start = torch.tensor(ok_start, dtype=torch.bool)
        end = torch.tensor(ok_end, dtype=torch.bool)
        for length in range(min(max_span, n)):
            allowed[first: first + n - length, length] = start[: n - length] & end[length:]
    return allowed


def gold_mask(seq: Sequence, spans: list[tuple[int, int, int]], max_span: int):
    """(T, max_span) bool of the token spans covering the gold character spans (passage, start, end);
    spans the tokens cannot express (or cut off) are left out."""
    import torch

    target = torch.zeros((len(seq.ids), max_span), dtype=torch.bool)
    for p, a, b in spans:
        offsets = seq.offsets[p]
        first = next((i for i, (s, e) in enumerate(offsets) if s < e and (s <= a < e or s >= a)), None)
        last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < min(b, offsets[i][1])), None)
        if first is None or last is None or last < first or last - first >= max_span or offsets[last][1] < b:
            continue
        target[seq.starts[p] + first, last - first] = True
    return target


def run_upper(layers: list, rotary, hidden, first_position: int = 0):
    """The residual stream after `layers` (decoder layer modules, in order) from `hidden` (1, T, d),
    causal, no padding (one sequence)."""
    import torch

    positions = torch.arange(first_position, first_position + hidden.shape[1], device=hidden.device)[None]
    embeddings = rotary(hidden, positions)
    for layer in layers:
        out = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=embeddings)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


class LoraReader:
    """The deltas and the head for one backbone shape."""

    def __init__(self, config: LoraReaderConfig, d_model: int, shapes: dict[str, tuple[int, int]],
                 tensors: dict | None = None, meta: dict | None = None, seed: int = 0):
        """`shapes`: {projection: (in, out)} of one decoder layer's linear layers."""
        import torch

        self.config = config
        self.d_model = d_model
        self.shapes = {p: tuple(s) for p, s in shapes.items()}
        self.meta = meta or {}
        self._merged: tuple | None = None  # (the model, its adapted layers with the deltas added)
        generator = torch.Generator().manual_seed(seed)
        self.params: dict = {}
        for layer in config.adapted:
            for proj in config.projections:
                d_in, d_out = self.shapes[proj]
                self.params[f"layers.{layer}.{proj}.lora_A"] = torch.randn(config.rank, d_in, generator=generator) / d_in ** 0.5
                self.params[f"layers.{layer}.{proj}.lora_B"] = torch.zeros(d_out, config.rank)
        self.params["head.norm"] = torch.ones(d_model)
        self.params["head.start"] = torch.randn(d_model, generator=generator) / d_model ** 0.5
        self.params["head.end"] = torch.randn(d_model, generator=generator) / d_model ** 0.5
        self.params["head.null"] = torch.zeros(d_model)
        self.params["head.bias"] = torch.zeros(3)  # start, end, null
        self.params["head.length"] = torch.zeros(config.max_span)
        if tensors is not None:
            for name, value in self.params.items():
                if name not in tensors or tuple(tensors[name].shape) != tuple(value.shape):
                    raise ModelError(f"the reader's {name} is missing or has another shape",
                                     "train one for this backbone: evsel train reader --lora --out DIR")
                self.params[name] = tensors[name].float().clone()

    @staticmethod
    def shapes_of(model) -> dict[str, tuple[int, int]]:
        layer = model.model.layers[0]
        found = {}
        for proj in PROJECTIONS:
            module = getattr(layer.self_attn, proj, None) or getattr(layer.mlp, proj, None)
            if module is None:
                raise ModelError(f"the backbone's layers have no {proj}", "the LoRA reader needs a Llama-style model")
            found[proj] = (module.in_features, module.out_features)
        return found

    @classmethod
    def for_model(cls, model, config: LoraReaderConfig, seed: int = 0) -> "LoraReader":
        n = len(model.model.layers)
        if not 1 <= config.cut < config.deepest <= n:
            raise ModelError(f"layers {config.cut + 1}..{config.deepest} are not within the model's 1..{n}",
                             "choose --cut and --deepest within the model's layers")
        return cls(config, model.config.hidden_size, cls.shapes_of(model), seed=seed)

    def parameters(self) -> list:
        return list(self.params.values())

    def trainable(self, flag: bool = True) -> None:
        self._merged = None  # trained deltas change: merge again when next read
        for p in self.params.values():
            p.requires_grad_(flag)

    def merged_layers(self, model) -> list:
        """Copies of the model's adapted layers with each delta added to its weight, made once per
        model: reading then costs what the plain layers cost (the hooks of `applied` took about a
        seventh of a reading's time on a CPU)."""
        import copy

        import torch

        if self._merged is None or self._merged[0] is not model:
            layers = []
            for number in self.config.adapted:
                layer = copy.deepcopy(model.model.layers[number - 1])
                for proj in self.config.projections:
                    module = getattr(layer.self_attn, proj, None) or getattr(layer.mlp, proj)
                    a = self.params[f"layers.{number}.{proj}.lora_A"].detach()
                    b = self.params[f"layers.{number}.{proj}.lora_B"].detach()
                    with torch.no_grad():
                        weight = module.weight
                        module.weight.copy_((weight.float() + (b @ a) * self.config.scale).to(weight.dtype))
                layers.append(layer)
            self._merged = (model, layers)
        return self._merged[1]

    @contextmanager
    def applied(self, layers: list, numbers: list[int]):
        """The deltas on `layers` (decoder layer modules numbered `numbers`, 1-based) while inside."""
        hooks = []

        def delta(a, b):
            def hook(_module, inputs, output):
                x = inputs[0]
                return output + ((x.to(a.dtype) @ a.t()) @ b.t() * self.config.scale).to(output.dtype)
            return hook

        try:
            for layer, number in zip(layers, numbers):
                for proj in self.config.projections:
                    module = getattr(layer.self_attn, proj, None) or getattr(layer.mlp, proj)
                    a = self.params[f"layers.{number}.{proj}.lora_A"]
                    b = self.params[f"layers.{number}.{proj}.lora_B"]
                    hooks.append(module.register_forward_hook(delta(a, b)))
            yield
        finally:
            for hook in hooks:
                hook.remove()

    def head_scores(self, hidden, allowed):
        """(span scores (T, max_span), -inf where not allowed; the null's score) from the deepest
        layer's states (1, T, d)."""
        import torch

        h = hidden[0].float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.params["head.norm"]
        start = h @ self.params["head.start"] + self.params["head.bias"][0]
        end = h @ self.params["head.end"] + self.params["head.bias"][1]
        null = h[-1] @ self.params["head.null"] + self.params["head.bias"][2]
        width = end.shape[0]
        shifted = torch.stack([torch.nn.functional.pad(end[k:], (0, k), value=0.0) for k in range(self.config.max_span)],
                              dim=-1)[:width]
        spans = (start[:, None] + shifted + self.params["head.length"]).masked_fill(~allowed, float("-inf"))
        return spans, null

    def upper_scores(self, layers: list, rotary, lower, allowed):
        """Span and null scores from the cut layer's output `lower` (1, T, d) through `layers`
        (the adapted decoder layers, in the dtype they run in)."""
        with self.applied(layers, self.config.adapted):
            hidden = run_upper(layers, rotary, lower.to(next(layers[0].parameters()).dtype))
        return self.head_scores(hidden, allowed)

    def lower_states(self, model, seq: Sequence):
        """The frozen layers' output (1, T, d) of a sequence: what training caches."""
        import torch

        from evsel.models.runtime.backbone import run_layers

        device = next(model.parameters()).device
        ids = torch.tensor([seq.ids], device=device)
        with torch.inference_mode():
            return run_layers(model, [self.config.cut], input_ids=ids)[self.config.cut]

    def reading(self, backbone, question: str, passages: list[str]) -> "LoraReading":
        """Every allowed span's log-probability and the null's, from one pass over the question
        and all passages."""
        import torch

        model = backbone.model
        seq = encode(backbone.tokenizer, backbone.bos_id(), question, passages, self.config)
        allowed = span_mask(seq, self.config.max_span)
        layers = self.merged_layers(model)
        with torch.inference_mode():
            lower = self.lower_states(model, seq)
            hidden = run_upper(layers, model.model.rotary_emb, lower.to(next(layers[0].parameters()).dtype))
            spans, null = self.head_scores(hidden, allowed)
        return LoraReading(passages, seq, spans, float(null), self.config.max_span)

    def save(self, folder: str | Path, extra: dict | None = None) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / (TENSOR_FILE + ".tmp")
        save_file({k: v.detach().float().cpu().contiguous() for k, v in self.params.items()}, str(tmp))
        tmp.replace(folder / TENSOR_FILE)
        meta = {"format": LORA_READER_FORMAT, "d_model": self.d_model, **asdict(self.config),
                "shapes": {k: list(v) for k, v in self.shapes.items()}, **self.meta, **(extra or {})}
        tmp = folder / (CONFIG_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        tmp.replace(folder / CONFIG_FILE)

    @classmethod
    def load(cls, folder: str | Path, model=None) -> "LoraReader":
        folder = Path(folder)
        meta = read_json(folder / CONFIG_FILE, "the reader's config", "evsel train reader --lora")
        if meta.get("format") != LORA_READER_FORMAT:
            raise ModelError(f"{folder} holds no LoRA reader", "give a folder written by: evsel train reader --lora")
        tensors = read_tensors(folder / TENSOR_FILE, "the reader", "evsel train reader --lora")
        fields = LoraReaderConfig.__dataclass_fields__
        with reading(folder / CONFIG_FILE, "the reader's config", "evsel train reader --lora"):
            config = LoraReaderConfig(**{k: v for k, v in meta.items() if k in fields})
            shapes = {k: tuple(v) for k, v in meta["shapes"].items()}
            rest = {k: v for k, v in meta.items() if k not in fields and k not in ("format", "d_model", "shapes")}
        if model is not None:
            if meta["d_model"] != model.config.hidden_size or shapes != cls.shapes_of(model) \
                    or config.deepest > len(model.model.layers):
                raise ModelError(f"the reader in {folder} was trained for another backbone shape",
                                 "train one for this model: evsel train reader --lora --out DIR")
        with reading(folder / TENSOR_FILE, "the reader", "evsel train reader --lora"):
            return cls(config, meta["d_model"], shapes, tensors=tensors, meta=rest)

    @property
    def margin(self) -> float:
        """Abstain in dialogues when the null's log-probability beats the best span's by more than
        this (chosen on held-out LoCoMo questions; +inf: never)."""
        value = self.meta.get("abstention", {}).get("margin")
        return math.inf if value is None else float(value)

    def margin_for(self, dialogue: bool) -> float:
        """The margin for a chat, or for prose (`prose_abstention`: chosen on the prose dev split's
        answerable and near-miss readings; +inf where there is none)."""
        if dialogue:
            return self.margin
        value = self.meta.get("prose_abstention", {}).get("margin")
        return math.inf if value is None else float(value)


class LoraReading:
    """One read: span log-probabilities per passage (P, T_p, max_span), as the answer step reads
    them (`top`, `logp_of`), and the null's log-probability."""

    def __init__(self, passages: list[str], seq: Sequence, spans, null: float, max_span: int):
        import torch

        self.passages = passages
        self.seq = seq
        total = torch.logsumexp(torch.cat([spans.reshape(-1), torch.tensor([null])]), 0)
        self.null_logp = float(null - total)
        self.logp_all = spans - total  # (T, max_span)
        self.max_span = max_span

    def top(self, k: int) -> list:
        from evsel.models.reader.span_head import Found

        flat = self.logp_all.reshape(-1)
        k = min(k, int(flat.isfinite().sum()))
        if k <= 0:
            return []
        values, where = flat.topk(k)
        out = []
        for value, index in zip(values.tolist(), where.tolist()):
            t, length = divmod(index, self.max_span)
            p = max(i for i, s in enumerate(self.seq.starts) if s <= t)
            first = t - self.seq.starts[p]
            a = self.seq.offsets[p][first][0]
            b = self.seq.offsets[p][first + length][1]
            out.append(Found(p, a, b, self.passages[p][a:b], math.exp(value)))
        return out

    def logp_of(self, passage: int, start: int, end: int) -> float | None:
        offsets = self.seq.offsets[passage]
        first = next((i for i, (a, b) in enumerate(offsets) if a == start and a < b), None)
        last = next((i for i, (a, b) in enumerate(offsets) if b == end and a < b), None)
        if first is None or last is None or not 0 <= last - first < self.max_span:
            return None
        value = float(self.logp_all[self.seq.starts[passage] + first, last - first])
        return None if value == float("-inf") else value
