"""``GET /console``: the operator's page, served with a Content-Security-Policy that admits
only its own inline script and style and calls to this origin."""

from __future__ import annotations

import base64
import hashlib
import re
from functools import lru_cache
from pathlib import Path

from litestar import Response, get
from litestar.enums import MediaType

_PAGE = Path(__file__).with_name("console.html")


def _source_hashes(html: str, tag: str) -> str:
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)
    return " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() + "'"
        for b in blocks
    )


@lru_cache(maxsize=1)
def page() -> tuple[str, dict[str, str]]:
    """The page and its headers, read once."""
    html = _PAGE.read_text(encoding="utf-8")
    # Hashes rather than 'unsafe-inline': a stored text that somehow reached the DOM as markup
    # could still run no script, load nothing and send nothing anywhere but this origin.
    policy = "; ".join(
        [
            "default-src 'none'",
            f"script-src {_source_hashes(html, 'script')}",
            f"style-src {_source_hashes(html, 'style')}",
            "connect-src 'self'",
            "img-src 'none'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    headers = {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }
    return html, headers


@get("/console", media_type=MediaType.HTML, include_in_schema=False)
async def console() -> Response[str]:
    """The console page; it asks for a key itself and keeps it only in sessionStorage."""
    html, headers = page()
    return Response(html, media_type=MediaType.HTML, headers=headers)
