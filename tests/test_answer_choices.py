"""The answer step's rules that hold for either reader, on a scripted reading (no model): an
either/or question is answered by one of its options, the likelier where the passages name it."""

import math

from evsel.answer import step
from evsel.models.reader.span_head import Reader
from evsel.pipeline import Scored
from evsel.store.store import ChunkRecord


def _chunk(text: str, speakers=()) -> ChunkRecord:
    return ChunkRecord(id=1, doc_id=1, seq=1, text=text, content_hash="1", n_tokens=len(text.split()),
                       char_start=0, char_end=len(text), speakers=list(speakers), title="t")


class _ScriptedReading:
    """Each span's log-probability from a table of its text; anything else is no whole-token span."""

    def __init__(self, texts: list[str], logps: dict[str, float]):
        self.texts, self.logps = texts, logps

    def logp_of(self, passage: int, start: int, end: int):
        return self.logps.get(self.texts[passage][start:end])


class _ScriptedSpanHead(Reader):
    def __init__(self, logps: dict[str, float]):  # no weights: the reading is scripted
        self.logps = logps

    def reading(self, backbone, question, texts):
        return _ScriptedReading(texts, self.logps)


def test_an_either_or_question_is_answered_by_the_likelier_option_the_passages_name():
    text = "John: I love the beach near my house, but we go mountain climbing every summer.\n"
    evidence = [Scored(_chunk(text, ["John", "Maria"]), 1.0, 1)]
    question = "Does John live close to a beach or the mountains?"
    reader = _ScriptedSpanHead({"beach": math.log(0.4), "mountain climbing": math.log(0.5)})
    out = step._reader_answer(None, reader, question, evidence, "yesno", True)
    # "mountain climbing" has no whole-word span of its own: the beach is the only option read
    assert out.text == "beach" and out.kind == "span"
    assert text[out.start:out.end] == "beach"
    # the singular names the plural option ("the mountains"), and the likelier option wins
    reader = _ScriptedSpanHead({"beach": math.log(0.1), "mountain": math.log(0.6)})
    assert step._reader_answer(None, reader, question, evidence, "yesno", True).text == "mountain"


def test_the_options_of_a_choice_question_are_as_long_as_each_other():
    from evsel.answer import grounding

    assert grounding.options("Does John live close to a beach or the mountains?") == ["a beach", "the mountains"]
    assert grounding.options("Would Melanie prefer a national park or a theme park?") == \
        ["a national park", "a theme park"]
    assert grounding.options("Which band was formed first, Killing Joke or Acceptance?") == ["Killing Joke", "Acceptance"]


def test_a_name_the_passages_use_as_a_place_is_no_person_and_the_reverse():
    from evsel.answer import grounding

    texts = ["Josie Pye dared Anne to walk the ridgepole. They drove to Marysville for the concert.",
             "In Marysville the band played. \"Never,\" said Josie Pye.", "The failure of the Abbey Bank was in the paper."]
    roles = grounding.name_roles(texts)
    assert roles["Marysville"] == "place" and roles["Josie Pye"] == "person"
    people = [t[a:b] for t in texts for a, b in grounding.typed_spans(t, "person", roles)]
    assert "Josie Pye" in people and "Marysville" not in people and "Abbey Bank" not in people
    places = [t[a:b] for t in texts for a, b in grounding.typed_spans(t, "place", roles)]
    assert "Marysville" in places and "Josie Pye" not in places
    # without the passages' use, a capitalised name may be either
    assert "Marysville" in [texts[0][a:b] for a, b in grounding.typed_spans(texts[0], "person")]


def test_a_how_much_question_about_money_wants_an_amount_with_its_currency():
    from evsel.answer import grounding

    text = "The company sold 73.5 million shares for $2.1 billion in cash; the peddler took fifty cents."
    assert grounding.tag_kind("How much cash did the company receive for the shares?", "number") == "money"
    assert grounding.tag_kind("How much did Anne pay the peddler for the dye?", "number") == "money"
    assert grounding.tag_kind("How many children did Mrs. Hammond have?", "number") == "number"
    assert [text[a:b] for a, b in grounding.typed_spans(text, "money")] == ["$2.1 billion", "fifty cents"]
    assert "73.5 million shares" in [text[a:b] for a, b in grounding.typed_spans(text, "number")]


def test_the_shipped_readers_record_names_a_reader_per_kind():
    from evsel.models.reader.shipped import READERS_FORMAT, shipped_reader_dir, shipped_readers
    from evsel.models.shared.trained_files import SHIPPED

    fingerprints = [p.name for p in SHIPPED.iterdir() if (p / "readers.json").is_file()]
    assert fingerprints, "no backbone ships a readers record"
    for fingerprint in fingerprints:
        record = shipped_readers(fingerprint)
        assert record["format"] == READERS_FORMAT
        prose, dialogue = shipped_reader_dir(fingerprint), shipped_reader_dir(fingerprint, dialogue=True)
        assert prose.name == record["prose"]["reader"] and dialogue.name == record["dialogue"]["reader"]
        assert (prose / "reader.json").is_file() and (dialogue / "reader.json").is_file()


def test_a_place_is_a_name_the_passages_use_as_one_within_the_margin_of_the_best_span():
    from evsel.models.reader.span_head import Found

    texts = ["Some five years ago, during a lengthy visit to Warsaw, I made the acquaintance of the adventuress. "
             "The letter bore the name Prague."]
    text = texts[0]

    def found(phrase: str, probability: float) -> Found:
        start = text.index(phrase)
        return Found(0, start, start + len(phrase), phrase, probability)

    question = "Where did the King meet the adventuress?"
    spans = [found("Some five years ago, during a lengthy visit to Warsaw, I made", 0.06), found("name Prague", 0.04),
             found("a lengthy visit to Warsaw", 0.03), found("Prague", 0.028), found("Warsaw", 0.01)]
    # "Prague" is likelier, but nothing in the passages makes a place of it; "visit to Warsaw" does
    best = step._typed_span(question, "place", spans, texts)
    assert best.text == "Warsaw" and text[best.start:best.end] == "Warsaw"
    # with no span of the type near the best, the place inside one of the best spans
    clause = found("during a lengthy visit to Warsaw, I made the acquaintance", 0.2)
    best = step._typed_span(question, "place", [found("Some five", 0.9), clause, found("Warsaw", 0.001)], texts)
    assert best.text == "Warsaw" and best.start == text.index("Warsaw")
    # and the likeliest span when none holds one
    assert step._typed_span(question, "place", [found("Some five", 0.9)], texts).text == "Some five"


def test_a_person_is_named_rather_than_described_and_a_nationality_is_no_person():
    from evsel.models.reader.span_head import Found

    texts = ["\u201cTo an English lawyer named Norton.\u201d"]
    text = texts[0]

    def found(phrase: str, probability: float) -> Found:
        start = text.index(phrase)
        return Found(0, start, start + len(phrase), phrase, probability)

    spans = [found("an English lawyer", 0.5), found("an English lawyer named Norton", 0.1), found("Norton", 0.06)]
    assert step._typed_span("Whom did Irene Adler marry?", "person", spans, texts).text == "Norton"


def test_a_phrase_of_the_type_ends_with_its_sentence_and_a_name_part_is_a_name():
    from evsel.answer import grounding
    from evsel.models.reader.span_head import Found

    text = "Matthew read of the failure of the Abbey Bank.\n\nThe news was bad. Miss Muriel Stacy taught well."
    assert text[:grounding.within_sentence(text, 0, len(text))] == "Matthew read of the failure of the Abbey Bank"
    assert grounding.within_sentence("Doctor T. J. Eckleburg. Then", 0, 28) == len("Doctor T. J. Eckleburg")
    start = text.index("Muriel")
    first_name = Found(0, start, start + len("Muriel"), "Muriel", 0.3)
    start = text.index("bad")
    other = Found(0, start, start + 3, "bad", 0.5)
    assert step._typed_span("What is the first name of Miss Stacy?", "person", [other, first_name], [text]).text == "Muriel"


def test_a_title_and_an_initial_keep_their_full_stop_and_another_word_ends_its_sentence():
    from evsel.answer import grounding

    text = ("Boscombe Valley is not far from Ross, in Herefordshire. The largest landed proprietor in that "
            "part is a Mr. John Turner. Doctor T. J. Eckleburg watched.")
    roles = grounding.name_roles([text])
    people = [text[a:b] for a, b in grounding.typed_spans(text, "person", roles)]
    # "Herefordshire. The" was one name, and the title's stop cut "Mr. John Turner" to nothing
    assert "John Turner" in people and "Doctor T. J. Eckleburg" in people and "Turner. Doctor" not in people
    assert not any("Herefordshire" in p for p in people) and roles["Herefordshire"] == "place"
    from evsel.models.reader.span_head import Found

    start = text.index("Herefordshire")
    county = Found(0, start, start + len("Herefordshire"), "Herefordshire", 0.02)
    start = text.index("John Turner")
    turner = Found(0, start, start + len("John Turner"), "John Turner", 0.2)
    question = "Who was the largest landed proprietor in Boscombe Valley?"
    assert step._typed_span(question, "person", [turner, county], [text]).text == "John Turner"


def test_the_longer_question_phrase_decides_its_type():
    from evsel.answer import grounding

    assert grounding.answer_type("Which hotel attendant actually stole the blue carbuncle?") == "person"
    assert grounding.answer_type("Which hotel did the Count stay at?") == "place"
    assert grounding.answer_type("In which town was the asylum?") == "place"


def test_an_answer_is_read_to_the_end_of_the_name_it_cuts_and_a_count_takes_its_noun():
    from evsel.answer import grounding

    def completed(question: str, asked: str, text: str, phrase: str) -> str:
        a = text.index(phrase)
        return text[a:grounding.complete_phrase(question, asked, text, a, a + len(phrase))]

    delight = "They should call it\u2014let me see\u2014the White Way of Delight. It was."
    assert completed("What name did Anne give the Avenue?", "thing", delight, "the White Way") \
        == "the White Way of Delight"
    assert completed("Whose stone was it?", "person", "The Countess of Morcar's blue carbuncle", "Countess") \
        == "Countess of Morcar"
    # a name read to its end and no further: no possessive, no next sentence, nothing after "and"
    assert completed("Who came?", "person", "Tom Buchanan\u2019s mistress came", "Tom Buchanan") == "Tom Buchanan"
    assert completed("Who came?", "person", "Holmes and Watson came", "Holmes") == "Holmes"
    hammond = "Mrs. Hammond had eight children. She had twins three times."
    assert completed("How many children did Mrs. Hammond have?", "number", hammond, "eight") == "eight children"
    assert completed("How many times did she have twins?", "number", hammond, "three") == "three times"
    assert completed("How many sons did she have?", "number", hammond, "eight") == "eight"


def test_a_how_much_answer_takes_its_currency_and_unit():
    from evsel.answer import grounding

    def completed(question: str, text: str, phrase: str) -> str:
        a = text.index(phrase)
        start, end = grounding.complete_amount(question, text, a, a + len(phrase))
        return text[start:end]

    sales = "Net sales were $14,544 million in fiscal 2023, down from $14,694 million."
    assert completed("What were Amcor's net sales in fiscal 2023?", sales, "14,544") == "$14,544 million"
    assert completed("How much did Anne pay the peddler?", "She paid fifty cents for the dye.", "fifty") \
        == "fifty cents"
    assert completed("How much did it cost?", "It cost 12 percent more than before.", "12") == "12 percent"
    # a count is not an amount, and a whole amount stays as it is
    assert completed("How many children did he have?", "He had 4 children.", "4") == "4"
    assert completed("How much was the reward?", "A reward of 1000 pounds was offered.", "1000 pounds") == "1000 pounds"


def test_a_time_or_a_manner_after_a_locative_is_no_place():
    from evsel.answer import grounding

    text = "I had called upon my friend one day in the autumn of last year, and went to the kitchen. In fact he was at home."
    places = [text[a:b] for a, b in grounding.typed_spans(text, "place", grounding.name_roles([text]))]
    assert places == ["kitchen", "home"]


def test_a_time_with_a_typographic_apostrophe_is_a_time():
    from evsel.answer import grounding

    text = "It was three o\u2019clock when Matthew came with a doctor. At 4 o'clock he left."
    assert [text[a:b] for a, b in grounding.typed_spans(text, "date")] == ["three o\u2019clock", "4 o'clock"]
    said = "I\u2019m sure Mrs. Barry came. Don\u2019t go, Anne."
    assert [said[a:b] for a, b in grounding.typed_spans(said, "person")] == ["Barry", "Anne"]


class _ScriptedLoraReading:
    """The LoRA reader's reading from a table of span texts' probabilities and a no-answer's."""

    def __init__(self, texts: list[str], probabilities: dict[str, float], null: float):
        from evsel.models.reader.span_head import Found

        self.null_logp = math.log(null)
        self.found = sorted((Found(p, t.index(s), t.index(s) + len(s), s, q) for s, q in probabilities.items()
                             for p, t in enumerate(texts) if s in t), key=lambda f: -f.probability)

    def top(self, k: int) -> list:
        return self.found[:k]

    def logp_of(self, passage: int, start: int, end: int):
        return None


class _ScriptedLoraReader:
    def __init__(self, probabilities: dict[str, float], null: float, prose_margin: float, chat_margin: float):
        self.probabilities, self.null = probabilities, null
        self.margins = {False: prose_margin, True: chat_margin}

    def margin_for(self, dialogue: bool) -> float:
        return self.margins[dialogue]

    def reading(self, backbone, question, texts):
        return _ScriptedLoraReading(texts, self.probabilities, self.null)


def test_prose_answers_abstain_by_the_prose_margin_and_chats_by_theirs():
    text = "The keeper locked the tower at dusk and walked down to the harbour with his lamp."
    question = "Where did the keeper walk with his lamp?"
    prose = [Scored(_chunk(text), 1.0, 1)]
    # the no-answer beats the best span by log(0.6 / 0.2) = 1.1 nats
    unsure = _ScriptedLoraReader({"the harbour": 0.2}, null=0.6, prose_margin=0.987, chat_margin=math.inf)
    out = step._reader_answer(None, unsure, question, prose, "place", False)
    assert out.text is None and out.kind == "abstained" and "no answer it trusts" in out.reason
    assert text[out.start:out.end] == "the harbour"  # the evidence it would have answered from is still shown
    sure = _ScriptedLoraReader({"the harbour": 0.5}, null=0.3, prose_margin=0.987, chat_margin=math.inf)
    assert step._reader_answer(None, sure, question, prose, "place", False).text == "the harbour"
    # a chat is judged by the chat margin, not the prose one
    chat = [Scored(_chunk("Keeper: I walked down to the harbour with my lamp.\n", ["Keeper"]), 1.0, 1)]
    assert step._reader_answer(None, unsure, question, chat, "place", True).text == "the harbour"


def test_an_answer_in_a_table_row_takes_the_cell_whose_header_the_question_names():
    from evsel.answer import grounding

    table = ("($ in millions) | 2023 | 2022\nNet sales | 2023: $14,694 | 2022: $14,544\n"
             "Operating income | Year ended June 30, 2023: 1,508 | Year ended June 30, 2022: 1,239\n")

    def cell(question: str, phrase: str) -> str:
        a = table.index(phrase)
        start, end = grounding.table_cell(question, table, a, a + len(phrase))
        return table[start:end]

    assert cell("How much were Amcor's net sales in fiscal 2023?", "$14,544") == "$14,694"
    assert cell("What was the operating income in 2023?", "1,239") == "1,508"
    # the named column, no named column, or a cell outside any row stays as it is
    assert cell("How much were net sales in fiscal 2022?", "$14,544") == "$14,544"
    assert cell("How much were net sales?", "$14,544") == "$14,544"
    prose = "Sales rose to $14,694 in 2023 from $14,544 in 2022."
    assert grounding.table_cell("What were sales in 2023?", prose, 31, 38) == (31, 38)
