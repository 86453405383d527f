"""The span decoder: the frozen LLM generates its answer, each word copied from a shown passage.

The question and the shown passages go to the instruct model in one chat ("[1] ...", "[2] ...",
then the question). Its answer is decoded under a constraint: the text generated so far must occur
in a passage, starting at a word's start, so every answer is an exact span with its offsets. The
decoder branches on the likeliest first tokens (one beam each), then goes on greedily; a beam ends
when the end of the answer is likelier than every allowed next token and the text ends at a word's
edge. A beam's score is the model's own log-probability of its tokens and of the end, so a span
is as likely as the unconstrained model finds it; nothing is trained.

This is the generative alternative to the start/end readers (span_head.py, lora.py): the same
answer step reads it (`top`, `logp_of`), and a folder whose reader.json has format
evsel-span-decoder-1 selects it (`evsel eval --answer-style short@DIR`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

from evsel.errors import ModelError
from evsel.models.shared.trained_files import read_json

SPAN_DECODER_FORMAT = "evsel-span-decoder-1"
CONFIG_FILE = "reader.json"
SYSTEM = "Answer the question with a short phrase copied from the passages."
# the answer is read as a quotation the assistant's turn opens: the instruct model otherwise starts
# with a preamble ("The answer to this question would be ..."); a closing quote ends it
ANSWER_OPENING = 'The answer is "'


@dataclass
class SpanDecoderConfig:
    max_tokens: int = 1024  # the passages share what the question and the chat's framing leave
    max_answer_tokens: int = 12
    beams: int = 4  # the likeliest allowed first tokens, each decoded on
    candidates: int = 64  # the model's likeliest next tokens checked against the passages per step
    first_candidates: int = 400  # ... for the first token, which must start a word somewhere


class Collapsed:
    """A passage window with its whitespace runs read as one space, and where each character came
    from, so a span found in what the model read maps back to the passage's own offsets."""

    def __init__(self, text: str, start: int):
        chars, where = [], []
        for i, ch in enumerate(text):
            if ch.isspace():
                if not chars or chars[-1] == " ":
                    continue
                ch = " "
            chars.append(ch)
            where.append(start + i)
        self.text = "".join(chars)
        self.where = where

    def word_starts(self, piece: str) -> list[int]:
        found, i = [], self.text.find(piece)
        while i >= 0:
            if i == 0 or not self.text[i - 1].isalnum():
                found.append(i)
            i = self.text.find(piece, i + 1)
        return found

    def ends_word(self, i: int, length: int) -> bool:
        j = i + length
        return j == len(self.text) or not self.text[j].isalnum()

    def original(self, i: int, length: int) -> tuple[int, int]:
        return self.where[i], self.where[i + length - 1] + 1


@dataclass
class Beam:
    tokens: list[int]
    text: str
    places: list[tuple[int, int]]  # (passage, offset in its collapsed window) where text occurs
    logp: float
    done: bool = False


class SpanDecoder:
    """The decoder's settings; the weights are the backbone's own."""

    def __init__(self, config: SpanDecoderConfig | None = None, meta: dict | None = None):
        self.config = config or SpanDecoderConfig()
        self.meta = meta or {}

    @classmethod
    def load(cls, folder: str | Path) -> "SpanDecoder":
        meta = read_json(Path(folder) / CONFIG_FILE, "the span decoder's settings", "reinstall evsel")
        if meta.get("format") != SPAN_DECODER_FORMAT:
            raise ModelError(f"{folder} holds no span decoder", f"give a folder whose reader.json has format {SPAN_DECODER_FORMAT}")
        fields = SpanDecoderConfig.__dataclass_fields__
        config = SpanDecoderConfig(**{k: v for k, v in meta.items() if k in fields})
        return cls(config, {k: v for k, v in meta.items() if k not in fields and k != "format"})

    def margin_for(self, dialogue: bool) -> float:
        return math.inf  # no no-answer score: the decoder always answers

    def windows(self, tokenizer, question: str, passages: list[str]) -> list[Collapsed]:
        """Each passage cut to its fair share of the tokens, keeping its middle (as the LoRA reader)."""
        from evsel.models.reader.lora import middle_windows, passage_tokens

        framing = len(tokenizer(SYSTEM + question, add_special_tokens=False)["input_ids"]) + 24 + 4 * len(passages)
        encoded = [passage_tokens(tokenizer, text, 100_000) for text in passages]
        out = []
        for text, (_, spans, _, _), (first, n) in zip(passages, encoded, middle_windows(
                [len(e[0]) for e in encoded], self.config.max_tokens - framing)):
            if not n:
                out.append(Collapsed("", 0))
                continue
            a, b = spans[first][0], spans[first + n - 1][1]
            out.append(Collapsed(text[a:b], a))
        return out

    def reading(self, backbone, question: str, passages: list[str]) -> "DecodedReading":
        import torch

        shown = self.windows(backbone.tokenizer, question, passages)
        body = "\n\n".join(f"[{i}] {w.text}" for i, w in enumerate(shown, 1))
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Passages:\n\n{body}\n\nQuestion: {' '.join(question.split())}"}]
        model = backbone.model
        tok = backbone.tokenizer
        opening = torch.tensor([tok(ANSWER_OPENING, add_special_tokens=False)["input_ids"]])
        ids = torch.cat([backbone.chat_ids(messages), opening], 1).to(next(model.parameters()).device)
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)  # the vocabulary only where it is read
        reading = DecodedReading(backbone, passages, shown, out.cache, out.logits[0, -1])
        reading.decode(self.config)
        return reading


_CLOSING: dict = {}


def closing_ids(tokenizer) -> list[int]:
    """The tokens that close the quoted answer (each starts with a double quote), once per tokenizer."""
    key = id(tokenizer)
    if key not in _CLOSING:
        vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        pieces = [(i, tokenizer.convert_tokens_to_string([t])) for i, t in enumerate(vocab) if t is not None]
        _CLOSING[key] = sorted((i for i, piece in pieces if piece.startswith('"')), key=lambda i: len(vocab[i]))
    return _CLOSING[key]


class DecodedReading:
    """The decoded answers (`top`), and any span's log-probability as the whole answer (`logp_of`)."""

    null_logp = -math.inf

    def __init__(self, backbone, passages: list[str], shown: list[Collapsed], cache, last_logits):
        self.backbone = backbone
        self.passages = passages
        self.shown = shown
        self.cache = cache  # the prompt's keys and values, kept as they are
        self.first_logp = last_logits.float().log_softmax(-1)
        self.closing = closing_ids(backbone.tokenizer)
        self.end_id = self.closing[0]  # fed to a finished beam to keep the batch's shape
        self.found: list = []

    def _piece(self, token: int) -> str:
        return self.backbone.tokenizer.decode([token])

    def _first_beams(self, config: SpanDecoderConfig) -> list[Beam]:
        values, tokens = self.first_logp.topk(config.first_candidates)
        beams = []
        for value, token in zip(values.tolist(), tokens.tolist()):
            piece = self._piece(token).lstrip()
            if not piece or not piece[0].isalnum() and piece[0] not in "£$€":
                continue
            places = [(p, i) for p, w in enumerate(self.shown) for i in w.word_starts(piece)]
            if places:
                beams.append(Beam([token], piece, places, value))
                if len(beams) == config.beams:
                    break
        return beams

    def _end_logp(self, logp) -> float:
        import torch

        return float(torch.logsumexp(logp[self.closing], 0))

    def _can_end(self, beam: Beam) -> bool:
        return any(self.shown[p].ends_word(i, len(beam.text)) for p, i in beam.places)

    def _step(self, beam: Beam, logp, config: SpanDecoderConfig) -> None:
        """Extend `beam` by its likeliest allowed token, or end it."""
        end = self._end_logp(logp) if self._can_end(beam) else -math.inf
        values, tokens = logp.topk(config.candidates)
        for value, token in zip(values.tolist(), tokens.tolist()):
            if value <= end:
                break
            text = beam.text + self._piece(token)
            places = [(p, i) for p, i in beam.places if self.shown[p].text.startswith(text, i)]
            if places:
                beam.tokens.append(token)
                beam.text, beam.places, beam.logp = text, places, beam.logp + value
                return
        beam.done, beam.logp = True, beam.logp + end

    def decode(self, config: SpanDecoderConfig) -> None:
        import torch

        beams = self._first_beams(config)
        if beams:
            cache = copy.deepcopy(self.cache)
            cache.batch_repeat_interleave(len(beams))
            model = self.backbone.model
            device = next(model.parameters()).device
            for _ in range(config.max_answer_tokens):
                if all(b.done for b in beams):
                    break
                step = torch.tensor([[b.tokens[-1] if not b.done else self.end_id] for b in beams], device=device)
                with torch.inference_mode():
                    logits = model(input_ids=step, cache=cache, use_cache=True).logits[:, -1]
                logps = logits.float().log_softmax(-1)
                for beam, logp in zip(beams, logps):
                    if not beam.done:
                        self._step(beam, logp, config)
        self.found = self._spans([b for b in beams if b.done and b.logp > -math.inf])

    def _spans(self, beams: list[Beam]) -> list:
        from evsel.models.reader.span_head import Found

        out, seen = [], set()
        for beam in sorted(beams, key=lambda b: -b.logp):
            text = beam.text.rstrip(" .,;:!?")  # the quotation's own punctuation is no part of the answer
            if not text:
                continue
            p, i = next((p, i) for p, i in beam.places if self.shown[p].ends_word(i, len(beam.text)))
            a, b = self.shown[p].original(i, len(text))
            if (p, a, b) not in seen:
                seen.add((p, a, b))
                out.append(Found(p, a, b, self.passages[p][a:b], math.exp(beam.logp)))
        return out

    def top(self, k: int) -> list:
        return self.found[:k]

    def logp_of(self, passage: int, start: int, end: int) -> float | None:
        """The model's log-probability of the span's words, then the closing quote, as its whole answer."""
        import torch

        text = " ".join(self.passages[passage][start:end].split())
        if not text:
            return None
        tokens = self.backbone.tokenizer(text, add_special_tokens=False)["input_ids"]
        model = self.backbone.model
        device = next(model.parameters()).device
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([tokens], device=device), cache=copy.deepcopy(self.cache),
                           use_cache=True).logits[0]
        logp = logits.float().log_softmax(-1)
        words = float(self.first_logp[tokens[0]]) + float(logp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])].sum())
        return words + self._end_logp(logp[-1])
