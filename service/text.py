"""Small text helpers that both the write path (historian) and the read path (recall) use."""

from __future__ import annotations

# The longest statement kept as one: an observation or memo a bot hands over, and whatever a
# model writes in its place or about the work (a rewrite, a note on a refused tool call). A
# model's text past it is not taken: what is stored and later rendered in every context stays
# the size a bot could have sent.
STATEMENT_MAX_CHARS = 4000


def message_content(text: str) -> str:
    """The ``<content>`` of a bot message frame, or the text itself."""
    # Found by position, not by a lazy regex: from every '<content>' without a closing tag,
    # '(.*?)</content>' scanned to the end of the text, quadratic in a hostile message.
    start = text.find("<content>")
    end = text.find("</content>", start + len("<content>")) if start >= 0 else -1
    if end < 0:
        return text.strip()
    return text[start + len("<content>") : end].strip()


def clip(text: str, limit: int) -> str:
    """At most ``limit`` characters, marked when cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def bounded(text: str) -> str:
    """At most a statement's length, its middle cut and marked: what is kept or shown again
    of a model's words (a note on its tool call, the reply it reads next), where a quoted
    value may run on for megabytes while the reason after it is what matters."""
    if len(text) <= STATEMENT_MAX_CHARS:
        return text
    head = (STATEMENT_MAX_CHARS - 1) // 2
    return text[:head] + "…" + text[len(text) - (STATEMENT_MAX_CHARS - 1 - head) :]
