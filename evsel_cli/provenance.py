"""Where a passage comes from, as one short label: the answer prompt's passages and `ask`'s
evidence share it. Light to import: `ask` prints it in a process that talks to the daemon."""

from __future__ import annotations

from types import SimpleNamespace


def describe(chunk) -> str:
    """A passage's provenance as a short label: title, then page or session/time."""
    parts = [chunk.title or "untitled"]
    if chunk.page_start is not None:
        pages = chunk.page_start if chunk.page_start == chunk.page_end else f"{chunk.page_start}-{chunk.page_end}"
        parts.append(f"page {pages}")
    if chunk.session:
        parts.append(f"session {chunk.session}")
    if chunk.time_start:
        parts.append(chunk.time_start)
    return ", ".join(parts)


def evidence_label(item: dict) -> str:
    """Where an evidence passage of `ask`'s result comes from: title, page or session/time,
    speakers, turns."""
    where = describe(SimpleNamespace(**{k: item[k] for k in ("title", "page_start", "page_end", "session",
                                                              "time_start")}))
    if item["speakers"]:
        where += f"; speakers: {', '.join(item['speakers'])}"
    if item["turn_ids"]:
        turns = item["turn_ids"]
        where += f"; turns {turns[0]}" + (f"-{turns[-1]}" if len(turns) > 1 else "")
    return where
