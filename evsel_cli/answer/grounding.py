"""Text-side machinery of grounded answers: the evidence cut into sentences (turns, for
dialogues), the sentence that supports an answer, a generated phrase snapped back onto the exact
evidence text, relative dates resolved against a dialogue's timestamps, and the abstention checks.

Everything here is plain text and offsets, no model: `evsel.answer.step` runs the generator and
decides with these.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from itertools import pairwise

from ..store.bm25_index import stem
from ..ingest.chunker import split_sentences

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


def matching_words(text: str) -> set[str]:
    """Content words as a question is matched against a sentence: by BM25's stems, so "married"
    matches "marry" and "paid" stays "paid"."""
    return {stem(w) for w in content_words(text)}


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
    asked = matching_words(question) - {stem(w) for w in exclude}
    df: Counter = Counter()
    bags = [matching_words(s.text) for s in found]
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
    asked = matching_words(question)
    return len(asked & matching_words(sentence.text)) / len(asked) if asked else 0.0


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


# answer types: what kind of phrase a question asks for, and the evidence spans of that kind ------------

ANSWER_TYPES = ("person", "place", "number", "date", "organisation", "thing", "yesno", "description")
ENTITY_TYPES = ("person", "place", "number", "date", "organisation", "thing")  # answered with a phrase
_AUX = r"(?:is|are|was|were|do|does|did|can|could|will|would|has|have|had|should|shall|may|might|must|isn't|" \
       r"aren't|wasn't|weren't|don't|doesn't|didn't)"
_WHAT = r"(?:what|which|in what|in which|on what|at what|at which|to what|to which|of what|of which|from what|" \
        r"from which)"
_PERSON_NOUNS = r"(?:person|man|woman|boy|girl|men|women|people|actor|actress|author|writer|poet|singer|" \
                r"musician|player|king|queen|prince|princess|president|director|character|artist|painter|" \
                r"composer|son|daughter|father|mother|brother|sister|wife|husband|child|friend|leader|founder|" \
                r"member|politician|scientist|doctor|lawyer|owner|creator|producer|coach|captain|emperor|" \
                r"ruler|saint|god|goddess|family|maid|servant|teacher|governess|nurse|cook|butler|housekeeper|" \
                r"clerk|assistant|banker|editor|partner|lover|suitor|companion|landlord|landlady|heir|heiress|" \
                r"detective|inspector|officer|sergeant|soldier|sailor|uncle|aunt|cousin|nephew|niece|baby|" \
                r"grandfather|grandmother|neighbou?r|guest|visitor|client|employer|chaperone|proprietor|attendant)"
_PLACE_NOUNS = r"(?:place|city|town|country|state|county|province|region|continent|location|island|river|" \
               r"mountain|village|street|area|nation|capital|district|neighbou?rhood|building|venue|stadium|" \
               r"lake|sea|ocean|park|room|house|castle|land|kingdom|borough|municipality|port|hotel|inn|" \
               r"square|road|lodge|hall|estate|farm|cottage|villa|manor|shop|restaurant|county)"
_ORG_NOUNS = r"(?:company|organi[sz]ation|band|group|team|club|newspaper|paper|magazine|bank|university|college|school|" \
             r"party|network|channel|label|film|movie|book|novel|album|song|show|series|game|play|opera|" \
             r"brand|airline|firm|agency|institution|association|league|title|publication|station|church|" \
             r"society|corporation|army|ship|journal|newspapers|record label|tv show|television series)"
_NUMBER_NOUNS = r"(?:number|amount|percentage|percent|price|cost|age|population|size|length|height|distance|" \
                r"sum|salary|wage|fee|rate|capacity|score|total|weight|area|quantity)"
_DATE_NOUNS = r"(?:year|date|day|month|time|century|decade|season|period|era|age of)"
# (type, pattern): the earliest match in the question decides, ties by this order
_TYPE_RULES = [
    ("yesno", re.compile(rf"^\s*{_AUX}\b(?!.*\b(?:who|whom|what|which|where|when|why|how)\b)", re.I)),
    ("description", re.compile(r"\b(?:why|how come|for what reason|what (?:caused|made|led)|what\b[^?]*\bhappen|"
                               r"what (?:did|does|do|will|would) [^?]*?\b(?:say|tell|think|decide|promise|suggest)\b|"
                               r"what (?:did|does|do|will|would|could|can) [^?]*?\bdo\b|how (?:did|does|do|is|was|"
                               r"were|are|can|could|would|will|should|has|have|had) [^?]*?\bfeel|"
                               r"what (?:is|was|are|were) [^?]* like\b|describe\b)", re.I)),
    ("date", re.compile(rf"\b(?:when|how long ago|{_WHAT} {_DATE_NOUNS}s?\b|what time)", re.I)),
    ("number", re.compile(rf"\b(?:how (?:many|much|long|old|far|tall|big|large|high|often|deep|wide|heavy|"
                          rf"fast|late|early)|{_WHAT} (?:(?:is|was) the )?{_NUMBER_NOUNS}\b)", re.I)),
    ("place", re.compile(rf"\b(?:where|{_WHAT} (?:\w+ )?{_PLACE_NOUNS}\b)", re.I)),
    ("organisation", re.compile(rf"\b(?:{_WHAT} (?:\w+ )?{_ORG_NOUNS}\b|what is the name of the {_ORG_NOUNS})", re.I)),
    ("person", re.compile(rf"\b(?:who|whom|whose|{_WHAT} (?:\w+ )?{_PERSON_NOUNS}\b|what (?:is|was) (?:his|her|"
                          rf"their|the \w+'s|\w+(?:'s|\u2019s)) (?:real |full |first |last |maiden |christian |"
                          rf"middle |own )*name|what (?:is|was) the (?:real |full |first |last |maiden |christian )+name of|"
                          rf"(?:what (?:is|was) the )?name of (?:[A-Z][\w.]*\s)*[A-Z]\w*(?:'s|\u2019s) (?:\w+ )?{_PERSON_NOUNS}\b|(?:what (?:is|was) )?the name of the (?:\w+ )?{_PERSON_NOUNS}\b|"
                          rf"under what name)", re.I)),
    ("description", re.compile(r"\bhow\b", re.I)),
    ("thing", re.compile(r"\b(?:what|which)\b", re.I)),
]


def answer_type(question: str) -> str:
    """What the question asks for (one of ANSWER_TYPES), from its question words: the earliest
    matching wh-phrase decides ("..., an Earl of which location?" asks for a place), the longer of
    two that start together ("which hotel attendant" asks for a person, not "which hotel")."""
    best = ("thing", len(question) + 1, 0, len(_TYPE_RULES))
    for order, (kind, pattern) in enumerate(_TYPE_RULES):
        m = pattern.search(question)
        if m and (m.start(), -len(m.group()), order) < best[1:]:
            best = (kind, m.start(), -len(m.group()), order)
    return best[0]


def options(question: str) -> list[str]:
    """The alternatives a choice question offers ("Which is older, X or Y?"), else []."""
    tail = re.split(r"[,:;]", question.rstrip(" ?"))[-1]
    if " or " not in tail:
        return []
    tail = re.sub(rf"^\s*(?:{_AUX}|who|which|what)\b[^A-Z0-9\"]*", "", tail)
    parts = [p.strip(" \"'") for p in re.split(r"\s+or\s+", tail)]
    if len(parts) != 2 or not all(parts):
        return []
    # "John live close to a beach or the mountains": the first option is as long as the second
    left, right = parts[0].split(), parts[1].split()
    return [" ".join(left[-len(right):]) if len(left) > len(right) + 1 else parts[0], parts[1]]


def option_pattern(option: str) -> re.Pattern:
    """Where a passage names an option: its words without a leading article, each word's plural or
    singular ("the mountains" is named by "mountain climbing")."""
    named = re.sub(r"^(?:the|a|an)\s+", "", option.strip(), flags=re.I)
    words = [re.escape(w[:-1]) + "s?" if len(w) > 3 and w.lower().endswith("s") else re.escape(w) + "s?"
             for w in named.split()]
    return re.compile(r"(?<!\w)" + r"\s+".join(words) + r"(?!\w)", re.I)


# a capitalised word of a name: a full stop belongs to it only when it is an initial or a title
# ("Mr. John Turner", "T. J. Eckleburg"); after any other word it ends the sentence ("in Herefordshire. The")
_ABBREVIATION = r"(?:[A-Z]|Mr|Mrs|Ms|Mme|Mlle|Dr|St|Mt|Jr|Sr|Messrs|Col|Capt|Gen|Lt|Sgt|Rev|Prof|Hon|Gov)\."
_NAME_WORD = rf"(?:{_ABBREVIATION}|[A-Z][\w'\u2019&-]*)"
_CAP_WORD = rf"(?:{_NAME_WORD}|\d+(?:st|nd|rd|th)?)"
_NAME = re.compile(rf"{_NAME_WORD}(?:\s+(?:(?:de|da|du|van|von|der|del|la|le|y)\s+)*{_CAP_WORD})*")
_TITLE = re.compile(rf"{_NAME_WORD}(?:\s+(?:(?:of|the|de|da|du|van|von|der|del|la|le|y|and|&|for|on|in)\s+)*"
                    rf"{_CAP_WORD})*")
_NUMBER_WORDS = r"(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|" \
                r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|" \
                r"hundred|thousand|million|billion|half|dozen|score|a hundred|a thousand|a dozen)"
_UNIT = r"(?:pounds?|shillings?|pence|guineas?|dollars?|cents?|euros?|francs?|crowns?|marks?|[a-z]+s|" \
        r"percent|per cent|%|years?|months?|weeks?|days?|hours?|minutes?|miles?|feet|foot|inches|metres?|" \
        r"meters?|km|kilometres?|kilometers?|acres?|tons?|people|times)\b"
_AMOUNT = re.compile(
    rf"(?:[$£€¥]\s?\d+(?:[,.]\d+)*(?:\s+(?:million|billion|thousand|hundred))?|\d+(?:[,.]\d+)*(?:\s*(?:%|million|billion|"
    rf"thousand|hundred))?|\b{_NUMBER_WORDS}(?:[\s-]+(?:and\s+)?{_NUMBER_WORDS})*)"
    rf"(?:\s+{_UNIT}(?:\s+(?:a|an|per|each|every)\s+(?:week|day|month|year|hour|annum))?)?", re.I)
_DATE = re.compile(
    rf"\b(?:(?:\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH_RE}\.?(?:,?\s+\d{{3,4}})?)|"
    rf"(?:{_MONTH_RE}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{3,4}})?)|(?:{_MONTH_RE}\.?\s+(?:of\s+)?\d{{4}})|"
    rf"(?:(?:early|late|mid|the)\s+)?(?<![\d,.])\d{{3,4}}s?|\d{{1,2}}(?:st|nd|rd|th)\s+century|{_WEEKDAY_RE}|"
    rf"(?:january|february|march|april|june|july|august|september|october|november|december)|"
    rf"\d{{1,2}}:\d\d(?:\s*[ap]\.?m\.?)?|(?:half|a quarter|quarter|\w+ minutes) (?:past|to) (?:one|two|three|four|five|six|seven|"
    rf"eight|nine|ten|eleven|twelve)|\w+ o['\u2019]clock|midnight|noon|"
    rf"dawn|dusk|\d{{1,2}}\s*(?:o['\u2019]clock|[ap]\.?m\.?)|(?:yesterday|today|tomorrow|"
    rf"last (?:night|week|month|year|summer|winter|spring|autumn|fall)|(?:in the )?(?:morning|evening|afternoon|night)|"
    rf"(?:\w+ )?(?:days?|weeks?|months?|years?) (?:ago|later|before|after)))\b", re.I)
_LOCATIVE = re.compile(r"\b(?:in|at|to|from|into|near|inside|outside|under|behind|on|towards|across|beside|"
                       r"through)\s+(?:(?:the|a|an|his|her|their|my|our|its|your)\s+)?", re.I)
# what follows "in", "at", "on" without being a place: a time ("in the autumn of last year"), a manner
_NO_PLACE = frozenset(
    "autumn winter summer fall season time times moment meantime while end beginning middle course case fact "
    "order way manner hope fear turn spite view future past present least last once first instant hurry silence "
    "vain earnest particular general short sum addition return answer reply".split())
_PERSON_HEADS = frozenset(
    "man woman men women boy girl child children gentleman lady king queen prince princess knight soldier hunter "
    "farmer peasant fisherman merchant servant maid shepherd priest monk witch wizard giant dwarf fairy stranger "
    "father mother son daughter brother sister wife husband uncle aunt friend lawyer doctor clerk captain master "
    "mistress widow nurse teacher student writer author actor actress singer player president governor".split())
_QUOTED = re.compile(r"[\"\u201c]([^\"\u201d]{2,80})[\"\u201d]")
_LIKELY_VERB = re.compile(r"[a-z]+(?:ed|ing)|said|says|went|came|told|made|got|took|gave|saw|knew|thought|"
                          r"found|left|became|began|felt|kept|put|ran|sat|stood|brought|heard|held|let|meant|"
                          r"met|paid|sent|set|spoke|wrote|married|lived|died|born")
OPENING = " \t\n\"'\u201c\u2018([*_-"
_SENTENCE_STARTERS = STOPWORDS | {"but", "and", "yet", "now", "then", "when", "while", "after", "although", "though",
                                  "because", "since", "yes", "oh", "well", "still", "once", "perhaps", "indeed", "everyone",
                                  "everybody", "everything", "someone", "somebody", "something", "nobody", "nothing",
                                  "none", "one", "many", "few", "several", "later", "soon", "meanwhile", "instead",
                                  "however", "suddenly", "finally", "thus", "therefore", "let", "please", "thank",
                                  "thanks", "sure", "hey", "hi", "hello", "wow", "ah", "aye", "sir", "madam", "mrs",
                                  "mr", "dear", "good", "great", "nice", "like", "even", "why", "let's", "i'm", "i've",
                                  "i'll", "i'd", "it's", "that's", "there's", "we're", "you're", "don't", "didn't"}


# how the passages use a name: a title before it or a verb of speech after it makes a person of
# it; a locative preposition before it, a place
_PERSON_BEFORE = re.compile(r"\b(?:Mr|Mrs|Miss|Ms|Dr|Sir|Lady|Lord|Aunt|Uncle|Captain|Colonel|Major|Professor|"
                            r"Madame|Mademoiselle|Monsieur|Mister|Master|Mistress|Signor|Herr|Frau)\.?\s+$")
_PERSON_AFTER = re.compile(r"^,?\s+(?:said|says|asked|asks|replied|cried|answered|exclaimed|whispered|laughed|"
                           r"smiled|nodded|sighed|shouted|thought|wrote|told|married|herself|himself)\b")
_SAID_BEFORE = re.compile(r"\b(?:said|says|asked|replied|cried|answered|exclaimed|whispered|thought)\s+$")
_PLACE_BEFORE = re.compile(r"\b(?:in|at|into|near|towards?|across|through|within|outside|inside|beyond|"
                           r"(?:went|go|going|gone|come|came|coming|drove|walked|travelled|traveled|moved|returned|"
                           r"sailed|back|way|road|journey|trip|visit|visits|visited|visiting|arrived|arrive|fled|"
                           r"escaped|rode|ran|flew|emigrated|headed|bound|sent|letter|train|boat|ship|coach|"
                           r"removed|gone back|set off|started) (?:to|from|for))\s+$", re.I)
_PLACE_HEADS = frozenset(
    "street road lane avenue square lodge hall house manor castle abbey church chapel bank hotel inn station river "
    "lake sea ocean island bay hill hills mountain mountains valley park town city village county court gardens "
    "place college school university academy hospital asylum farm cottage bridge harbour harbor port point cove "
    "creek wood woods forest gables".split())
_MONEY_QUESTION = re.compile(
    r"\bhow much (?:money|cash|\w+ (?:a|per|each) (?:year|week|month|day)|[^?]*\b(?:pay|paid|earn|earned|cost|costs|"
    r"charge|charged|sell|sold|buy|bought|offer|offered|owe|owed|lose|lost|win|won|receive|received|get|got|give|gave|"
    r"spend|spent|worth|salary|price|fee|rent|wage|wages|income|revenue)\b)|\bwhat (?:was|is|were|are) the "
    r"(?:price|cost|fee|salary|wage|rent|income|revenue|fine|reward)\b", re.I)
_MONEY = re.compile(r"[$£€¥]|\b(?:pounds?|shillings?|pence|guineas?|dollars?|cents?|euros?|francs?|crowns?|"
                    r"sovereigns?|marks?|rupees?|yen|usd|gbp|eur)\b", re.I)


# a nationality is no person or place ("an English lawyer named Norton")
_NATIONALITY = re.compile(
    r"(?:English|French|German|Dutch|Irish|Scotch|Scottish|Welsh|British|American|Italian|Spanish|Portuguese|"
    r"Russian|Polish|Greek|Swiss|Swedish|Danish|Norwegian|Chinese|Japanese|Indian|African|European|Canadian|"
    r"Australian|Mexican|Turkish|Persian|Egyptian|Austrian|Hungarian|Bohemian|Roman|Jewish|Christian|Catholic|"
    r"Protestant|Englishman|Frenchman|Englishwoman|Frenchwoman|Yankee)")


def tag_kind(question: str, asked: str) -> str:
    """The kind of phrase the tagger looks for: `money` for a how-much question about money (an amount
    with its currency, not "73.5 million shares"), else what the question asks for."""
    return "money" if asked == "number" and _MONEY_QUESTION.search(question) else asked


def _starts_sentence(name: str, first: re.Match) -> bool:
    """Is a name's first word only capitalised as a sentence's first ("In", "Well", "Mr."), not an
    initial ("T. J. Eckleburg")?"""
    initial = len(first.group()) == 1 and name[first.end():first.end() + 1] == "." and first.group().isupper()
    return first.group().lower().replace("\u2019", "'") in _SENTENCE_STARTERS and not initial


def name_roles(texts: list[str]) -> dict[str, str]:
    """Per capitalised name in the passages, "person" or "place" where the passages' own use of it
    says so more often one way than the other (a name used both ways, or with no cue, is left out)."""
    votes: dict[str, Counter] = {}
    for text in texts:
        for m in _NAME.finditer(text):
            start, name = m.start(), re.split(r"[.!?]\s", m.group())[0].rstrip(".,'\u2019-&")
            first = WORD.match(name)
            while first and _starts_sentence(name, first):  # "In Marysville"
                rest = name[first.end():].lstrip(". ")
                start, name = start + len(name) - len(rest), rest
                first = WORD.match(name)
            if not name:
                continue
            before, after = text[max(0, start - 40):start], text[start + len(name):start + len(name) + 30]
            person = _PERSON_BEFORE.search(before) or _PERSON_AFTER.match(after) or _SAID_BEFORE.search(before) \
                or _PERSON_BEFORE.search(name.split()[0] + " ")
            for key in {name, name.split()[-1]} if person and " " in name else {name}:
                tally = votes.setdefault(key, Counter())
                tally["person"] += bool(person)
                tally["place"] += bool(_PLACE_BEFORE.search(before)) or name.split()[-1].lower() in _PLACE_HEADS
    return {name: role for name, tally in votes.items()
            for role, other in (("person", "place"), ("place", "person")) if tally[role] > tally[other]}


_CLAUSE_BREAK = re.compile(r"[.!?;:,\u2014\u201c\u201d\"()]")


def typed_spans(text: str, kind: str, roles: dict[str, str] | None = None) -> list[tuple[int, int]]:
    """Spans of `text` that could answer a question of type `kind`: names (capitalised runs) for
    people, places and organisations (and quoted titles), amounts and numbers (`money`: amounts with
    a currency), dates and times, noun-phrase-like runs of content words for things. Plain rules, no
    tagger; with `roles` (name_roles of the passages), a name the passages use as a place is no
    person and one they use as a person no place, and a nationality neither."""
    if kind == "money":
        return [(a, b) for a, b in typed_spans(text, "number") if _MONEY.search(text[a:b])]
    if roles is not None and kind in ("person", "place"):
        other = "place" if kind == "person" else "person"
        return [(a, b) for a, b in typed_spans(text, kind)
                if roles.get(text[a:b]) != other and not (kind == "person" and _is_place_name(text[a:b]))
                and not _NATIONALITY.fullmatch(text[a:b])
                and not (kind == "place" and _unplaced_name(text, a, b, roles))]
    spans: list[tuple[int, int]] = []
    if kind in ("person", "place", "organisation", "thing"):
        found = list(_NAME.finditer(text)) + ([] if kind == "person" else list(_TITLE.finditer(text)))
        for m in found:
            a, b = m.start(), m.end()
            piece = text[a:b]
            first = WORD.match(piece)
            # a sentence's first word is capitalised anyway: drop it when it is a function word
            while first and _starts_sentence(piece, first):
                rest = piece[first.end():].lstrip(". ")
                a, piece = b - len(rest), rest
                first = WORD.match(piece) if piece and piece[0].isupper() else None
                if first is None:
                    piece = ""
            piece = piece.rstrip(".,'\u2019-&")
            if not text[:a].strip(OPENING) and " " not in piece and len(piece) > 5 \
                    and re.fullmatch(r"[a-z]+(?:ed|ing)", piece.lower()):  # "Married! When?" opens with a verb
                continue
            if piece and not (kind == "person" and piece.lower() in ("i", "god")):
                if not _DATE.match(piece):
                    spans.append((a, a + len(piece)))
        if kind in ("organisation", "thing"):
            spans += [(m.start(1), m.end(1)) for m in _QUOTED.finditer(text)]
    if kind == "place":  # lower-case places follow a preposition: "went to the kitchen"
        for m in _LOCATIVE.finditer(text):
            run = [w for w in WORD.finditer(text, m.end()) if w.start() < m.end() + 40][:3]
            kept = []
            for w in run:
                if w.group().lower() in STOPWORDS or (kept and w.start() - kept[-1].end() > 1):
                    break
                kept.append(w)
            infinitive = m.group().lower().strip() == "to" and not kept[0].group()[0].isupper() if kept else False
            if kept and not infinitive and not _LIKELY_VERB.fullmatch(kept[-1].group()) \
                    and kept[0].group().lower() not in _NO_PLACE \
                    and not _DATE.match(text, kept[0].start()) and not _AMOUNT.match(text, kept[0].start()):
                spans.append((kept[0].start(), kept[-1].end()))
    if kind == "number":
        spans += [(m.start(), m.end()) for m in _AMOUNT.finditer(text) if m.group().strip()]
        spans = [(a, b) for a, b in spans if text[a:b].strip().lower() not in ("a", "an", "one", "score")]
    if kind == "date":
        spans += [(m.start(), m.end()) for m in _DATE.finditer(text)]
    if kind in ("thing", "person"):
        tokens = list(WORD.finditer(text))
        run: list = []
        for m in tokens + [None]:
            content = m is not None and m.group().lower() not in STOPWORDS and not m.group().isupper()
            # a phrase stays within its clause: "Mr. John Turner. Doctor T. J." holds no "Turner. Doctor"
            if content and not (run and _CLAUSE_BREAK.search(text, run[-1].end(), m.start())):
                run.append(m)
                continue
            for i, head in enumerate(run if kind == "person" else ()):  # "a gentleman", "an old man"
                if head.group().lower() in _PERSON_HEADS:
                    spans += [(run[j].start(), head.end()) for j in range(max(0, i - 1), i + 1)]
            for size in range(1, min(3, len(run)) + 1) if kind == "thing" else ():  # a noun phrase's head
                if size > 1 or not _LIKELY_VERB.fullmatch(run[-1].group()):
                    spans.append((run[-size].start(), run[-1].end()))
            run = [m] if content else []
    seen, out = set(), []
    for a, b in spans:
        a, b = _trim_span(text, a, b)
        if b > a and (a, b) not in seen:
            seen.add((a, b))
            out.append((a, b))
    return out


# where a phrase found in a whole passage ends its sentence: a full stop after a word (not an
# initial or a title: "T. J. Eckleburg", "Mrs. Hammond") or a paragraph break
_SENTENCE_END = re.compile(r"(?<!\bMr)(?<!\bMrs)(?<!\bMs)(?<!\bDr)(?<!\bSt)(?<!\bMt)(?<!\b[A-Z])[.!?](?=\s)|\n\s*\n")


# a name read on through "of" ("the White Way of Delight", "the Countess of Morcar"), no further
_FULL_NAME = re.compile(rf"{_NAME_WORD}(?:\s+(?:of\s+(?:the\s+)?)?{_CAP_WORD})*")
_HOW_MANY = re.compile(r"\bhow many\s+((?:[\w'\u2019-]+\s+){0,3})", re.I)


def complete_phrase(question: str, asked: str, text: str, a: int, b: int) -> int:
    """The end of an answer text[a:b] that stops short of its phrase: a name it cuts ("the White
    Way" of "the White Way of Delight") is read to its end, and the count of a how-many question
    takes the counted noun the question names ("eight" -> "eight children")."""
    if asked == "number":
        counted = _HOW_MANY.search(question)
        asked_words = set(words(counted.group(1))) if counted else set()
        end = b
        for m in WORD.finditer(text, b):
            if text[end:m.start()].strip() or m.group().lower() not in asked_words - STOPWORDS:
                break
            end = m.end()
        return end
    if asked in ("person", "place", "organisation", "thing") and text[a:b].split() \
            and text[a:b].split()[-1][:1].isupper():
        for m in _FULL_NAME.finditer(text, a):
            if m.start() >= b:
                break
            if m.start() < b < m.end():
                end = within_sentence(text, a, m.end())
                return end - 2 if text[end - 2:end] in ("'s", "\u2019s") and end - 2 >= b else end
    return b


_HOW_MUCH = re.compile(r"\bhow much\b|\bwhat (?:was|is|were|are) (?:the |its |their |[\w.&-]+['\u2019]s )?(?:total )?(?:price|cost|amount|"
                       r"value|sum|fee|salary|wage|rent|income|revenue|net sales|sales|profit|loss)\b", re.I)


def complete_amount(question: str, text: str, a: int, b: int) -> tuple[int, int]:
    """A how-much answer with its unit: the amount text[a:b] is part of, currency and scale
    included ("14,544" -> "$14,544 million", "fifty" -> "fifty cents"); else (a, b)."""
    if not _HOW_MUCH.search(question):
        return a, b
    for m in _AMOUNT.finditer(text, max(0, a - 4), min(len(text), b + 60)):
        if m.start() <= a and b <= m.end() and (m.start(), m.end()) != (a, b):
            return _trim_span(text, m.start(), m.end())
        if m.start() > b:
            break
    return a, b


_TABLE_CELL = re.compile(r"\|\s*([^|:\n]+?):\s*([^|\n]*?)\s*(?=\||$)", re.M)


def table_cell(question: str, text: str, a: int, b: int) -> tuple[int, int]:
    """An answer inside a table row's cell ("Net sales | 2023: $14,694 | 2022: $14,544", as ingest
    writes a row with its headers) moves to the cell of the same row whose header the question
    names when its own header is not named ("... net sales in fiscal 2023?" takes the 2023 cell,
    not the 2022 one); else (a, b)."""
    line_start = text.rfind("\n", 0, a) + 1
    line_end = text.find("\n", b)
    line_end = len(text) if line_end < 0 else line_end
    cells = list(_TABLE_CELL.finditer(text, line_start, line_end))
    own = next((c for c in cells if c.start(2) <= a and b <= c.end(2) and c.end(2) > c.start(2)), None)
    if own is None:
        return a, b
    asked = set(words(question))
    # what tells a header from the row's others ("2023" of "Year ended June 30, 2023")
    shared = set.intersection(*(set(words(c.group(1))) for c in cells))
    named = lambda cell: bool((set(words(cell.group(1))) - shared) & asked)  # noqa: E731
    others = [c for c in cells if c is not own and c.end(2) > c.start(2) and named(c)]
    if named(own) or len(others) != 1:
        return a, b
    return others[0].start(2), others[0].end(2)


def within_sentence(text: str, a: int, b: int) -> int:
    """The end of text[a:b] cut at the first sentence end inside it ("Abbey Bank.\n\nThe" -> "Abbey Bank")."""
    m = _SENTENCE_END.search(text, a, b)
    return m.start() if m and m.start() > a else b


def _unplaced_name(text: str, a: int, b: int, roles: dict[str, str]) -> bool:
    """A capitalised name the passages never use as a place (no locative before it here, no place
    word in it, not a place by `roles`): "IRENE NORTON" signing a letter is no answer to where."""
    phrase = text[a:b]
    return phrase[:1].isupper() and roles.get(phrase) != "place" and not _is_place_name(phrase) \
        and phrase.split()[-1].lower() not in _PLACE_HEADS and not _PLACE_BEFORE.search(text[max(0, a - 40):a])


def _is_place_name(phrase: str) -> bool:
    """A capitalised name whose last word names a kind of place ("the Abbey Bank", "Briony Lodge")."""
    last = phrase.split()[-1].lower() if phrase.split() else ""
    return phrase[:1].isupper() and " " in phrase and last in _PLACE_HEADS


def _trim_span(text: str, a: int, b: int) -> tuple[int, int]:
    while a < b and not (text[a].isalnum() or text[a] in "$£€¥"):
        a += 1
    while b > a and not (text[b - 1].isalnum() or text[b - 1] in "%"):
        b -= 1
    return a, b


def echoes(question: str, span: str) -> bool:
    """Does the span only repeat the question (every content word of it is asked)? An answer adds
    something."""
    said = content_words(span) or set(words(span))
    return not said or said <= set(words(question))


def contained(prediction: str | None, reference: str) -> bool:
    """Every content word of the reference appears in the prediction."""
    wanted = content_words(reference) or set(words(reference))
    return bool(prediction) and bool(wanted) and wanted <= set(words(prediction))
