"""The payload of each job kind: one pydantic model, built by the producer, read by the handler.

A payload is stored as JSON in the queue; a model here is the contract between the package
that enqueues a kind of job and the one whose handler runs it, so neither reads a loose dict.
Unknown keys are ignored, so a job enqueued by an older or newer release still runs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from service.queue.worker import PermanentJobError


class JobPayload(BaseModel):
    """A job's payload."""

    model_config = ConfigDict(extra="ignore")

    @classmethod
    def of(cls, stored: dict[str, Any]) -> Self:
        """The stored payload, checked; a malformed one fails the job for good (a retry could
        not mend it)."""
        try:
            return cls.model_validate(stored)
        except ValidationError as exc:
            raise PermanentJobError(f"malformed {cls.__name__}: {exc}") from exc


class EndPayload(JobPayload):
    """``historian.end``: what the bot handed over at the end of a turn."""

    context: dict[str, Any]
    request_id: str
    end_seq: int
    moment: str
    timezone: str
    memo: str | None = None
    observations: list[str] = []
    # The observations (by number) the person lets be known beyond the chat they were said
    # in; none in a job enqueued before consent was recorded, so such a job widens nothing.
    shareable: list[int] = []
    force: bool = False
    source_message: Any = None
    recent_messages: list[Any] | None = None
    event_ids: list[str]
    pii_policy: str = "store"


class EraseUserPayload(JobPayload):
    """``privacy.erase_user``: a person's erasure too large to run in the request."""

    user_id: str
    requested_by: str | None = None


class EraseGroupPayload(JobPayload):
    """``privacy.erase_group``: a group's erasure too large to run in the request."""

    group_id: str
    requested_by: str | None = None


class EraseTenantPayload(JobPayload):
    """``privacy.erase_tenant``: a tenant's erasure too large to run in the request."""

    requested_by: str | None = None


class ErasedPayload(JobPayload):
    """What an erasure job keeps once done: the erased id's keyed hash, never the id."""

    subject_hash: str


class NoPayload(JobPayload):
    """A kind whose job needs nothing but its tenant (``messages.embed``, ``memories.maintain``):
    the job finds its work in the tenant's rows."""


class ExtractPayload(JobPayload):
    """``messages.extract``: a conversation's unread messages, up to a sequence number."""

    conversation_key: str
    upto_seq: int
    reason: str


class ConsolidatePayload(JobPayload):
    """``memories.consolidate``: the memories of a conversation that went quiet."""

    conversation_key: str


class DeliverPayload(JobPayload):
    """``todos.deliver``: one due todo, to the tenant's webhook."""

    todo_id: int
    # The todo's updated_at when it was found due: a job of an older version delivers nothing
    # (None: a job enqueued before versions were kept, which delivers the todo as it is).
    version: datetime | None = None


class ExportPayload(JobPayload):
    """``privacy.export``: a large export, written into chunks."""

    export_id: int
    kind: str
    subject: str


class ReembedBatchPayload(JobPayload):
    """``embeddings.reembed``: the next rows of one table of a re-embedding run."""

    run_id: int
    table: str


class ReembedSwitchPayload(JobPayload):
    """``embeddings.switch``: a run's switch to the new vectors, once every pass ended."""

    run_id: int
