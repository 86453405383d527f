"""Dialogues: LoCoMo JSON, plain transcripts and JSONL chat logs. Every turn keeps speaker, session,
turn id and time; each turn is one atomic segment and each session starts a new chunk."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ...errors import InputError
from .base import ParsedDocument, TextBuilder


def _turn_line(speaker: str, text: str) -> str:
    text = " ".join(str(text).split())
    return f"{speaker}: {text}\n"


def _session_header(session: str, time: str | None) -> str:
    return f"\n=== Session {session}" + (f" ({time})" if time else "") + " ===\n"


class DialogueBuilder:
    def __init__(self) -> None:
        self.builder = TextBuilder()
        self.turns = 0
        self.speakers: list[str] = []

    def session(self, session: str, time: str | None) -> None:
        header = _session_header(session, time)
        if not self.builder.segments:
            header = header.lstrip("\n")
        self.builder.add(header, session=session, time=time, break_before=bool(self.builder.segments))

    def turn(self, speaker: str, text: str, session: str | None, turn_id: str, time: str | None) -> None:
        self.builder.add(
            _turn_line(speaker, text), speaker=speaker, session=session, turn_id=turn_id, time=time, atomic=True
        )
        self.turns += 1
        if speaker not in self.speakers:
            self.speakers.append(speaker)

    def document(self, title: str, part: str = "", metadata: dict | None = None) -> ParsedDocument:
        metadata = dict(metadata or {})
        metadata.update({"turns": self.turns, "speakers": self.speakers})
        return ParsedDocument(
            text=self.builder.text(), kind="dialogue", title=title, segments=self.builder.segments,
            part=part, metadata=metadata,
        )


def json_error(exc: json.JSONDecodeError, line: int | None = None) -> str:
    """json's message as a phrase: "unterminated string starting at line 204 column 9", not
    json's "Unterminated string starting at" followed by our own "at line ..."."""
    msg = exc.msg[:1].lower() + exc.msg[1:]
    if msg.endswith(" at"):
        msg = msg[:-3]
    return f"{msg} at line {line or exc.lineno} column {exc.colno}"


def _malformed(path: Path, what: str) -> InputError:
    return InputError(
        f"malformed dialogue JSON: {what}",
        "expected LoCoMo JSON (conversation with session_N lists) or JSONL lines "
        '{"speaker"|"role": ..., "text"|"content": ...}',
        path=str(path),
    )


_SESSION_KEY = re.compile(r"^session_(\d+)$")


def parse_locomo_sample(path: Path, sample: dict, index: int) -> ParsedDocument:
    conv = sample.get("conversation")
    if not isinstance(conv, dict):
        raise _malformed(path, f"item {index} has no 'conversation' object")
    sessions = sorted(
        (int(m.group(1)), key) for key in conv if (m := _SESSION_KEY.match(key)) and isinstance(conv[key], list)
    )
    if not sessions:
        raise _malformed(path, f"item {index} has no session_N turn lists")
    builder = DialogueBuilder()
    for number, key in sessions:
        time = conv.get(f"{key}_date_time")
        builder.session(str(number), time)
        for turn_index, turn in enumerate(conv[key]):
            if not isinstance(turn, dict) or "speaker" not in turn or "text" not in turn:
                raise _malformed(path, f"item {index}, {key}, turn {turn_index} lacks speaker or text")
            text = str(turn["text"])
            if turn.get("blip_caption"):
                text += f" [shares an image: {turn['blip_caption']}]"
            turn_id = str(turn.get("dia_id") or f"D{number}:{turn_index + 1}")
            builder.turn(str(turn["speaker"]), text, str(number), turn_id, time)
    if not builder.turns:
        raise _malformed(path, f"item {index} has sessions but no turns")
    sample_id = str(sample.get("sample_id") or f"conversation-{index + 1}")
    speakers = [conv.get("speaker_a"), conv.get("speaker_b")]
    title = f"{sample_id}: " + " & ".join(s for s in speakers if s) if any(speakers) else sample_id
    return builder.document(title, part=sample_id, metadata={"format": "locomo", "sessions": len(sessions)})


def parse_json_dialogue(path: Path, text: str) -> list[ParsedDocument]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and text.lstrip().startswith("{"):  # JSONL saved as .json
            return parse_jsonl_dialogue(path, text)
        raise _malformed(path, json_error(exc)) from exc
    except RecursionError:
        raise _malformed(path, "nested too deeply (arrays or objects inside each other thousands of times)") from None
    if isinstance(data, dict) and "conversation" in data:
        return [parse_locomo_sample(path, data, 0)]
    if isinstance(data, list) and data and all(isinstance(x, dict) and "conversation" in x for x in data):
        return [parse_locomo_sample(path, sample, i) for i, sample in enumerate(data)]
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        data = data["messages"]
    if isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        return [_messages_document(path, data)]
    raise _malformed(path, "neither LoCoMo conversations nor a list of chat messages")


def _message_fields(path: Path, message: dict, where: str) -> tuple[str, str, str | None, str | None]:
    speaker = message.get("speaker", message.get("role", message.get("name")))
    content = message.get("text", message.get("content"))
    if speaker is None or content is None:
        raise _malformed(path, f"{where} needs 'speaker' or 'role' and 'text' or 'content'")
    if isinstance(content, list):  # content parts, as chat APIs write them
        content = " ".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    time = message.get("time", message.get("timestamp"))
    session = message.get("session")
    return str(speaker), str(content), None if time is None else str(time), None if session is None else str(session)


def _messages_document(path: Path, messages: list[dict], where_prefix: str = "message") -> ParsedDocument:
    builder = DialogueBuilder()
    current_session: str | None = None
    for index, message in enumerate(messages):
        speaker, content, time, session = _message_fields(path, message, f"{where_prefix} {index + 1}")
        if session is not None and session != current_session:
            builder.session(session, time)
            current_session = session
        turn_id = str(message.get("id", message.get("turn_id", index + 1)))
        builder.turn(speaker, content, current_session, turn_id, time)
    if not builder.turns:
        raise _malformed(path, "no messages")
    return builder.document(path.stem.replace("_", " "), metadata={"format": "messages"})


def parse_jsonl_dialogue(path: Path, text: str) -> list[ParsedDocument]:
    messages = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _malformed(path, json_error(exc, line_no)) from exc
        except RecursionError:
            raise _malformed(path, f"line {line_no} is nested too deeply") from None
        if not isinstance(item, dict):
            raise _malformed(path, f"line {line_no} is not a JSON object")
        messages.append(item)
    if not messages:
        raise _malformed(path, "no messages")
    return [_messages_document(path, messages, where_prefix="line")]


# Transcript lines: "[time] Speaker: text", "10:02 Speaker: text", "Speaker (time): text", "Speaker: text".
_TURN = re.compile(
    r"^(?:\[(?P<time1>[^\]]{1,40})\]\s*|(?P<time3>\d{1,2}:\d{2}(?::\d{2})?(?:\s?[APap]\.?[Mm]\.?)?)\s+)?"
    r"(?P<speaker>[A-Z][\w.'\- ]{0,40}?)(?:\s*\((?P<time2>[^)]{1,40})\))?:\s+(?P<text>\S.*)$"
)
# Session headers: "Session 2", "Session 2: 9 May", "## Session 2 - 2023-05-08", "=== Session IV (...) ===".
# The name must be a number (or Roman numeral) so that "Session notes: ..." stays a turn.
_SESSION = re.compile(
    r"^(?:#+\s*|[-=*]{2,}\s*)?session\s+(?P<name>\d[\w.\-]*?|[ivxlc]+)\s*(?:[-:,(|\u2013\u2014]\s*(?P<time>\w.*?))?"
    r"\s*\)?\s*(?:[-=*#]{2,})?\s*$",
    re.I,
)


def looks_like_transcript(text: str) -> bool:
    lines = [line for line in text.splitlines() if line.strip()][:400]
    if len(lines) < 2:
        return False
    turns = sum(1 for line in lines if _TURN.match(line.strip()))
    sessions = sum(1 for line in lines if _SESSION.match(line.strip()))
    return turns >= 2 and (turns + sessions) >= 0.6 * len(lines)


def parse_transcript(path: Path, text: str) -> ParsedDocument:
    """`Speaker: text` lines, optional session headers, optional timestamps; other lines continue a turn."""
    builder = DialogueBuilder()
    session: str | None = None
    session_time: str | None = None
    pending: dict | None = None
    turn_number = 0

    def flush() -> None:
        nonlocal pending
        if pending:
            turn_id = f"S{pending['session']}:{pending['n']}" if pending["session"] else str(pending["n"])
            builder.turn(pending["speaker"], pending["text"], pending["session"], turn_id, pending["time"])
            pending = None

    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if m := _SESSION.match(line):
            flush()
            session = m.group("name")
            session_time = (m.group("time") or "").strip() or None
            turn_number = 0
            builder.session(session, session_time)
            continue
        if m := _TURN.match(line):
            flush()
            turn_number += 1
            pending = {
                "speaker": m.group("speaker").strip(),
                "text": m.group("text"),
                "time": m.group("time1") or m.group("time2") or m.group("time3") or session_time,
                "session": session,
                "n": turn_number,
            }
        elif pending:
            pending["text"] += " " + line
        else:
            raise InputError(
                f"transcript line before any 'Speaker: text' turn: {line[:60]!r}",
                "start each turn with 'Name: ', or use --kind book",
                path=str(path),
            )
    flush()
    if not builder.turns:
        raise InputError("no 'Speaker: text' turns found", "use --kind book for prose", path=str(path))
    return builder.document(path.stem.replace("_", " "), metadata={"format": "transcript"})
