"""Text-side machinery of grounded answers: the evidence cut into sentences (turns, for
dialogues), the sentence that supports an answer, a generated phrase snapped back onto the exact
evidence text, relative dates resolved against a dialogue's timestamps, and the abstention checks.

Everything here is plain text and offsets, no model: `evsel.answer` runs the generator and
decides with these.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from itertools import pairwise

from .chunker import split_sentences

WORD = re.compile(r"\w+(?:['\u2019-]\w+)*")
STOPWORDS = frozenset(
    ["a", "an", "the", "of", "to", "in", "on", "at", "for", "and", "or", "nor", "is", "are", "was", "were", "be", "been", "being", "am", "do", "did", "does", "done", "what", "who", "whom", "whose", "when", "where", "why", "how", "which", "that", "this", "these", "those", "it", "its", "he", "she", "they", "them", "his", "her", "hers", "their", "theirs", "i", "me", "my", "mine", "you", "your", "yours", "we", "us", "our", "ours", "with", "by", "from", "as", "about", "into", "onto", "after", "before", "has", "have", "had", "not", "no", "will", "would", "can", "could", "should", "shall", "may", "might", "must", "so", "if", "then", "there", "here", "than", "very", "just", "also", "but", "too", "up", "out", "over", "any", "some", "all", "each", "every", "both", "more", "most", "other", "such", "only", "own", "same", "s", "t"]
)
_SPEAKER = re.compile(r"([^\n:]{1,60}):[ \t]")
_HEADER = re.compile(r"\s*===.*===\s*")


def words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text)]


def content_words(text: str) -> set[str]:
    return {w for w in words(text) if w not in STOPWORDS}


@dataclass(frozen=True)
class Sentence:
    """One sentence of one evidence passage; `start`/`end` are offsets into the passage text."""

    passage: int  # 0-based index into the evidence list given
    start: int
    end: int
    text: str
    speaker: str | None = None  # a dialogue turn's speaker


def sentences(passages: list) -> list[Sentence]:
    """The passages' sentences; in dialogues each turn's text (without the "Speaker: " label and
    without session headers) is split on its own, so no sentence spans two turns. Prose is split
    as a whole: its line breaks may be hard wraps inside a sentence."""
    out: list[Sentence] = []
    for index, chunk in enumerate(passages):
        text = chunk.text
        if not chunk.speakers:
            out += _split(index, text, 0, len(text), None)
            continue
        position = 0
        for line in text.splitlines(keepends=True):
            start, end = position, position + len(line)
            position = end
            if not line.strip() or _HEADER.fullmatch(line):
                continue
            speaker = None
            m = _SPEAKER.match(line)
            if m and m.group(1).strip() in chunk.speakers:
                speaker = m.group(1).strip()
                start += m.end()
            out += _split(index, text, start, end, speaker)
    return out


def _split(index: int, text: str, start: int, end: int, speaker: str | None) -> list[Sentence]:
    body = text[start:end]
    out = []
    for a, b in split_sentences(body):
        piece = body[a:b]
        lead = len(piece) - len(piece.lstrip())
        piece = piece.strip()
        if WORD.search(piece):
            out.append(Sentence(index, start + a + lead, start + a + lead + len(piece), piece, speaker))
    return out


def rank_sentences(question: str, found: list[Sentence], exclude: set[str] = frozenset(),
                   phrase_bonus: float = 0.0) -> list[tuple[float, Sentence]]:
    """Sentences by idf-weighted share of the question's content words they contain (idf over the
    sentences given), plus `phrase_bonus` per word pair of the question they repeat, a small
    tie-break for earlier-ranked passages. Best first."""
    asked = content_words(question) - exclude
    df: Counter = Counter()
    bags = [content_words(s.text) for s in found]
    for bag in bags:
        df.update(bag & asked)
    n = len(found)
    weight = {w: math.log(1 + n / (1 + df[w])) for w in asked}
    total = sum(weight.values()) or 1.0
    asked_pairs = _pairs(question) if phrase_bonus else set()
    scored = []
    for s, bag in zip(found, bags):
        score = sum(weight[w] for w in asked & bag) / total - 0.01 * s.passage
        if asked_pairs:
            score += phrase_bonus * len(asked_pairs & _pairs(s.text))
        scored.append((score, s))
    scored.sort(key=lambda pair: -pair[0])
    return scored


def _pairs(text: str) -> set[tuple[str, str]]:
    found = words(text)
    return set(pairwise(found))


def trim_to_answer(question: str, text: str) -> tuple[int, int]:
    """Offsets of `text` without the leading and trailing words that only repeat the question or
    are function words (the answer is what the sentence adds); the whole text if nothing is left."""
    asked = set(words(question)) | STOPWORDS
    found = list(WORD.finditer(text))
    i, j = 0, len(found)
    while i < j and found[i].group().lower() in asked:
        i += 1
    while j > i and found[j - 1].group().lower() in asked:
        j -= 1
    if i >= j:
        return 0, len(text)
    return found[i].start(), found[j - 1].end()


def support(question: str, sentence: Sentence) -> float:
    """Share of the question's content words the sentence holds (0..1)."""
    asked = content_words(question)
    return len(asked & content_words(sentence.text)) / len(asked) if asked else 0.0


# a generated phrase, snapped onto the evidence -------------------------------------------------------

_ANSWER_LEAD = re.compile(
    r"^\s*(?:the\s+)?(?:short\s+)?answer(?:\s+to\s+(?:this|the)\s+question)?\s*(?:is)?\s*[:\-]?\s*", re.IGNORECASE)


def clean_generated(text: str) -> str:
    """A generated answer without the boilerplate a small model wraps it in ("The answer is: ...",
    quotes, a trailing period)."""
    text = _ANSWER_LEAD.sub("", text.strip().splitlines()[0] if text.strip() else "")
    quotes = "\"'\u201c\u201d"
    return text.strip().rstrip(".").strip().strip(quotes).strip().rstrip(".").strip()


def _f1(a: list[str], b: list[str]) -> float:
    same = sum((Counter(a) & Counter(b)).values())
    if not same:
        return 0.0
    p, r = same / len(a), same / len(b)
    return 2 * p * r / (p + r)


def snap(phrase: str, text: str, max_words: int = 24) -> tuple[float, int, int]:
    """The stretch of `text` (whole words, at most `max_words`) closest to `phrase` by token F1:
    (f1, start, end) offsets into `text`; (0, 0, 0) when no word is shared."""
    target = words(phrase)
    spans = [(m.start(), m.end(), m.group().lower()) for m in WORD.finditer(text)]
    best = (0.0, 0, 0)
    if not target:
        return best
    wanted = set(target)
    for i, (start, _, w) in enumerate(spans):
        if w not in wanted:  # a best span starts and ends on shared words
            continue
        for j in range(i, min(len(spans), i + max_words)):
            if spans[j][2] not in wanted:
                continue
            score = _f1([s[2] for s in spans[i:j + 1]], target)
            if score > best[0] + 1e-9:
                best = (score, start, spans[j][1])
    return best


# dates: relative expressions in a dialogue turn resolved against its session's time -----------------

_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december"]
_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "a couple of": 2, "a few": 3, "few": 3, "couple of": 2}
_WEEKDAY_RE = r"(mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun)(?:day|nesday|rsday|urday|sday)?\.?"
_MONTH_RE = r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|" \
            r"oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
_RELATIVE = re.compile(
    r"\b(?:(?P<yesterday>yesterday|last night)|(?P<today>today|tonight|this morning|this afternoon|"
    r"this evening|earlier today|just now)|(?P<tomorrow>tomorrow)|"
    r"last (?P<unit>week(?:end)?|month|year|summer|winter|spring|fall|autumn)|"
    rf"(?P<lastday>last|this past) {_WEEKDAY_RE}|"
    r"(?P<count>\d+|a couple of|couple of|a few|few|an?|one|two|three|four|five|six|seven|eight|nine|ten)"
    r" (?P<ago>day|week|month|year)s? ago|"
    rf"(?P<daymonth>\d{{1,2}})(?:st|nd|rd|th)? (?:of )?{_MONTH_RE}(?:,? (?P<y1>\d{{4}}))?|"
    rf"{_MONTH_RE.replace('(', '(?P<month>', 1)} (?P<monthday>\d{{1,2}})(?:st|nd|rd|th)?(?:,? (?P<y2>\d{{4}}))?|"
    r"(?:in |since )?(?P<year>(?:19|20)\d\d))\b",
    re.IGNORECASE,
)
_TIME_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %B %Y", "%d %B, %Y", "%d %B %Y", "%B %d, %Y",
                 "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d")
_TEMPORAL_QUESTION = re.compile(
    r"^\s*(?:when\b|what (?:year|month|date|day|time)\b|which (?:year|month|day)\b|how long ago\b|"
    r"in what (?:year|month)\b|on what (?:date|day)\b)", re.IGNORECASE)


def is_temporal(question: str) -> bool:
    return bool(_TEMPORAL_QUESTION.search(question))


def parse_time(value: str | None) -> date | None:
    """A session timestamp as written by the dialogue parsers ("8:56 pm on 20 July, 2023",
    ISO dates, ...), or None."""
    if not value:
        return None
    value = " ".join(value.replace("Z", "").split())
    for fmt in _TIME_FORMATS:
        try:
            return datetime.strptime(value, fmt).date()
        except ValueError:
            continue
    try:
        return datetime.fromisoformat(value).date()
    except ValueError:
        return None


def show_date(day: date) -> str:
    return f"{day.day} {_MONTHS[day.month - 1].capitalize()} {day.year}"


def _month_number(name: str) -> int:
    name = name.lower()[:3]
    return next(i for i, m in enumerate(_MONTHS, 1) if m.startswith(name))


def resolve_time(text: str, said_on: date | None) -> tuple[str, int, int] | None:
    """The first time expression of `text` as a date phrase ("7 May 2023", "the week before 9 June
    2023", "2022"), with its offsets in `text`; relative ones need `said_on` (the session's day)."""
    for m in _RELATIVE.finditer(text):
        g = m.groupdict()
        phrase = None
        if g["year"]:
            phrase = g["year"]
        elif g["daymonth"]:
            year = g["y1"] or (said_on.year if said_on else None)
            month = _month_number(m.group(m.re.groupindex["daymonth"] + 1))
            phrase = f"{int(g['daymonth'])} {_MONTHS[month - 1].capitalize()}" + (f" {year}" if year else "")
        elif g["month"]:
            year = g["y2"] or (said_on.year if said_on else None)
            month = _month_number(g["month"])
            phrase = f"{int(g['monthday'])} {_MONTHS[month - 1].capitalize()}" + (f" {year}" if year else "")
        elif said_on is None:
            continue
        elif g["yesterday"]:
            phrase = show_date(said_on - timedelta(days=1))
        elif g["today"]:
            phrase = show_date(said_on)
        elif g["tomorrow"]:
            phrase = show_date(said_on + timedelta(days=1))
        elif g["unit"]:
            unit = g["unit"].lower()
            phrase = str(said_on.year - 1) if unit == "year" else f"the {unit} before {show_date(said_on)}"
        elif g["lastday"]:
            day = next(d for d in _WEEKDAYS if d.startswith(m.group(m.re.groupindex["lastday"] + 1).lower()[:3]))
            phrase = f"the {day.capitalize()} before {show_date(said_on)}"
        elif g["ago"]:
            count = g["count"].lower()
            n = int(count) if count.isdigit() else _NUMBERS.get(count, 1)
            unit = g["ago"].lower()
            if unit == "year":
                phrase = str(said_on.year - n)
            elif unit == "day":
                phrase = show_date(said_on - timedelta(days=n))
            else:
                phrase = f"{n} {unit}{'s' if n > 1 else ''} before {show_date(said_on)}"
        if phrase:
            return phrase, m.start(), m.end()
    return None


# abstention: a dialogue question about one speaker answered by another's words ---------------------

def speaker_swap(question: str, found: list[Sentence], names: set[str], margin: float) -> tuple[str, str] | None:
    """(asked, said_by) when the question names exactly one speaker and another speaker's turns match
    it better by more than `margin` (idf-weighted share of the question's other content words) than
    any of the named one's: the passages say it of someone else, so the answer would be invented."""
    asked = [n for n in names if re.search(r"\b" + re.escape(n) + r"\b", question)]
    if len(asked) != 1 or not any(s.speaker for s in found):
        return None
    name = asked[0]
    exclude = {w.lower() for n in names for w in WORD.findall(n)}
    ranked = rank_sentences(question, [s for s in found if s.speaker], exclude)
    best_named = max((score for score, s in ranked if s.speaker == name), default=0.0)
    best_other, other = max(((score, s.speaker) for score, s in ranked if s.speaker != name),
                            default=(0.0, None))
    if other is not None and best_other - best_named > margin:
        return name, other
    return None
