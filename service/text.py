"""Small text helpers that both the write path (historian) and the read path (recall) use."""

from __future__ import annotations


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
