"""The prompt that turns selected evidence into an answer."""

from __future__ import annotations

SYSTEM = (
    "You answer questions about documents. Use only the numbered passages below. "
    "Answer in one or two short sentences. If the passages do not contain the answer, say so."
)


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


def build_messages(question: str, scored_in_document_order) -> list[dict]:
    passages = "\n\n".join(
        f"[{i}] ({describe(s.chunk)})\n{s.chunk.text.strip()}" for i, s in enumerate(scored_in_document_order, 1)
    )
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Passages:\n\n{passages}\n\nQuestion: {question}\nAnswer:"},
    ]
