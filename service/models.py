"""Every table of the service, imported in one place for Alembic and the schema checks."""

from __future__ import annotations

from service.audit.models import AuditEntry
from service.db.base import Base
from service.db.meta import MemoriaMeta
from service.ends.models import Memo
from service.events.models import Event
from service.exports.models import Export, ExportChunk
from service.memories.models import Memory, MemoryHistory
from service.messages.models import Conversation, Message
from service.privacy.models import Erasure
from service.profiles.models import ProfileRevision, ProfileRow
from service.queue.models import Job
from service.reembed.models import ReembedProgress, ReembedRun
from service.tenants.models import ApiKey, Tenant
from service.todos.models import Todo

metadata = Base.metadata

__all__ = [
    "ApiKey",
    "AuditEntry",
    "Conversation",
    "Erasure",
    "Event",
    "Export",
    "ExportChunk",
    "Job",
    "Memo",
    "MemoriaMeta",
    "Memory",
    "MemoryHistory",
    "Message",
    "ProfileRevision",
    "ProfileRow",
    "ReembedProgress",
    "ReembedRun",
    "Tenant",
    "Todo",
    "metadata",
]
