"""Evidence to an answer: the prompts, and the grounded answer step.

Styles:
- `short` (default): the trained reader (models/reader/span_head.py) when the backbone has one: a span head
  on the backbone's own states scores every whole-word span of every shown passage in one softmax,
  and the likeliest is the answer, with its exact offsets. Yes/no questions in prose and
  when-questions in dialogues keep the steps below (the LLM's calibrated yes/no; the turn's time
  resolved against its session's date). Dialogue answers abstain when the best span's probability
  is under the threshold chosen on held-out LoCoMo questions. Without a reader: `rules`.
- `rules`: the sentence of the evidence that best supports an answer is located, the
  generator answers from that sentence alone (a 135M model reads one sentence far better than
  five passages), and its phrase is snapped back onto the exact evidence text. The answer is that
  span when the generator copied it, else the generated phrase; the supporting span is always
  shown with its passage and offsets. In dialogues, when-questions are answered with the turn's
  time expression resolved against its session's date ("yesterday" said on 8 May 2023 -> 7 May
  2023).
- `span`: like short, but the answer is always the exact evidence span.
- `sentence`: free-form generation from all the passages (the old answer step).

`short` and `span` abstain (`text` None, with a reason) when no evidence sentence shares a content
word with the question, when the generator says the passages do not tell, or, in dialogues, when
the question asks about one speaker and the passages say it of another.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from . import grounding
from ..defaults import STYLES  # defined there for the CLI's options
from ..provenance import describe

SYSTEM = (
    "You answer questions about documents. Use only the numbered passages below. "
    "Answer in one or two short sentences. If the passages do not contain the answer, say so."
)
SHORT_SYSTEM = "Answer the question in a few words, using the passage."
ABSTAIN_TEXT = "No information available"  # what an abstention reads as, for metrics
SHORT_MAX_TOKENS = 16
SNAP_AS_ANSWER = 0.8  # token F1 of the generated phrase to an evidence span for the span to be the answer
SNAP_AS_SUPPORT = 0.5  # ... for that span, not the whole sentence, to be shown as the support
# where the supporting sentence is looked for, and a bonus for repeating the question's word pairs;
# prose settings chosen on FairytaleQA train (300 questions: F1 0.195 with 3 passages and no bonus,
# 0.199 with these); dialogue keeps the defaults, there being no LoCoMo training split to choose on
PROSE_PASSAGES, PROSE_PHRASE_BONUS = 5, 0.05
DIALOGUE_PASSAGES = 3
# the lexical ranking's best sentences re-scored by the LLM (question likelihood), and the weight of
# that likelihood (mean log-prob per question token) against the lexical score. Prose: FairytaleQA
# train, 60 questions, F1 0.185 at weight 0, 0.167 at 0.3 (docs/ANSWERS.md), so prose keeps the
# lexical order and the LLM chooses among the typed phrases; dialogue: LoCoMo conversations 1-2 (61
# questions), LoCoMo F1 0.267 at 0, 0.253 at 0.3
SENTENCE_POOL, SENTENCE_LLM_WEIGHT, DIALOGUE_SENTENCE_LLM_WEIGHT = 8, 0.0, 0.0
CONTEXT_WORDS = 30  # the supporting sentence is read with the sentences after it up to this many words
SCORE_BATCH = 16  # rows per forward pass when scoring
TYPE_WORDS = {"person": "person", "place": "place", "number": "number or amount", "date": "date or time",
              "organisation": "organisation or title", "thing": "noun phrase"}
SPEAKER_MARGIN = 0.3  # chosen on LoCoMo conversations 1-3 (docs/ANSWERS.md)
_SAYS_NOTHING = ("not mentioned", "no information", "does not say", "doesn't say", "not provided",
                 "does not mention", "doesn't mention", "not specified", "no mention")


def build_messages(question: str, scored_in_document_order) -> list[dict]:
    passages = "\n\n".join(
        f"[{i}] ({describe(s.chunk)})\n{s.chunk.text.strip()}" for i, s in enumerate(scored_in_document_order, 1)
    )
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Passages:\n\n{passages}\n\nQuestion: {question}\nAnswer:"},
    ]


def short_messages(question: str, sentence: grounding.Sentence, chunk) -> list[dict]:
    said = f"{sentence.speaker} said" + (f" ({chunk.time_start})" if chunk.time_start else "") + ": " \
        if sentence.speaker else ""
    return [
        {"role": "system", "content": SHORT_SYSTEM},
        {"role": "user", "content": f"Passage: {said}{sentence.text}\n\nQuestion: {question}"},
    ]


@dataclass
class Grounded:
    text: str | None  # None: abstained
    kind: str  # span | generated | date | yesno | sentence | abstained
    reason: str | None = None
    passage: int | None = None  # 0-based index into the evidence given
    start: int | None = None  # span offsets in the passage text
    end: int | None = None
    generated: str | None = None  # the generator's own phrase, before snapping
    prompt_tokens: int = 0
    generated_tokens: int = 0
    speaker: str | None = None  # who said the supporting span (dialogues)
    answer_type: str | None = None  # what the question asks for (grounding.ANSWER_TYPES)
    confidence: float | None = None  # the reader's probability of its span

    def as_metric_text(self) -> str:
        return self.text if self.text is not None else ABSTAIN_TEXT


def grounded_answer(backbone, question: str, evidence: list, style: str = "short",
                    max_new_tokens: int = SHORT_MAX_TOKENS, reader_dir: str | None = None) -> Grounded:
    """The answer to `question` from `evidence` (Scored, best first) in `style` short, rules or span."""
    dialogue = any(s.chunk.speakers for s in evidence)
    asked = grounding.answer_type(question)
    if style == "short":
        from evsel.models.reader.shipped import reader_for

        reader = reader_for(backbone, reader_dir, dialogue) if Scorer(backbone).ready else None
        # an either/or question ("... a beach or the mountains?") reads as yes/no: the reader answers
        # it with one of its options
        chooses = bool(grounding.options(question))
        if reader is not None and (reader_answers(question, asked, dialogue) or chooses):
            return _reader_answer(backbone, reader, question, evidence, asked, dialogue)
    style = "short" if style == "rules" else style
    chunks = [s.chunk for s in evidence[: DIALOGUE_PASSAGES if dialogue else PROSE_PASSAGES]]
    found = grounding.sentences(chunks)
    ranked = grounding.rank_sentences(question, found, phrase_bonus=0.0 if dialogue else PROSE_PHRASE_BONUS)
    if not ranked or grounding.support(question, ranked[0][1]) == 0.0:
        return Grounded(None, "abstained", "no passage shares a content word with the question", answer_type=asked)
    scorer = Scorer(backbone)
    typed = asked in grounding.ENTITY_TYPES and (not dialogue or style == "span") and not (asked == "date" and dialogue)
    if typed:
        result = _typed_answer(scorer, question, asked, found, ranked)
    else:
        best = _choose_sentence(scorer, question, found, [pair for pair in ranked[:SENTENCE_POOL] if pair[0] > 0]
                                or ranked[:1])
        if asked == "yesno" and not dialogue:
            yes = scorer.yes_or_no(question, _read(_context(found, best))) if scorer.ready else True
            result = Grounded("yes" if yes else "no", "yesno", None, best.passage, best.start, best.end)
        else:
            result = _from_sentence(backbone, question, chunks, found, best, style, max_new_tokens)
        result.speaker = result.speaker or best.speaker
    result.answer_type = asked
    return result


def reader_answers(question: str, asked: str, dialogue: bool) -> bool:
    """Does the reader answer this question? Not yes/no questions about prose (the LLM's calibrated
    yes/no does) nor when-questions in dialogues (the turn's time, resolved against its session)."""
    return not ((asked == "yesno" and not dialogue) or (dialogue and grounding.is_temporal(question)))


LORA_TOP = 20  # the LoRA reader's best spans the type and option checks choose among
# a span of the asked type is preferred to a likelier untyped one while it is at most this much
# less likely (nats): the reader ranks well, the type only breaks near ties
TYPE_MARGIN = 2.3
NAME_MARGIN = 2.3  # nats: a person's name is preferred to a likelier description while this close
CHECKED_TYPES = ("person", "place", "number", "date", "organisation")


def _passages_read(question: str, evidence: list) -> tuple[list, list, list[str]]:
    """The evidence's sentences, their ranking against the question (empty when no sentence shares a
    content word with it: nothing to answer from), and the passages' texts, as both readers take them."""
    chunks = [s.chunk for s in evidence]
    found = grounding.sentences(chunks)
    ranked = grounding.rank_sentences(question, found)
    if ranked and grounding.support(question, ranked[0][1]) == 0.0:
        ranked = []
    return found, ranked, [c.text for c in chunks]


def _speaker_at(found: list, span) -> str | None:
    """Who said the sentence a span starts in (dialogues), else None."""
    said = next((s for s in found if s.passage == span.passage and s.start <= span.start < s.end), None)
    return said.speaker if said else None


def _lora_answer(backbone, reader, question: str, evidence: list, asked: str, dialogue: bool) -> Grounded:
    """The LoRA reader's answer: its likeliest span that adds to the question, of the asked type
    when one nearly as likely is (_typed_span), one of the question's options when it offers some;
    none when the reader's no-answer beats its best span by more than the margin calibrated for
    the kind (chat or prose)."""
    found, ranked, texts = _passages_read(question, evidence)
    if not ranked:
        return Grounded(None, "abstained", "no passage shares a content word with the question", answer_type=asked)
    reading = reader.reading(backbone, question, texts)
    spans = [f for f in reading.top(LORA_TOP) if not grounding.echoes(question, f.text)]
    best = _option_span(question, reading, texts) or (_completed(question, asked, _typed_span(
        question, asked, spans, texts), texts) if spans else None)
    if best is None:
        return Grounded(None, "abstained", "the passages hold no words to answer with", answer_type=asked)
    logp = math.log(best.probability)
    speaker = _speaker_at(found, best)
    # each kind's margin is chosen on its own held-out readings (chats on LoCoMo's adversarial
    # questions, prose on near-miss passages of held-out stories, bench/prose_abstention.py), there
    # against the reader's best span, as here
    surest = max(logp, math.log(spans[0].probability)) if spans else logp
    if reading.null_logp - surest > reader.margin_for(dialogue):
        return Grounded(None, "abstained", f"the reader found no answer it trusts in the passages (its best, "
                        f"\"{_flat(best.text)}\", is less likely than no answer)", best.passage, best.start, best.end,
                        speaker=speaker, answer_type=asked, confidence=math.exp(logp))
    return Grounded(best.text, "span", None, best.passage, best.start, best.end, speaker=speaker,
                    answer_type=asked, confidence=math.exp(logp))


def _completed(question: str, asked: str, found, texts: list[str]):
    """`found` read to the end of the phrase it cuts short (grounding.complete_phrase), moved to
    the table cell whose header the question names (grounding.table_cell), and a how-much amount
    with its currency and unit (grounding.complete_amount)."""
    text = texts[found.passage]
    start, end = found.start, grounding.complete_phrase(question, asked, text, found.start, found.end)
    start, end = grounding.table_cell(question, text, start, end)
    start, end = grounding.complete_amount(question, text, start, end)
    return found if (start, end) == (found.start, found.end) else replace(found, start=start, end=end, text=text[start:end])


def _typed_span(question: str, asked: str, spans: list, texts: list[str]):
    """The best span, or the best one of the asked type within TYPE_MARGIN of it: the reader ranks
    well, the type breaks near ties (a who-question is not answered by a town while a name is nearly
    as likely); with none that close, a phrase of the type inside one of the best spans
    (_typed_phrase_within). A person is named where a name is nearly as likely as a description ("Norton" over
    "an English lawyer", NAME_MARGIN below the description)."""
    if asked not in CHECKED_TYPES:
        return spans[0]
    kind, roles = grounding.tag_kind(question, asked), grounding.name_roles(texts)
    # the phrases of the type, each within its sentence (found in whole passages)
    typed = {p: [(a, grounding.within_sentence(text, a, b)) for a, b in grounding.typed_spans(text, kind, roles)]
             for p, text in enumerate(texts)}
    floor = math.log(spans[0].probability) - TYPE_MARGIN
    # of the type: a typed phrase makes up most of it ("Norton", "£ 4 a week", not a clause), or it
    # is part of a name ("Muriel" of "Muriel Stacy"; an amount's part is no amount)
    part_counts = kind in ("person", "place", "organisation")
    of_type = [f for f in spans if math.log(f.probability) >= floor and any(
        (f.start <= a and b <= f.end and 2 * (b - a) >= f.end - f.start) or (part_counts and a <= f.start and f.end <= b)
        for a, b in typed[f.passage])]
    if not of_type:
        return _typed_phrase_within(question, spans, texts, typed) or spans[0]
    if kind == "person" and not _named(of_type[0].text):
        named_floor = math.log(of_type[0].probability) - NAME_MARGIN
        return next((f for f in of_type if _named(f.text) and math.log(f.probability) >= named_floor), of_type[0])
    return of_type[0]


def _typed_phrase_within(question: str, spans: list, texts: list[str], typed: dict):
    """When no span of the type is nearly as likely as the best, the first phrase of the type that one
    of the reader's best spans holds ("Warsaw" in "during a lengthy visit to Warsaw, I made the
    acquaintance"), a name before other phrases; None when none holds one."""
    from evsel.models.reader.span_head import Found

    held = []
    for f in spans:
        for a, b in typed[f.passage]:
            phrase = texts[f.passage][a:b]
            if f.start <= a and b <= f.end and phrase and not grounding.echoes(question, phrase):
                held.append(Found(f.passage, a, b, phrase, f.probability))
    # a name first: "in the autumn" reads as a place to the rules, "Warsaw" is one
    return next((h for h in held if _named(h.text)), held[0] if held else None)


def _named(text: str) -> bool:
    """Every content word capitalised: a name ("Mr. Wolfshiem", "Norton"), not a description."""
    content = [w for w in grounding.words(text) if w.lower() not in grounding.STOPWORDS]
    return bool(content) and all(w[:1].isupper() for w in re.findall(r"\w[\w'\u2019-]*", text)
                                 if w.lower() not in grounding.STOPWORDS)


def _option_span(question: str, reading, texts: list[str]):
    """For a choice question, the option the reader finds likeliest where the passages name it."""
    from evsel.models.reader.span_head import Found

    hits = []
    for option in grounding.options(question):
        pattern = grounding.option_pattern(option)
        for p, text in enumerate(texts):
            for m in pattern.finditer(text):
                logp = reading.logp_of(p, m.start(), m.end())
                if logp is not None:
                    hits.append((logp, Found(p, m.start(), m.end(), text[m.start():m.end()], math.exp(logp))))
    return max(hits, key=lambda h: h[0])[1] if hits else None


def _reader_answer(backbone, reader, question: str, evidence: list, asked: str, dialogue: bool) -> Grounded:
    from evsel.models.reader.span_head import Reader

    if not isinstance(reader, Reader):
        return _lora_answer(backbone, reader, question, evidence, asked, dialogue)
    found, ranked, texts = _passages_read(question, evidence)
    if not ranked:
        return Grounded(None, "abstained", "no passage shares a content word with the question", answer_type=asked)
    reading = reader.reading(backbone, question, texts)
    chosen = _option_span(question, reading, texts)
    if chosen is not None:
        return Grounded(chosen.text, "span", None, chosen.passage, chosen.start, chosen.end,
                        speaker=_speaker_at(found, chosen), answer_type=asked, confidence=chosen.probability)
    candidates = candidate_spans(reading, question, asked, found, ranked)
    if not candidates:
        return Grounded(None, "abstained", "the passages hold no words to answer with", answer_type=asked)
    weights = reader.rescore_weights(asked)
    best = _completed(question, asked, max(candidates, key=lambda c: c.score(weights)), texts)
    speaker = _speaker_at(found, best)
    probability = math.exp(best.reader_logp)
    # the threshold was chosen on the head's best span (a span that only repeats the question aside)
    surest = max(math.exp(c.reader_logp) for c in candidates)
    if dialogue and surest < reader.threshold:
        return Grounded(None, "abstained", f"the reader is unsure of every answer in the passages "
                        f"(best {surest:.2f}, threshold {reader.threshold:.2f})", best.passage,
                        best.start, best.end, speaker=speaker, answer_type=asked, confidence=probability)
    return Grounded(best.text, "span", None, best.passage, best.start, best.end,
                    speaker=speaker, answer_type=asked, confidence=probability)


READER_TOP = 30  # the reader's best spans that compete with the typed phrases
SENTENCE_CANDIDATES = 3  # the best-matching sentences that compete as whole answers (the rules step's answer)
SUPPORT_DECAY = {1: 0.7, 2: 0.5}  # the support a sentence lends the one or two sentences after it
# a sentence further back still lends support (the decay of two back) while those between total at
# most this many words: short turns ("Married! When?" "Yesterday." "But to whom?") separate a
# question's words from its answer without separating the thought
SUPPORT_REACH_WORDS = 12
UNREAD_LOGP = -25.0  # a typed phrase no whole-token span of the reader covers


@dataclass
class Candidate:
    """An answer span with what the answer step weighs: the reader's log-probability, whether the
    rule tagger finds it of the asked type, how well its sentence (or the one or two before it, which
    the answer often follows) matches the question, how much of it only repeats the question, and
    its length in words."""

    passage: int
    start: int
    end: int
    text: str
    reader_logp: float
    typed: bool
    support: float
    repeats: float
    n_words: int
    sentence: bool = False  # one of the best-matching sentences, trimmed of the question's words

    def features(self) -> dict:
        return {"typed": float(self.typed), "support": self.support, "repeats": self.repeats,
                "long": float(max(0, self.n_words - LONG_ANSWER_WORDS)), "sentence": float(self.sentence)}

    def score(self, weights: dict) -> float:
        return max(self.reader_logp, UNREAD_LOGP) + sum(weights.get(k, 0.0) * v for k, v in self.features().items())


LONG_ANSWER_WORDS = 4  # words past this count against a span (weight chosen per answer type on dev)


def candidate_spans(reading, question: str, asked: str, found: list, ranked: list) -> list[Candidate]:
    """The reader's best spans and, for a phrase question, every phrase of the asked type in the
    passages (the type is a signal the weights weigh, not a gate)."""
    spans = {(f.passage, f.start, f.end) for f in reading.top(READER_TOP)}
    typed: set = set()
    if asked in grounding.ENTITY_TYPES:
        # a name the passages use as a place is no person, an amount of shares no sum of money
        kind, roles = grounding.tag_kind(question, asked), grounding.name_roles(reading.passages)
        for sentence in found:
            for a, b in grounding.typed_spans(sentence.text, kind, roles):
                typed.add((sentence.passage, sentence.start + a, sentence.start + b))
    spans |= typed
    trimmed = set()
    for score, sentence in ranked[:SENTENCE_CANDIDATES]:
        if score > 0:
            a, b = grounding.trim_to_answer(question, sentence.text)
            trimmed.add((sentence.passage, sentence.start + a, sentence.start + b))
    spans |= trimmed
    top = max(ranked[0][0], 1e-6)
    lexical = {id(s): max(0.0, score) / top for score, s in ranked}
    by_passage: dict[int, list] = {}
    for s in found:
        by_passage.setdefault(s.passage, []).append(s)
    support = _sentence_support(by_passage, lexical)
    asked_words = set(grounding.words(question))
    out = []
    for p, a, b in sorted(spans):
        text = reading.passages[p][a:b]
        said = grounding.words(text)
        if not said or grounding.echoes(question, text):  # an answer adds something to the question
            continue
        near = next((support[id(s)] for s in by_passage.get(p, [])
                     if s.start <= a < s.end or (s.start >= a and s.start < b)), 0.0)
        logp = reading.logp_of(p, a, b)
        content = [w for w in said if w not in grounding.STOPWORDS] or said
        out.append(Candidate(p, a, b, text, UNREAD_LOGP if logp is None else logp, (p, a, b) in typed, near,
                             sum(w in asked_words for w in content) / len(content), len(said), (p, a, b) in trimmed))
    return out


def _sentence_support(by_passage: dict, lexical: dict) -> dict[int, float]:
    """Per sentence (by id), once for all its spans: how well it, or a sentence before it in its
    passage, matches the question (SUPPORT_DECAY; further back while the sentences between total at
    most SUPPORT_REACH_WORDS words)."""
    out = {}
    for run in by_passage.values():
        sizes = [len(grounding.words(s.text)) for s in run]
        for i, s in enumerate(run):
            best, between = max(lexical[id(s)], 0.0), 0
            for k in range(1, i + 1):
                if k > 2 and between > SUPPORT_REACH_WORDS:
                    break
                best = max(best, SUPPORT_DECAY.get(k, SUPPORT_DECAY[2]) * lexical[id(run[i - k])])
                between += sizes[i - k]
            out[id(s)] = best
    return out


def _context(found: list, sentence: grounding.Sentence) -> list[grounding.Sentence]:
    """The sentence and those after it in its passage, up to CONTEXT_WORDS words:
    the answer often follows the sentence that repeats the question ("Irene Adler is married." /
    "When?" / "Yesterday." / "But to whom?" / "To an English lawyer named Norton.")."""
    i = found.index(sentence)
    out = [sentence]
    size = len(grounding.words(sentence.text))
    for after in found[i + 1: i + 9]:
        if after.passage != sentence.passage or size >= CONTEXT_WORDS:
            break
        out.append(after)
        size += len(grounding.words(after.text))
    return out


def _read(sentences: list[grounding.Sentence]) -> str:
    return " ".join((f"{s.speaker}: " if s.speaker else "") + _flat(s.text) for s in sentences)


def _flat(text: str) -> str:
    """Hard line wraps (a PDF's lines) as spaces: the LLM reads "Edwin\nMarsh" as two fragments."""
    return " ".join(text.split())


def _choose_sentence(scorer: "Scorer", question: str, found: list, pool: list) -> grounding.Sentence:
    """The supporting sentence among `pool` (lexical score, sentence; best first), re-scored by the
    LLM's likelihood of the question after reading each with what follows it."""
    weight = DIALOGUE_SENTENCE_LLM_WEIGHT if pool[0][1].speaker else SENTENCE_LLM_WEIGHT
    if not scorer.ready or len(pool) < 2 or weight == 0:
        return pool[0][1]
    likelihoods = scorer.question_likelihood(question, [_read(_context(found, s)) for _, s in pool])
    top = max(likelihoods)
    combined = [(score + weight * (ll - top), -i) for i, ((score, _), ll) in enumerate(zip(pool, likelihoods))]
    return pool[-max(combined)[1]][1]


_SPEECH = re.compile(r"(?:said|says|remarked|whispered|cried|asked|answered|replied|observed|continued|shouted|"
                     r"exclaimed|added|muttered|murmured|repeated|returned|began)\W*$", re.I)


def _names(found: list) -> set[str]:
    """Capitalised words seen inside a sentence, not only at its start: names, not sentence openers."""
    out = set()
    for s in found:
        for m in list(grounding.WORD.finditer(s.text))[1:]:
            if m.group()[0].isupper():
                out.add(m.group())
    return out


def _candidates(question: str, asked: str, context: list[grounding.Sentence], names: set[str] | None = None) -> list[tuple]:
    """(sentence, start, end) of the phrases of the asked type in `context` that add to the question.
    Names right after a speech verb ("remarked Holmes") only say who spoke: kept only when the
    question asks who said something. A capitalised word opening a sentence is a name only when
    `names` has it (the evidence capitalises it elsewhere too: "Threatens to send..." is not)."""
    about_speech = re.search(r"\b(?:say|said|tell|told|ask|asked|speak|spoke|call|called|remark|reply)", question, re.I)
    out = []
    for sentence in context:
        for a, b in grounding.typed_spans(sentence.text, asked):
            if grounding.echoes(question, sentence.text[a:b]):
                continue
            if not about_speech and _SPEECH.search(sentence.text[max(0, a - 20):a]):
                continue
            phrase = sentence.text[a:b]
            if names is not None and asked in ("person", "place", "organisation") and " " not in phrase \
                    and not sentence.text[:a].strip(grounding.OPENING) and phrase not in names:
                continue
            out.append((sentence, a, b))
    return out


def _typed_answer(scorer: "Scorer", question: str, asked: str, found: list, ranked: list) -> Grounded:
    """A phrase of the asked type: the supporting sentence is chosen among the best-ranked ones whose
    context holds a candidate of that type (the LLM re-scoring them), then the LLM picks the
    candidate; abstains when no sentence offers one."""
    offered = grounding.options(question)
    if offered:  # a choice question: the answer is one of its alternatives, where the evidence names it
        hits = []
        for option in offered:
            hit = next(((s, m.start(), m.end()) for _, s in ranked
                        for m in [re.search(re.escape(option), s.text, re.I)] if m), None)
            if hit is not None:
                hits.append(hit)
        if hits:
            best = ranked[0][1]
            context = _context(found, best)
            pick = 0
            if scorer.ready and len(hits) > 1:
                scores = scorer.answer_likelihood(question, _read(context), [_flat(s.text[a:b]) for s, a, b in hits])
                pick = max(range(len(hits)), key=lambda i: (scores[i], -i))
            sentence, a, b = hits[pick]
            return Grounded(sentence.text[a:b], "span", None, sentence.passage, sentence.start + a,
                            sentence.start + b, speaker=sentence.speaker)
    names = _names(found)
    pool = [(score, s) for score, s in ranked[:SENTENCE_POOL]
            if score > 0 and _candidates(question, asked, _context(found, s), names)]
    if not pool:
        best = ranked[0][1]
        return Grounded(None, "abstained", f"the supporting passage names no {TYPE_WORDS[asked]}",
                        best.passage, best.start, best.end)
    best = _choose_sentence(scorer, question, found, pool)
    context = _context(found, best)
    candidates = _candidates(question, asked, context, names)
    pick = 0
    if scorer.ready and len(candidates) > 1:
        scores = scorer.answer_likelihood(question, _read(context), [_flat(s.text[a:b]) for s, a, b in candidates])
        pick = max(range(len(candidates)), key=lambda i: (scores[i], -i))
    sentence, a, b = candidates[pick]
    return Grounded(sentence.text[a:b], "span", None, sentence.passage, sentence.start + a, sentence.start + b,
                    speaker=sentence.speaker)


class Scorer:
    """The LLM's log-likelihoods of texts after a prompt, in batches of one forward pass: how the
    answer step lets the model choose the sentence and the phrase without generating."""

    def __init__(self, backbone):
        self.backbone = backbone
        self.ready = all(hasattr(backbone, name) for name in ("model", "tokenizer", "chat_ids"))

    def _plain(self, text: str) -> list[int]:
        return self.backbone.tokenizer(text, add_special_tokens=False)["input_ids"]

    def continuation_logprobs(self, prefixes: list[list[int]], continuations: list[list[int]]) -> list[list[float]]:
        import torch

        model = self.backbone.model
        device = next(model.parameters()).device
        decoder, head = getattr(model, "model", None), getattr(model, "lm_head", None)
        out: list[list[float]] = []
        for first in range(0, len(prefixes), SCORE_BATCH):
            rows = [p + c for p, c in zip(prefixes[first:first + SCORE_BATCH], continuations[first:first + SCORE_BATCH])]
            width = max(map(len, rows))
            ids = torch.zeros((len(rows), width), dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, row in enumerate(rows):
                ids[i, : len(row)] = torch.tensor(row)
                mask[i, : len(row)] = 1
            with torch.inference_mode():
                if decoder is not None and head is not None:  # the vocabulary projection only where scored
                    hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
                else:
                    hidden = None
                    logits_all = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
                for i in range(len(rows)):
                    p = len(prefixes[first + i])
                    c = continuations[first + i]
                    where = torch.arange(p - 1, p - 1 + len(c), device=device)
                    logits = head(hidden[i, where]) if hidden is not None else logits_all[i, where]
                    logp = logits.float().log_softmax(-1)
                    out.append(logp[torch.arange(len(c), device=device), torch.tensor(c, device=device)].tolist())
        return out

    def question_likelihood(self, question: str, contexts: list[str]) -> list[float]:
        """Mean log-probability of the question's tokens after each context."""
        bos = [self.backbone.bos_id()]
        prefixes = [bos + self._plain(f"Passage: {c}\nQuestion:") for c in contexts]
        asked = self._plain(" " + question)
        scores = self.continuation_logprobs(prefixes, [asked] * len(contexts))
        return [sum(s) / len(s) for s in scores]

    def _answer_prefix(self, question: str, context: str) -> list[int]:
        messages = [{"role": "system", "content": SHORT_SYSTEM},
                    {"role": "user", "content": f"Passage: {context}\n\nQuestion: {question}"}]
        return self.backbone.chat_ids(messages)[0].tolist()

    def _end(self) -> list[int]:
        tok = self.backbone.tokenizer
        if self.backbone.has_chat_template() and tok.eos_token_id is not None:
            return [tok.eos_token_id]
        return self._plain("\n")[-1:]

    def answer_likelihood(self, question: str, context: str, phrases: list[str]) -> list[float]:
        """Log-probability of each phrase as the whole answer (its tokens and the end of the answer)."""
        prefix = self._answer_prefix(question, context)
        end = self._end()
        continuations = [self._plain(p) + end for p in phrases]
        return [sum(s) for s in self.continuation_logprobs([prefix] * len(phrases), continuations)]

    def yes_or_no(self, question: str, context: str) -> bool:
        """Yes when the model finds "Yes" likelier against "No" after the passage than after none."""
        with_passage = self.answer_likelihood(question, context, ["Yes", "No"])
        without = self.answer_likelihood(question, "", ["Yes", "No"])
        return (with_passage[0] - with_passage[1]) - (without[0] - without[1]) >= 0


def _same_turn(found: list, best: grounding.Sentence) -> list:
    """`best`, then the other sentences its speaker says in the same passage, nearest first: "Hi
    Maria!" can be the sentence that matches a when-question while "yesterday" ends the turn."""
    turn = [s for s in found if s.passage == best.passage and s.speaker == best.speaker and s is not best]
    return [best] + sorted(turn, key=lambda s: abs(s.start - best.start))


def _from_sentence(backbone, question: str, chunks: list, found: list, best: grounding.Sentence, style: str,
                   max_new_tokens: int) -> Grounded:
    names = {n for c in chunks for n in c.speakers}
    swap = grounding.speaker_swap(question, found, names, SPEAKER_MARGIN) if names else None
    if swap is not None:
        asked, said_by = swap
        return Grounded(None, "abstained", f"the passages say this of {said_by}, not {asked}",
                        best.passage, best.start, best.end)
    chunk = chunks[best.passage]
    if grounding.is_temporal(question) and chunk.speakers:
        said_on = grounding.parse_time(chunk.time_start)
        for sentence in _same_turn(found, best):
            found_time = grounding.resolve_time(sentence.text, said_on)
            if found_time is not None:
                phrase, a, b = found_time
                return Grounded(phrase, "date", None, sentence.passage, sentence.start + a, sentence.start + b,
                                speaker=sentence.speaker)
        if said_on is not None:
            return Grounded(grounding.show_date(said_on), "date", "the turn names no time: the day it was said",
                            best.passage, best.start, best.end)
    # prose: the trimmed sentence, no model; the generator reading it (its phrase kept when copied)
    # measured below it on FairytaleQA train (100 questions: F1 0.170 vs 0.180)
    if not best.speaker:
        a, b = grounding.trim_to_answer(question, best.text)
        return Grounded(best.text[a:b], "span", None, best.passage, best.start + a, best.start + b)
    out = backbone.generate(short_messages(question, best, chunk), max_new_tokens)
    phrase = grounding.clean_generated(out["text"])
    usage = {"prompt_tokens": out["prompt_tokens"], "generated_tokens": out["generated_tokens"]}
    low = phrase.lower()
    if any(marker in low for marker in _SAYS_NOTHING):
        return Grounded(None, "abstained", "the model finds no answer in the supporting passage",
                        best.passage, best.start, best.end, generated=phrase, **usage)
    score, a, b = grounding.snap(phrase, best.text)
    if score >= SNAP_AS_ANSWER or (style == "span" and score >= SNAP_AS_SUPPORT):
        return Grounded(best.text[a:b], "span", None, best.passage, best.start + a, best.start + b,
                        generated=phrase, **usage)
    if style == "span" or not phrase or not best.speaker:
        a, b = grounding.trim_to_answer(question, best.text)
        return Grounded(best.text[a:b], "span", None, best.passage, best.start + a, best.start + b,
                        generated=phrase, **usage)
    if score >= SNAP_AS_SUPPORT:
        return Grounded(phrase, "generated", None, best.passage, best.start + a, best.start + b,
                        generated=phrase, **usage)
    return Grounded(phrase, "generated", None, best.passage, best.start, best.end, generated=phrase, **usage)
