"""Python clients of the Memoria HTTP API: ``MemoriaClient`` (async) and ``SyncMemoriaClient``.

Both have the same methods, one per ``/v1`` route, typed with the API's own pydantic models::

    async with MemoriaClient("http://127.0.0.1:8080", api_key="mk_…") as memoria:
        context = await memoria.context(conversation, message="明天提醒我开会")
        ...
        await memoria.end(conversation, memo="约好了明天的提醒")

Request methods take the request model, a mapping of its fields, or keyword fields (merged
over the first two), so one conversation dict serves ``context``, ``end`` and ``tool_call``.
An error answer raises ``MemoriaAPIError``; 429 and 503 are retried with exponential backoff
and jitter, honouring ``Retry-After``.

The package: ``routes`` builds each request, ``core`` holds what happens around requests
(retries, job waits, large exports) once and without I/O, and the two clients only send.
"""

from __future__ import annotations

from service.client.async_client import MemoriaClient
from service.client.core import EXPORT_WAIT_SECONDS, RETRY_STATUSES, USER_AGENT
from service.client.errors import MemoriaAPIError, retry_after_seconds
from service.client.requests import BinaryWriter, Call
from service.client.routes import MODEL_ERRORS
from service.client.sync_client import SyncMemoriaClient

__all__ = [
    "EXPORT_WAIT_SECONDS",
    "MODEL_ERRORS",
    "RETRY_STATUSES",
    "USER_AGENT",
    "BinaryWriter",
    "Call",
    "MemoriaAPIError",
    "MemoriaClient",
    "SyncMemoriaClient",
    "retry_after_seconds",
]
